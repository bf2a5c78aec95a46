package sessionstate.fork_test

import data.sessionstate.fork

now := 1700000000

# A fork that passes every gate: a model service whose token covers the workspace,
# forking version 3 of session-a into session-b, durable writes on, a live
# workspace-wide approval, a well-formed record. Each test changes it with
# object.union: nested objects merge, any other value (a list, null) replaces.
valid_input := {
	"action": "fork",
	"now": now,
	"actor": {
		"sub": "model-service-a",
		"roles": ["model-service"],
		"tenant_id": "tenant-a",
		"workspace_id": "ws-a",
	},
	"target": {"tenant_id": "tenant-a", "workspace_id": "ws-a", "session_id": "session-b"},
	"deployment": {"durable_writes_enabled": true},
	"approval": {
		"approval_id": "approval-1",
		"tenant_id": "tenant-a",
		"workspace_id": "ws-a",
		"session_id": null,
		"operator": "operator-a",
		"issued_at": now - 60,
		"expires_at": now + 3600,
		"revoked": false,
	},
	"record": {
		"schema": "sessionstate.record.v2",
		"state_id": "state-1",
		"state_digest": "sha256:0000000000000000000000000000000000000000000000000000000000000000",
		"digest_valid": true,
		"task_profile": "coding",
		"counts": {
			"memory_anchors": 1,
			"gene_anchors": 1,
			"retrieval_evidence": 0,
			"routing_evidence": 0,
			"turns": 2,
			"compacted_turns": 0,
			"source_trace_ids": 1,
		},
		"flags": {
			"raw_messages_stored": false,
			"read_only": true,
			"report_only": true,
			"preview_only": true,
			"write_allowed": false,
		},
		"blockers": [],
	},
	"fork": {
		"source_session_id": "session-a",
		"source_version": 3,
		"source_state_digest": "sha256:1111111111111111111111111111111111111111111111111111111111111111",
	},
}

denied(reasons) := {"allow": false, "reasons": reasons}

allowed := {"allow": true, "reasons": []}

test_fork_by_a_workspace_token_allowed if {
	fork.decision == allowed with input as valid_input
}

test_fork_by_the_tenant_s_operator_allowed if {
	operator := {"sub": "operator-a", "roles": ["operator"], "tenant_id": "tenant-a", "workspace_id": null}
	fork.decision == allowed with input as object.union(valid_input, {"actor": operator})
}

test_fork_by_an_operator_of_another_tenant_rejected if {
	operator := {"sub": "operator-b", "roles": ["operator"], "tenant_id": "tenant-b", "workspace_id": null}
	decision := fork.decision with input as object.union(valid_input, {"actor": operator})
	decision == denied(["cross_tenant_scope_rejected"])
}

test_other_action_rejected if {
	decision := fork.decision with input as object.union(valid_input, {"action": "write"})
	decision == denied(["action_not_supported"])
}

test_fork_without_the_source_rejected if {
	decision := fork.decision with input as object.union(valid_input, {"fork": null})
	decision == denied(["session_state_fork_source_missing"])
}

test_fork_without_a_permitted_role_rejected if {
	decision := fork.decision with input as object.union(valid_input, {"actor": {"roles": ["auditor"]}})
	decision == denied(["role_not_permitted"])
}

test_cross_tenant_fork_rejected if {
	decision := fork.decision with input as object.union(valid_input, {"actor": {"tenant_id": "tenant-b"}})
	decision == denied(["cross_tenant_scope_rejected"])
}

test_cross_workspace_fork_rejected if {
	decision := fork.decision with input as object.union(valid_input, {"actor": {"workspace_id": "ws-b"}})
	decision == denied(["cross_workspace_scope_rejected"])
}

test_fork_by_a_session_token_rejected if {
	decision := fork.decision with input as object.union(valid_input, {"actor": {"session_id": "session-a"}})
	decision == denied(["session_scoped_token_rejected"])
}

test_fork_with_durable_writes_off_rejected if {
	decision := fork.decision with input as object.union(valid_input, {"deployment": {"durable_writes_enabled": false}})
	decision == denied(["session_state_durable_writes_disabled"])
}

test_fork_without_an_approval_rejected if {
	decision := fork.decision with input as object.union(valid_input, {"approval": null})
	decision == denied(["session_state_operator_approval_missing"])
}

test_fork_under_another_session_s_approval_rejected if {
	decision := fork.decision with input as object.union(valid_input, {"approval": {"session_id": "session-a"}})
	decision == denied(["session_state_operator_approval_missing"])
}

test_fork_under_the_target_s_approval_allowed if {
	fork.decision == allowed with input as object.union(valid_input, {"approval": {"session_id": "session-b"}})
}

test_fork_of_a_record_with_blockers_rejected if {
	record := {"digest_valid": false, "blockers": ["session_state_digest_mismatch"]}
	decision := fork.decision with input as object.union(valid_input, {"record": record})
	decision == denied(["session_state_digest_mismatch"])
}

test_fork_without_a_record_rejected if {
	decision := fork.decision with input as object.union(valid_input, {"record": null})
	decision == denied(["session_state_record_missing"])
}
