package sessionstate.read_test

import data.sessionstate.read

# A model service reading its own session. Tests change it with object.union.
valid_input := {
	"action": "read",
	"now": 1700000000,
	"actor": {
		"sub": "model-service-a",
		"roles": ["model-service"],
		"tenant_id": "tenant-a",
		"workspace_id": "ws-a",
		"session_id": "session-a",
	},
	"target": {"tenant_id": "tenant-a", "workspace_id": "ws-a", "session_id": "session-a"},
	"deployment": {"durable_writes_enabled": false},
	"approval": null,
	"record": null,
}

denied(reasons) := {"allow": false, "reasons": reasons}

test_read_of_own_session_allowed if {
	read.decision == {"allow": true, "reasons": []} with input as valid_input
}

# Reads never need durable writes or an approval.
test_read_allowed_whatever_the_write_switches if {
	read.decision.allow with input as object.union(valid_input, {"deployment": {"durable_writes_enabled": true}})
}

test_unsupported_action_rejected if {
	decision := read.decision with input as object.union(valid_input, {"action": "write"})
	decision == denied(["action_not_supported"])
}

test_read_without_model_service_role_rejected if {
	decision := read.decision with input as object.union(valid_input, {"actor": {"roles": ["auditor"]}})
	decision == denied(["role_not_permitted"])
}

test_cross_tenant_read_rejected if {
	decision := read.decision with input as object.union(valid_input, {"actor": {"tenant_id": "tenant-b"}})
	decision == denied(["cross_tenant_scope_rejected"])
}

test_actor_without_tenant_rejected_as_cross_tenant if {
	decision := read.decision with input as object.union(valid_input, {"actor": {"tenant_id": null}})
	decision == denied(["cross_tenant_scope_rejected"])
}

test_cross_session_read_rejected if {
	decision := read.decision with input as object.union(valid_input, {"actor": {"session_id": "session-b"}})
	decision == denied(["cross_session_scope_rejected"])
}

test_cross_workspace_read_rejected if {
	decision := read.decision with input as object.union(valid_input, {"actor": {"workspace_id": "ws-b"}})
	decision == denied(["cross_session_scope_rejected"])
}

test_denial_lists_every_failing_gate if {
	changes := {"action": "replay", "actor": {"roles": [], "tenant_id": "tenant-b"}}
	decision := read.decision with input as object.union(valid_input, changes)
	decision == denied(["action_not_supported", "cross_tenant_scope_rejected", "role_not_permitted"])
}

test_decision_defined_for_minimal_input if {
	minimal := {
		"action": "read",
		"now": 0,
		"actor": {"sub": "model-service-a", "roles": ["model-service"]},
		"target": {"tenant_id": "tenant-a"},
		"deployment": {"durable_writes_enabled": false},
	}
	decision := read.decision with input as minimal
	decision == denied(["cross_tenant_scope_rejected"])
}
