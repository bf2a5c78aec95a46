# METADATA
# title: Session state reads
# description: >-
#   Decides `read` of a session's stored state record. Only a model service
#   scoped to exactly the target tenant, workspace and session may read it.
# schemas:
#   - input: schema.policy_input
package sessionstate.read

import data.sessionstate.lib

# METADATA
# title: Read decision
# description: >-
#   `allow`, and `reasons`: the sorted, unique codes of every failing gate.
#   Always defined, so the service never has to guess.
# entrypoint: true
decision := {"allow": allow, "reasons": sort(reasons)}

default allow := false

allow if count(reasons) == 0

reasons contains "action_not_supported" if input.action != "read"

reasons contains "role_not_permitted" if not lib.has_role(input.actor, "model-service")

reasons contains "cross_tenant_scope_rejected" if not lib.same_tenant(input.actor, input.target)

# Reported only within the tenant: across tenants the tenant code says it all.
reasons contains "cross_session_scope_rejected" if {
	lib.same_tenant(input.actor, input.target)
	not lib.same_session(input.actor, input.target)
}
