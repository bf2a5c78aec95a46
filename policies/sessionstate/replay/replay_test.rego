package sessionstate.replay_test

import data.sessionstate.replay

# A model service replaying its own session. Tests change it with object.union.
valid_input := {
	"action": "replay",
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

test_replay_of_own_session_allowed if {
	replay.decision == {"allow": true, "reasons": []} with input as valid_input
}

test_unsupported_action_rejected if {
	decision := replay.decision with input as object.union(valid_input, {"action": "read"})
	decision == denied(["action_not_supported"])
}

test_replay_without_model_service_role_rejected if {
	decision := replay.decision with input as object.union(valid_input, {"actor": {"roles": ["operator"]}})
	decision == denied(["role_not_permitted"])
}

test_cross_tenant_replay_rejected if {
	decision := replay.decision with input as object.union(valid_input, {"actor": {"tenant_id": "tenant-b"}})
	decision == denied(["session_replay_cross_tenant_rejected"])
}

test_cross_session_replay_rejected if {
	decision := replay.decision with input as object.union(valid_input, {"actor": {"session_id": "session-b"}})
	decision == denied(["session_replay_cross_session_rejected"])
}

test_cross_workspace_replay_rejected if {
	decision := replay.decision with input as object.union(valid_input, {"actor": {"workspace_id": "ws-b"}})
	decision == denied(["session_replay_cross_session_rejected"])
}

test_denial_lists_every_failing_gate if {
	changes := {"action": "write", "actor": {"roles": ["auditor"], "tenant_id": null}}
	decision := replay.decision with input as object.union(valid_input, changes)
	decision == denied(["action_not_supported", "role_not_permitted", "session_replay_cross_tenant_rejected"])
}

test_decision_defined_for_minimal_input if {
	minimal := {
		"action": "replay",
		"now": 0,
		"actor": {"sub": "model-service-a", "roles": ["model-service"]},
		"target": {"tenant_id": "tenant-a"},
		"deployment": {"durable_writes_enabled": false},
	}
	decision := replay.decision with input as minimal
	decision == denied(["session_replay_cross_tenant_rejected"])
}
