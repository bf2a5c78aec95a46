package sessionstate.rewind_test

import data.sessionstate.rewind

now := 1700000000

# A rewind that passes every gate: a model service restoring a version of its own
# session, durable writes on, a live workspace-wide approval, a well-formed record.
# Each test changes it with object.union: nested objects merge, any other
# value (a list, null) replaces.
valid_input := {
	"action": "rewind",
	"now": now,
	"actor": {
		"sub": "model-service-a",
		"roles": ["model-service"],
		"tenant_id": "tenant-a",
		"workspace_id": "ws-a",
		"session_id": "session-a",
	},
	"target": {"tenant_id": "tenant-a", "workspace_id": "ws-a", "session_id": "session-a"},
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
	"rewind": {"restored_version": 2, "replaced_version": 5},
}

denied(reasons) := {"allow": false, "reasons": reasons}

test_rewind_of_own_session_allowed if {
	rewind.decision == {"allow": true, "reasons": []} with input as valid_input
}

test_other_action_rejected if {
	decision := rewind.decision with input as object.union(valid_input, {"action": "write"})
	decision == denied(["action_not_supported"])
}

test_rewind_without_the_version_restored_rejected if {
	decision := rewind.decision with input as object.union(valid_input, {"rewind": null})
	decision == denied(["session_state_rewind_version_missing"])
}

test_rewind_without_model_service_role_rejected if {
	decision := rewind.decision with input as object.union(valid_input, {"actor": {"roles": ["operator"]}})
	decision == denied(["role_not_permitted"])
}

test_cross_tenant_rewind_rejected if {
	decision := rewind.decision with input as object.union(valid_input, {"actor": {"tenant_id": "tenant-b"}})
	decision == denied(["session_state_cross_tenant_write_rejected"])
}

test_another_session_s_rewind_rejected if {
	decision := rewind.decision with input as object.union(valid_input, {"actor": {"session_id": "session-b"}})
	decision == denied(["session_state_cross_session_write_rejected"])
}

test_rewind_with_durable_writes_off_rejected if {
	decision := rewind.decision with input as object.union(valid_input, {"deployment": {"durable_writes_enabled": false}})
	decision == denied(["session_state_durable_writes_disabled"])
}

test_rewind_without_an_approval_rejected if {
	decision := rewind.decision with input as object.union(valid_input, {"approval": null})
	decision == denied(["session_state_operator_approval_missing"])
}

test_rewind_under_an_expired_approval_rejected if {
	decision := rewind.decision with input as object.union(valid_input, {"approval": {"expires_at": now}})
	decision == denied(["session_state_operator_approval_missing"])
}

test_rewind_to_a_record_with_blockers_rejected if {
	changes := {"record": {"digest_valid": false, "blockers": ["session_state_digest_mismatch"]}}
	decision := rewind.decision with input as object.union(valid_input, changes)
	decision == denied(["session_state_digest_mismatch"])
}

test_rewind_without_a_record_rejected if {
	decision := rewind.decision with input as object.union(valid_input, {"record": null})
	decision == denied(["session_state_record_missing"])
}

test_rewind_follows_the_tenant_s_settings if {
	settings := {"settings": [{"tenant_id": "tenant-a", "durable_writes": false}]}
	decision := rewind.decision with input as valid_input with data.sessionstate.tenants as settings
	decision == denied(["session_state_tenant_durable_writes_disabled"])
}

# A write decision that does not say allow (a broken edit) allows no rewind.
test_rewind_refused_unless_the_write_decision_allows if {
	decision := rewind.decision with input as valid_input with data.sessionstate.write.decision as {"reasons": []}
	decision == denied([])
}
