package sessionstate.audit_test

import data.sessionstate.audit

# An auditor reading its own tenant's decision log. Tests change it with
# object.union.
valid_input := {
	"action": "decisions.read",
	"now": 1700000000,
	"actor": {"sub": "auditor-a", "roles": ["auditor"], "tenant_id": "tenant-a"},
	"target": {"tenant_id": "tenant-a"},
	"deployment": {"durable_writes_enabled": false},
	"approval": null,
	"record": null,
}

denied(reasons) := {"allow": false, "reasons": reasons}

test_auditor_may_read_own_tenant_log if {
	audit.decision == {"allow": true, "reasons": []} with input as valid_input
}

test_unsupported_action_rejected if {
	decision := audit.decision with input as object.union(valid_input, {"action": "approval.list"})
	decision == denied(["action_not_supported"])
}

test_operator_may_not_read_log if {
	decision := audit.decision with input as object.union(valid_input, {"actor": {"roles": ["operator"]}})
	decision == denied(["role_not_permitted"])
}

test_cross_tenant_log_read_rejected if {
	decision := audit.decision with input as object.union(valid_input, {"actor": {"tenant_id": "tenant-b"}})
	decision == denied(["cross_tenant_scope_rejected"])
}

test_denial_lists_every_failing_gate if {
	changes := {"action": "read", "actor": {"roles": ["model-service"], "tenant_id": "tenant-b"}}
	decision := audit.decision with input as object.union(valid_input, changes)
	decision == denied(["action_not_supported", "cross_tenant_scope_rejected", "role_not_permitted"])
}

test_decision_defined_for_minimal_input if {
	minimal := {
		"action": "decisions.read",
		"now": 0,
		"actor": {"sub": "auditor-a", "roles": []},
		"target": {"tenant_id": "tenant-a"},
		"deployment": {"durable_writes_enabled": false},
	}
	decision := audit.decision with input as minimal
	decision == denied(["cross_tenant_scope_rejected", "role_not_permitted"])
}
