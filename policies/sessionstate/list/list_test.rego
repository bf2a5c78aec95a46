package sessionstate.list_test

import data.sessionstate.list

# A model service whose token covers the workspace, listing it. Tests change it with object.union.
valid_input := {
	"action": "list",
	"now": 1700000000,
	"actor": {
		"sub": "model-service-a",
		"roles": ["model-service"],
		"tenant_id": "tenant-a",
		"workspace_id": "ws-a",
		"session_id": null,
	},
	"target": {"tenant_id": "tenant-a", "workspace_id": "ws-a", "session_id": null},
	"deployment": {"durable_writes_enabled": false},
	"approval": null,
	"record": null,
}

operator := {"sub": "op-a", "roles": ["operator"], "tenant_id": "tenant-a", "workspace_id": null, "session_id": null}

denied(reasons) := {"allow": false, "reasons": reasons}

test_workspace_token_lists_its_workspace if {
	list.decision == {"allow": true, "reasons": []} with input as valid_input
}

test_operator_lists_any_workspace_of_its_tenant if {
	list.decision.allow with input as object.union(valid_input, {"actor": operator, "target": {"workspace_id": "ws-b"}})
}

test_unsupported_action_rejected if {
	decision := list.decision with input as object.union(valid_input, {"action": "read"})
	decision == denied(["action_not_supported"])
}

test_auditor_rejected if {
	decision := list.decision with input as object.union(valid_input, {"actor": {"roles": ["auditor"]}})
	decision == denied(["role_not_permitted"])
}

test_cross_tenant_list_rejected if {
	decision := list.decision with input as object.union(valid_input, {"actor": {"tenant_id": "tenant-b"}})
	decision == denied(["cross_tenant_scope_rejected"])
}

test_operator_of_another_tenant_rejected if {
	changes := {"actor": object.union(operator, {"tenant_id": "tenant-b"})}
	decision := list.decision with input as object.union(valid_input, changes)
	decision == denied(["cross_tenant_scope_rejected"])
}

test_another_workspace_rejected if {
	decision := list.decision with input as object.union(valid_input, {"actor": {"workspace_id": "ws-b"}})
	decision == denied(["cross_workspace_scope_rejected"])
}

test_session_token_rejected if {
	decision := list.decision with input as object.union(valid_input, {"actor": {"session_id": "session-a"}})
	decision == denied(["cross_session_scope_rejected"])
}

test_denial_lists_every_failing_gate if {
	changes := {"action": "erase", "actor": {"roles": [], "workspace_id": "ws-b", "session_id": "s"}}
	decision := list.decision with input as object.union(valid_input, changes)
	decision == denied([
		"action_not_supported", "cross_session_scope_rejected",
		"cross_workspace_scope_rejected", "role_not_permitted",
	])
}
