# METADATA
# title: Shared helpers for sessionstate decisions
# description: >-
#   Role and scope matching used by every sessionstate decision package.
#   The helpers are pure functions of the actor and target they are given,
#   so each decision package reads as a list of its gates.
package sessionstate.lib

# METADATA
# title: has_role
# description: True when the actor's verified token carries the role.
has_role(actor, role) if role in actor.roles

# METADATA
# title: same_tenant
# description: >-
#   True when the actor's tenant is exactly the target's. An actor without
#   a tenant (missing or null) never matches: ids are compared byte for byte.
same_tenant(actor, target) if {
	is_string(target.tenant_id)
	actor.tenant_id == target.tenant_id
}

# METADATA
# title: same_session
# description: >-
#   True when the actor's workspace and session are exactly the target's.
#   A missing id counts as null, so a token scoped to a whole tenant does not
#   match a session target.
same_session(actor, target) if {
	every key in {"workspace_id", "session_id"} {
		object.get(actor, key, null) == object.get(target, key, null)
	}
}

# METADATA
# title: tenant_settings
# description: >-
#   The tenant's entry in the tenant settings document
#   (`data.sessionstate.tenants`, policies/sessionstate/tenants/data.json);
#   undefined when it has none, so every rule reading a setting stays silent
#   and the default behaviour holds. A setting only ever restricts.
# schemas:
#   - data.sessionstate.tenants: schema.tenants.settings
tenant_settings(tenant_id) := settings if {
	some settings in data.sessionstate.tenants.settings
	settings.tenant_id == tenant_id
}
