package sessionstate.approval_test

import data.sessionstate.approval

# An operator granting an approval in its own tenant. The operator's token
# names no workspace or session: operators act tenant-wide. Tests change
# this input with object.union.
valid_input := {
	"action": "approval.grant",
	"now": 1700000000,
	"actor": {"sub": "operator-a", "roles": ["operator"], "tenant_id": "tenant-a"},
	"target": {"tenant_id": "tenant-a", "workspace_id": "ws-a", "session_id": null},
	"deployment": {"durable_writes_enabled": true},
	"approval": null,
	"record": null,
}

denied(reasons) := {"allow": false, "reasons": reasons}

test_operator_may_grant_revoke_and_list_in_own_tenant if {
	every action in ["approval.grant", "approval.revoke", "approval.list"] {
		decision := approval.decision with input as object.union(valid_input, {"action": action})
		decision == {"allow": true, "reasons": []}
	}
}

test_operator_may_act_on_any_workspace_of_own_tenant if {
	decision := approval.decision with input as object.union(valid_input, {"target": {"workspace_id": "ws-b"}})
	decision.allow
}

test_unsupported_action_rejected if {
	decision := approval.decision with input as object.union(valid_input, {"action": "write"})
	decision == denied(["action_not_supported"])
}

# Model services must never approve their own writes.
test_model_service_may_not_grant if {
	decision := approval.decision with input as object.union(valid_input, {"actor": {"roles": ["model-service"]}})
	decision == denied(["role_not_permitted"])
}

test_cross_tenant_approval_rejected if {
	decision := approval.decision with input as object.union(valid_input, {"actor": {"tenant_id": "tenant-b"}})
	decision == denied(["cross_tenant_scope_rejected"])
}

test_denial_lists_every_failing_gate if {
	changes := {"action": "decisions.read", "actor": {"roles": ["auditor"], "tenant_id": null}}
	decision := approval.decision with input as object.union(valid_input, changes)
	decision == denied(["action_not_supported", "cross_tenant_scope_rejected", "role_not_permitted"])
}

test_decision_defined_for_minimal_input if {
	minimal := {
		"action": "approval.list",
		"now": 0,
		"actor": {"sub": "operator-a", "roles": ["operator"]},
		"target": {"tenant_id": "tenant-a"},
		"deployment": {"durable_writes_enabled": false},
	}
	decision := approval.decision with input as minimal
	decision == denied(["cross_tenant_scope_rejected"])
}

# --- Tenant settings: the longest approval a tenant's operators may grant ---

# The approval the service would store: one hour from now.
grant_input := object.union(valid_input, {"approval": {
	"approval_id": "approval-1",
	"tenant_id": "tenant-a",
	"workspace_id": "ws-a",
	"session_id": null,
	"operator": "operator-a",
	"issued_at": 1700000000,
	"expires_at": 1700003600,
	"revoked": false,
}})

limited(seconds) := {"settings": [
	{"tenant_id": "tenant-a", "max_approval_seconds": seconds},
	{"tenant_id": "tenant-b", "max_approval_seconds": 1},
]}

test_grant_within_the_tenant_limit_allowed if {
	decision := approval.decision with input as grant_input with data.sessionstate.tenants as limited(3600)
	decision == {"allow": true, "reasons": []}
}

test_grant_over_the_tenant_limit_rejected if {
	decision := approval.decision with input as grant_input with data.sessionstate.tenants as limited(3599)
	decision == denied(["approval_lifetime_over_tenant_limit"])
}

# Fail closed: with a limit, a grant must say how long the approval would live.
test_grant_without_the_approval_rejected_under_a_limit if {
	decision := approval.decision with input as valid_input with data.sessionstate.tenants as limited(3600)
	decision == denied(["approval_lifetime_over_tenant_limit"])
}

test_tenant_limit_judges_grants_only if {
	every action in ["approval.revoke", "approval.list"] {
		changes := {"action": action, "approval": null}
		decision := approval.decision with input as object.union(grant_input, changes)
			with data.sessionstate.tenants as limited(1)
		decision == {"allow": true, "reasons": []}
	}
}

test_grant_without_a_tenant_limit_allowed if {
	decision := approval.decision with input as grant_input with data.sessionstate.tenants as {"settings": []}
	decision == {"allow": true, "reasons": []}
}

activation_input := {
	"action": "policy.approve",
	"now": 1700000000,
	"actor": {"sub": "operator-b", "roles": ["operator"]},
	"target": {},
	"deployment": {"durable_writes_enabled": false},
	"activation": {
		"revision": "sha256:new",
		"previous_revision": "sha256:old",
		"requested_by": "operator-a",
		"approved_by": [],
		"approvals": 2,
		"approver_vouched_by": "identity_provider",
	},
}

test_second_operator_may_approve_an_activation if {
	decision := approval.decision with input as activation_input
	decision == {"allow": true, "reasons": []}
}

test_requester_may_not_approve_own_activation if {
	changes := {"actor": {"sub": "operator-a"}}
	decision := approval.decision with input as object.union(activation_input, changes)
	decision == denied(["operator_already_approved"])
}

test_an_approver_counts_once if {
	changes := {"actor": {"sub": "operator-c"}, "activation": {"approved_by": ["operator-c"]}}
	decision := approval.decision with input as object.union(activation_input, changes)
	decision == denied(["operator_already_approved"])
}

test_tenant_operator_may_not_approve_an_activation if {
	changes := {"actor": {"tenant_id": "tenant-a"}}
	decision := approval.decision with input as object.union(activation_input, changes)
	decision == denied(["deployment_operator_required"])
}

test_model_service_may_not_approve_an_activation if {
	changes := {"actor": {"roles": ["model-service"]}}
	decision := approval.decision with input as object.union(activation_input, changes)
	decision == denied(["role_not_permitted"])
}

test_activation_without_its_revision_rejected if {
	decision := approval.decision with input as object.remove(activation_input, ["activation"])
	decision == denied(["activation_missing"])
}

test_an_approval_with_a_token_this_host_minted_rejected if {
	changes := {"activation": {"approver_vouched_by": "this_host"}}
	decision := approval.decision with input as object.union(activation_input, changes)
	decision == denied(["identity_provider_token_required"])
}

test_an_activation_approval_naming_a_tenant_rejected if {
	changes := {"target": {"tenant_id": "tenant-a"}}
	decision := approval.decision with input as object.union(activation_input, changes)
	decision == denied(["cross_tenant_scope_rejected"])
}
