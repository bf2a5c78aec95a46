# METADATA
# title: No read of another session by a session-scoped token
# description: >-
#   A deployment invariant (service/policy/invariants.py), never served: an
#   actor scoped to a session reads that session only (its record or its versions).
# schemas:
#   - input: schema.policy_input
package sessionstate.invariants.no_cross_session_read

# METADATA
# title: Violation
# description: True for a read of another session (or its versions) its decision allows to a session's token.
violation if {
	input.action in {"read", "history"}
	object.get(input.actor, "session_id", null) != null
	_other_session
	data.sessionstate[input.action].decision.allow == true
}

_other_session if object.get(input.actor, "session_id", null) != input.target.session_id

_other_session if object.get(input.actor, "workspace_id", null) != input.target.workspace_id
