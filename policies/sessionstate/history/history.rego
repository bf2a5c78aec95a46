# METADATA
# title: Session state versions
# description: >-
#   Decides `history`: reading a session's versions (their list, and one
#   version's record). Whoever may read the session's record may read its
#   versions: every gate of the read decision, asked for this input as a read.
# schemas:
#   - input: schema.policy_input
package sessionstate.history

import data.sessionstate.read

# METADATA
# title: History decision
# description: >-
#   `allow`, and `reasons`: the sorted, unique codes of every failing gate.
#   Always defined, so the service never has to guess.
# entrypoint: true
decision := {"allow": allow, "reasons": sort(reasons)}

default allow := false

# Only what the decision asked allows: one undefined or malformed allows nothing.
allow if {
	count(reasons) == 0
	_as_read.allow == true
}

reasons contains "action_not_supported" if input.action != "history"

# The read's gates (role, tenant, session), for the session whose versions are read.
# object.get: a read decision of another shape (which admission refuses) still type-checks.
reasons contains reason if {
	some reason in object.get(_as_read, "reasons", [])
}

# One decision asked of another: read's gates stay the one source.
_as_read := asked if {
	# regal ignore:with-outside-test-context
	asked := read.decision with input.action as "read"
}
