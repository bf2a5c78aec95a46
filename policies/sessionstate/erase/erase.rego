# METADATA
# title: Session erasure
# description: >-
#   Decides `erase`: a session's stored state deleted, every record kept of
#   it, with the decision's entry as the erasure's receipt. A model service
#   scoped to exactly the target session may erase it, and an operator any
#   session of its own tenant; a whole workspace (a target without a
#   session) only an operator. Erasing needs neither durable writes nor an
#   approval: it stores nothing. The service's idle-expiry sweep erases as
#   the actor `system` (role `system`) with the reason `expired`, and only
#   that: allowed when the session has been idle at least its TTL, the
#   deployment's or its tenant's shorter `idle_ttl_seconds`.
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
	not _expiry
}

# An expiry is the system's, and the system erases nothing else.
reasons contains "role_not_permitted" if {
	_expired
	not _system
}

reasons contains "role_not_permitted" if {
	_system
	not _expired
}

# The session has not been idle for its TTL: the deployment's, or its tenant's shorter one.
reasons contains "session_not_idle" if {
	_expiry
	input.erasure.idle_seconds < min({input.erasure.idle_ttl_seconds, _tenant_ttl})
}

reasons contains "session_not_idle" if {
	_expiry
	not _idle_known
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
	not _expiry
	not lib.same_session(input.actor, input.target)
}

_operator if lib.has_role(input.actor, "operator")

_system if {
	input.actor.sub == "system"
	lib.has_role(input.actor, "system")
}

_expired if input.erasure.reason == "expired"

_expiry if {
	_system
	_expired
	object.get(input.target, "session_id", null) != null
}

default _tenant_ttl := 315360000

_tenant_ttl := lib.tenant_settings(input.target.tenant_id).idle_ttl_seconds

_idle_known if {
	is_number(input.erasure.idle_seconds)
	is_number(input.erasure.idle_ttl_seconds)
}
