# METADATA
# title: Session forks
# description: >-
#   Decides `fork`: a kept version of a session (`input.fork` names it) written
#   as the first record of another session of the same workspace (the
#   decision's target). Reading the source and writing the target both lie in
#   the target's workspace: a model service whose token covers that whole
#   workspace may fork, and an operator in any workspace of its own tenant. A
#   token scoped to one session covers that session only, not a new one. The
#   write's store gates (durable writes, the operator approval covering the
#   target, tenant settings, the record's own gates) hold as for any write.
# schemas:
#   - input: schema.policy_input
package sessionstate.fork

import data.sessionstate.lib
import data.sessionstate.write

# METADATA
# title: Fork decision
# description: >-
#   `allow`, and `reasons`: the sorted, unique codes of every failing gate.
#   Always defined, so the service never has to guess.
# entrypoint: true
decision := {"allow": allow, "reasons": sort(reasons)}

default allow := false

# Only what the decision asked allows: one undefined or malformed allows nothing.
allow if {
	count(reasons) == 0
	is_array(_as_write.reasons)
}

reasons contains "action_not_supported" if input.action != "fork"

# The service names the version forked; an input without one is refused.
reasons contains "session_state_fork_source_missing" if object.get(input, "fork", null) == null

reasons contains "role_not_permitted" if {
	not _operator
	not lib.has_role(input.actor, "model-service")
}

reasons contains "cross_tenant_scope_rejected" if not lib.same_tenant(input.actor, input.target)

# Reported only within the tenant, and only for a model service: an operator
# acts anywhere in its own tenant.
reasons contains "cross_workspace_scope_rejected" if {
	lib.same_tenant(input.actor, input.target)
	not _operator
	object.get(input.actor, "workspace_id", null) != object.get(input.target, "workspace_id", null)
}

# A session's token covers its own session: it creates no other.
reasons contains "session_scoped_token_rejected" if {
	lib.same_tenant(input.actor, input.target)
	not _operator
	object.get(input.actor, "session_id", null) != null
}

# The write's store gates, for the forked record written to the target. Its access
# gates are the fork's own, above.
# object.get: a write decision of another shape (which admission refuses) still type-checks.
reasons contains reason if {
	some reason in object.get(_as_write, "reasons", [])
	not reason in _write_access_reasons
}

_write_access_reasons := {
	"action_not_supported",
	"role_not_permitted",
	"session_state_cross_tenant_write_rejected",
	"session_state_cross_session_write_rejected",
}

_operator if lib.has_role(input.actor, "operator")

# One decision asked of another: write's store gates stay the one source.
_as_write := asked if {
	# regal ignore:with-outside-test-context
	asked := write.decision with input.action as "write"
}
