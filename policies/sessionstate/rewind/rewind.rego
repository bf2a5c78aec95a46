# METADATA
# title: Session state rewinds
# description: >-
#   Decides `rewind`: writing a kept version's record as the session's next
#   version. A rewind is a write: whoever may write that record to the session
#   may rewind to it, with every gate of the write decision (access, durable
#   writes, the operator approval, tenant settings, the record's own gates),
#   asked for this input as a write.
# schemas:
#   - input: schema.policy_input
package sessionstate.rewind

import data.sessionstate.write

# METADATA
# title: Rewind decision
# description: >-
#   `allow`, and `reasons`: the sorted, unique codes of every failing gate.
#   Always defined, so the service never has to guess.
# entrypoint: true
decision := {"allow": allow, "reasons": sort(reasons)}

default allow := false

# Only what the decision asked allows: one undefined or malformed allows nothing.
allow if {
	count(reasons) == 0
	_as_write.allow == true
}

reasons contains "action_not_supported" if input.action != "rewind"

# The service names the version restored; an input without one is refused.
reasons contains "session_state_rewind_version_missing" if object.get(input, "rewind", null) == null

# The write's gates, for the restored record written to the session.
# object.get: a write decision of another shape (which admission refuses) still type-checks.
reasons contains reason if {
	some reason in object.get(_as_write, "reasons", [])
}

# One decision asked of another: write's gates stay the one source.
_as_write := asked if {
	# regal ignore:with-outside-test-context
	asked := write.decision with input.action as "write"
}
