# METADATA
# title: Session replay previews
# description: >-
#   Decides `replay`: rebuilding retrieval, routing and gene inputs from a
#   session's stored anchors. Only a model service scoped to exactly the
#   target tenant, workspace and session may replay it, and the service
#   returns no inputs at all when this is denied.
# schemas:
#   - input: schema.policy_input
package sessionstate.replay

import data.sessionstate.lib

# METADATA
# title: Replay decision
# description: >-
#   `allow`, and `reasons`: the sorted, unique codes of every failing gate.
#   Always defined, so the service never has to guess.
# entrypoint: true
decision := {"allow": allow, "reasons": sort(reasons)}

default allow := false

allow if count(reasons) == 0

reasons contains "action_not_supported" if input.action != "replay"

reasons contains "role_not_permitted" if not lib.has_role(input.actor, "model-service")

reasons contains "session_replay_cross_tenant_rejected" if not lib.same_tenant(input.actor, input.target)

# Reported only within the tenant: across tenants the tenant code says it all.
reasons contains "session_replay_cross_session_rejected" if {
	lib.same_tenant(input.actor, input.target)
	not lib.same_session(input.actor, input.target)
}
