# METADATA
# title: Durable-write approvals
# description: >-
#   Decides `approval.grant`, `approval.revoke` and `approval.list`: the
#   operator actions on the approvals that durable writes need. An operator
#   acts anywhere in its own tenant, so only the tenant is compared. Decides
#   `policy.approve` too: an operator's approval of a new policy revision,
#   where the deployment asks for more than one operator behind each
#   (SESSIONSTATE_POLICY_ACTIVATION_APPROVALS).
# schemas:
#   - input: schema.policy_input
package sessionstate.approval

import data.sessionstate.lib

# METADATA
# title: Approval decision
# description: >-
#   `allow`, and `reasons`: the sorted, unique codes of every failing gate.
#   Always defined, so the service never has to guess.
# entrypoint: true
decision := {"allow": allow, "reasons": sort(reasons)}

default allow := false

allow if count(reasons) == 0

_tenant_actions := {"approval.grant", "approval.revoke", "approval.list"}

reasons contains "action_not_supported" if {
	not input.action in _tenant_actions
	input.action != "policy.approve"
}

# Model services must never approve their own writes.
reasons contains "role_not_permitted" if not lib.has_role(input.actor, "operator")

reasons contains "cross_tenant_scope_rejected" if {
	input.action != "policy.approve"
	not lib.same_tenant(input.actor, input.target)
}

# An approval of a policy revision is the deployment's: it names no tenant.
reasons contains "cross_tenant_scope_rejected" if {
	input.action == "policy.approve"
	is_string(input.target.tenant_id)
}

# The policy set is the deployment's: an operator scoped to one tenant may not
# approve what decides for every tenant.
reasons contains "deployment_operator_required" if {
	input.action == "policy.approve"
	is_string(input.actor.tenant_id)
}

# Two people: the operator who asked for the revision, or who approved it
# already, does not count twice.
reasons contains "operator_already_approved" if {
	input.action == "policy.approve"
	input.actor.sub in _behind(input.activation)
}

# Two people, not two names: a token this host minted (`--operator`, with the
# data dir's HS256 secret) can name anyone; only an identity provider's vouches
# for who approves.
reasons contains "identity_provider_token_required" if {
	input.action == "policy.approve"
	input.activation.approver_vouched_by != "identity_provider"
}

reasons contains "activation_missing" if {
	input.action == "policy.approve"
	not is_object(object.get(input, "activation", null))
}

# A tenant may bound how long its operators' approvals live. Only a grant is
# judged: the service sends the approval it would store, and one that is
# missing or outlives the bound is refused.
reasons contains "approval_lifetime_over_tenant_limit" if {
	input.action == "approval.grant"
	limit := lib.tenant_settings(input.target.tenant_id).max_approval_seconds
	not _lives_at_most(input.approval, limit)
}

_lives_at_most(approval, limit) if approval.expires_at - approval.issued_at <= limit

_behind(activation) := {activation.requested_by} | {sub | some sub in activation.approved_by}
