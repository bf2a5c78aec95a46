# METADATA
# title: Session erasure
# description: >-
#   Decides `erase`: a session's stored state deleted, every record kept of
#   it, with the decision's entry as the erasure's receipt. A model service
#   scoped to exactly the target session may erase it, and an operator any
#   session of its own tenant; a whole workspace (a target without a
#   session) only an operator. Erasing needs neither durable writes nor an
#   approval: it stores nothing.
# schemas:
#   - input: schema.policy_input
package sessionstate.erase

import data.sessionstate.lib

# METADATA
# title: Erase decision
# description: >-
#   `allow`, and `reasons`: the sorted, unique codes of every failing gate.
#   Always defined, so the service never has to guess.
# entrypoint: true
decision := {"allow": allow, "reasons": sort(reasons)}

default allow := false

allow if count(reasons) == 0

reasons contains "action_not_supported" if input.action != "erase"

reasons contains "role_not_permitted" if {
	not _operator
	not lib.has_role(input.actor, "model-service")
}

# A workspace's erasure is an operator's.
reasons contains "role_not_permitted" if {
	not _operator
	object.get(input.target, "session_id", null) == null
}

reasons contains "cross_tenant_scope_rejected" if not lib.same_tenant(input.actor, input.target)

# Reported only within the tenant, and only for a model service: an operator
# acts anywhere in its own tenant.
reasons contains "cross_session_scope_rejected" if {
	lib.same_tenant(input.actor, input.target)
	not _operator
	not lib.same_session(input.actor, input.target)
}

_operator if lib.has_role(input.actor, "operator")
