package sessionstate.history_test

import data.sessionstate.history

# A model service reading its own session's versions. Tests change it with object.union.
valid_input := {
	"action": "history",
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

test_history_of_own_session_allowed if {
	history.decision == {"allow": true, "reasons": []} with input as valid_input
}

test_history_allowed_whatever_the_write_switches if {
	history.decision.allow with input as object.union(valid_input, {"deployment": {"durable_writes_enabled": true}})
}

test_other_action_rejected if {
	decision := history.decision with input as object.union(valid_input, {"action": "read"})
	decision == denied(["action_not_supported"])
}

test_history_without_model_service_role_rejected if {
	decision := history.decision with input as object.union(valid_input, {"actor": {"roles": ["operator"]}})
	decision == denied(["role_not_permitted"])
}

test_cross_tenant_history_rejected if {
	decision := history.decision with input as object.union(valid_input, {"actor": {"tenant_id": "tenant-b"}})
	decision == denied(["cross_tenant_scope_rejected"])
}

test_another_session_s_history_rejected if {
	decision := history.decision with input as object.union(valid_input, {"actor": {"session_id": "session-b"}})
	decision == denied(["cross_session_scope_rejected"])
}

test_another_workspace_s_history_rejected if {
	decision := history.decision with input as object.union(valid_input, {"actor": {"workspace_id": "ws-b"}})
	decision == denied(["cross_session_scope_rejected"])
}

test_decision_defined_for_minimal_input if {
	minimal := {
		"action": "history",
		"now": 0,
		"actor": {"sub": "model-service-a", "roles": ["model-service"]},
		"target": {"tenant_id": "tenant-a"},
		"deployment": {"durable_writes_enabled": false},
	}
	decision := history.decision with input as minimal
	decision == denied(["cross_tenant_scope_rejected"])
}

# A read decision that does not say allow (a broken edit) allows no history.
test_history_refused_unless_the_read_decision_allows if {
	decision := history.decision with input as valid_input with data.sessionstate.read.decision as {"reasons": []}
	decision == denied([])
}
