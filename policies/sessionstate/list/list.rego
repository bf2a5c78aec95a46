# METADATA
# title: Session lists
# description: >-
#   Decides `list`: a page of a workspace's stored sessions (ids, versions
#   and digests, never content). A model service whose token covers the
#   whole target workspace may list it, and an operator any workspace of its
#   own tenant. A token scoped to one session covers that session only.
# schemas:
#   - input: schema.policy_input
package sessionstate.list

import data.sessionstate.lib

# METADATA
# title: List decision
# description: >-
#   `allow`, and `reasons`: the sorted, unique codes of every failing gate.
#   Always defined, so the service never has to guess.
# entrypoint: true
decision := {"allow": allow, "reasons": sort(reasons)}

default allow := false

allow if count(reasons) == 0

reasons contains "action_not_supported" if input.action != "list"

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

# A session's token covers that session, not the workspace's list.
reasons contains "cross_session_scope_rejected" if {
	lib.same_tenant(input.actor, input.target)
	not _operator
	object.get(input.actor, "session_id", null) != null
}

_operator if lib.has_role(input.actor, "operator")
