package sessionstate.write_test

import data.sessionstate.write

now := 1700000000

# A write that passes every gate: a model service writing its own session,
# durable writes on, a live workspace-wide approval, a well-formed record.
# Each test changes it with object.union: nested objects merge, any other
# value (a list, null) replaces.
valid_input := {
	"action": "write",
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
}

allowed := {"allow": true, "reasons": []}

denied(reasons) := {"allow": false, "reasons": reasons}

# --- Allowed ---

test_write_allowed_with_workspace_approval if {
	write.decision == allowed with input as valid_input
}

test_write_allowed_with_session_approval if {
	decision := write.decision with input as object.union(valid_input, {"approval": {"session_id": "session-a"}})
	decision == allowed
}

test_preview_allowed_when_every_gate_passes if {
	decision := write.decision with input as object.union(valid_input, {"action": "preview"})
	decision == allowed
}

test_preview_allowed_with_write_blockers_listed if {
	changes := {"action": "preview", "deployment": {"durable_writes_enabled": false}, "approval": null}
	decision := write.decision with input as object.union(valid_input, changes)
	decision == {"allow": true, "reasons": [
		"session_state_durable_writes_disabled",
		"session_state_operator_approval_missing",
	]}
}

test_preview_allowed_without_record if {
	decision := write.decision with input as object.union(valid_input, {"action": "preview", "record": null})
	decision == {"allow": true, "reasons": ["session_state_record_missing"]}
}

# --- Access gates ---

test_unsupported_action_rejected if {
	decision := write.decision with input as object.union(valid_input, {"action": "read"})
	decision == denied(["action_not_supported"])
}

test_write_without_model_service_role_rejected if {
	decision := write.decision with input as object.union(valid_input, {"actor": {"roles": ["operator", "auditor"]}})
	decision == denied(["role_not_permitted"])
}

test_cross_tenant_write_rejected if {
	decision := write.decision with input as object.union(valid_input, {"actor": {"tenant_id": "tenant-b"}})
	decision == denied(["session_state_cross_tenant_write_rejected"])
}

test_actor_without_tenant_rejected_as_cross_tenant if {
	decision := write.decision with input as object.union(valid_input, {"actor": {"tenant_id": null}})
	decision == denied(["session_state_cross_tenant_write_rejected"])
}

# Ids are never normalised: a different byte is a different tenant.
test_tenant_ids_compared_exactly if {
	decision := write.decision with input as object.union(valid_input, {"actor": {"tenant_id": "Tenant-a"}})
	decision == denied(["session_state_cross_tenant_write_rejected"])
}

test_cross_session_write_rejected if {
	decision := write.decision with input as object.union(valid_input, {"actor": {"session_id": "session-b"}})
	decision == denied(["session_state_cross_session_write_rejected"])
}

test_cross_workspace_write_rejected if {
	decision := write.decision with input as object.union(valid_input, {"actor": {"workspace_id": "ws-b"}})
	decision == denied(["session_state_cross_session_write_rejected"])
}

test_tenant_wide_token_rejected_as_cross_session if {
	changes := {"actor": {"workspace_id": null, "session_id": null}}
	decision := write.decision with input as object.union(valid_input, changes)
	decision == denied(["session_state_cross_session_write_rejected"])
}

test_preview_denied_on_access_gate if {
	changes := {"action": "preview", "actor": {"tenant_id": "tenant-b"}}
	decision := write.decision with input as object.union(valid_input, changes)
	decision == denied(["session_state_cross_tenant_write_rejected"])
}

# --- Deployment and approval ---

test_write_rejected_when_durable_writes_disabled if {
	changes := {"deployment": {"durable_writes_enabled": false}}
	decision := write.decision with input as object.union(valid_input, changes)
	decision == denied(["session_state_durable_writes_disabled"])
}

test_write_without_approval_rejected if {
	decision := write.decision with input as object.union(valid_input, {"approval": null})
	decision == denied(["session_state_operator_approval_missing"])
}

test_expired_approval_does_not_count if {
	decision := write.decision with input as object.union(valid_input, {"approval": {"expires_at": now}})
	decision == denied(["session_state_operator_approval_missing"])
}

test_approval_not_yet_issued_does_not_count if {
	decision := write.decision with input as object.union(valid_input, {"approval": {"issued_at": now + 1}})
	decision == denied(["session_state_operator_approval_missing"])
}

test_approval_counts_from_the_second_it_is_issued if {
	decision := write.decision with input as object.union(valid_input, {"approval": {"issued_at": now}})
	decision == allowed
}

test_revoked_approval_does_not_count if {
	decision := write.decision with input as object.union(valid_input, {"approval": {"revoked": true}})
	decision == denied(["session_state_operator_approval_missing"])
}

# Fail closed: an approval must say it is not revoked.
test_approval_without_revoked_flag_does_not_count if {
	decision := write.decision with input as json.remove(valid_input, ["approval/revoked"])
	decision == denied(["session_state_operator_approval_missing"])
}

test_approval_for_other_session_does_not_count if {
	decision := write.decision with input as object.union(valid_input, {"approval": {"session_id": "session-b"}})
	decision == denied(["session_state_operator_approval_missing"])
}

test_approval_for_other_workspace_does_not_count if {
	decision := write.decision with input as object.union(valid_input, {"approval": {"workspace_id": "ws-b"}})
	decision == denied(["session_state_operator_approval_missing"])
}

test_approval_for_other_tenant_does_not_count if {
	decision := write.decision with input as object.union(valid_input, {"approval": {"tenant_id": "tenant-b"}})
	decision == denied(["session_state_operator_approval_missing"])
}

# --- Record ---

# With no record only this gate speaks; the record gates stay silent.
test_write_without_record_rejected if {
	decision := write.decision with input as object.union(valid_input, {"record": null})
	decision == denied(["session_state_record_missing"])
}

test_record_schema_mismatch_rejected if {
	changes := {"record": {"schema": "sessionstate.record.v3"}}
	decision := write.decision with input as object.union(valid_input, changes)
	decision == denied(["session_state_schema_mismatch"])
}

test_v1_record_schema_still_known if {
	changes := {"record": {"schema": "sessionstate.record.v1"}}
	decision := write.decision with input as object.union(valid_input, changes)
	decision == allowed
}

# However many turns a long session has compacted, its writes are decided the same.
test_write_allowed_with_compacted_turns if {
	changes := {"record": {"counts": {"turns": 256, "compacted_turns": 100000}}}
	decision := write.decision with input as object.union(valid_input, changes)
	decision == allowed
}

test_record_without_memory_anchor_rejected if {
	changes := {"record": {"counts": {"memory_anchors": 0}}}
	decision := write.decision with input as object.union(valid_input, changes)
	decision == denied(["session_state_memory_anchor_missing"])
}

test_record_without_gene_anchor_rejected if {
	changes := {"record": {"counts": {"gene_anchors": 0}}}
	decision := write.decision with input as object.union(valid_input, changes)
	decision == denied(["session_state_gene_anchor_missing"])
}

test_record_with_raw_messages_rejected if {
	changes := {"record": {"flags": {"raw_messages_stored": true}}}
	decision := write.decision with input as object.union(valid_input, changes)
	decision == denied(["session_state_raw_messages_forbidden"])
}

test_record_that_is_not_read_only_rejected if {
	every flag in ["read_only", "report_only", "preview_only"] {
		decision := write.decision with input as object.union(valid_input, {"record": {"flags": {flag: false}}})
		decision == denied(["session_state_preview_flags_invalid"])
	}
}

test_record_that_allows_writes_rejected if {
	changes := {"record": {"flags": {"write_allowed": true}}}
	decision := write.decision with input as object.union(valid_input, changes)
	decision == denied(["session_state_preview_flags_invalid"])
}

test_record_with_digest_mismatch_rejected if {
	decision := write.decision with input as object.union(valid_input, {"record": {"digest_valid": false}})
	decision == denied(["session_state_digest_mismatch"])
}

test_service_blockers_pass_through if {
	changes := {"record": {"blockers": ["service_validation_blocker"]}}
	decision := write.decision with input as object.union(valid_input, changes)
	decision == denied(["service_validation_blocker"])
}

test_preview_allowed_with_service_blockers_listed if {
	changes := {"action": "preview", "record": {"blockers": ["service_validation_blocker"]}}
	decision := write.decision with input as object.union(valid_input, changes)
	decision == {"allow": true, "reasons": ["service_validation_blocker"]}
}

test_reasons_are_unique if {
	changes := {"record": {
		"digest_valid": false,
		"blockers": ["session_state_digest_mismatch", "session_state_digest_mismatch"],
	}}
	decision := write.decision with input as object.union(valid_input, changes)
	decision == denied(["session_state_digest_mismatch"])
}

# --- Every gate at once ---

test_denial_lists_every_failing_gate if {
	changes := {
		"action": "approval.grant",
		"actor": {"roles": [], "workspace_id": "ws-b"},
		"deployment": {"durable_writes_enabled": false},
		"approval": {"revoked": true},
		"record": {
			"schema": "other",
			"digest_valid": false,
			"counts": {"memory_anchors": 0, "gene_anchors": 0},
			"flags": {"raw_messages_stored": true, "read_only": false, "write_allowed": true},
			"blockers": ["service_validation_blocker"],
		},
	}
	decision := write.decision with input as object.union(valid_input, changes)
	decision == denied([
		"action_not_supported",
		"role_not_permitted",
		"service_validation_blocker",
		"session_state_cross_session_write_rejected",
		"session_state_digest_mismatch",
		"session_state_durable_writes_disabled",
		"session_state_gene_anchor_missing",
		"session_state_memory_anchor_missing",
		"session_state_operator_approval_missing",
		"session_state_preview_flags_invalid",
		"session_state_raw_messages_forbidden",
		"session_state_schema_mismatch",
	])
}

# Only the fields the schema requires: the decision is still defined, and denies.
test_decision_defined_for_minimal_input if {
	minimal := {
		"action": "write",
		"now": now,
		"actor": {"sub": "model-service-a", "roles": ["model-service"]},
		"target": {"tenant_id": "tenant-a"},
		"deployment": {"durable_writes_enabled": false},
	}
	decision := write.decision with input as minimal
	decision == denied([
		"session_state_cross_tenant_write_rejected",
		"session_state_durable_writes_disabled",
		"session_state_operator_approval_missing",
		"session_state_record_missing",
	])
}

# --- Tenant settings (data.sessionstate.tenants) ---

# Tenant-a's settings, beside another tenant's that must not affect it.
tenants(settings) := {"settings": [
	object.union({"tenant_id": "tenant-a"}, settings),
	{"tenant_id": "tenant-b", "durable_writes": false, "write_task_profiles": []},
]}

test_tenant_without_settings_keeps_the_defaults if {
	write.decision == allowed with input as valid_input with data.sessionstate.tenants as tenants({})
	write.decision == allowed with input as valid_input with data.sessionstate.tenants as {"settings": []}
}

test_tenant_durable_writes_off_refuses_its_writes if {
	decision := write.decision with input as valid_input
		with data.sessionstate.tenants as tenants({"durable_writes": false})
	decision == denied(["session_state_tenant_durable_writes_disabled"])
}

test_tenant_durable_writes_on_does_not_override_the_deployment if {
	decision := write.decision with input as object.union(valid_input, {"deployment": {"durable_writes_enabled": false}})
		with data.sessionstate.tenants as tenants({"durable_writes": true})
	decision == denied(["session_state_durable_writes_disabled"])
}

# A preview still answers, and lists what would block the tenant's real write.
test_tenant_durable_writes_off_is_listed_on_a_preview if {
	decision := write.decision with input as object.union(valid_input, {"action": "preview"})
		with data.sessionstate.tenants as tenants({"durable_writes": false})
	decision == {"allow": true, "reasons": ["session_state_tenant_durable_writes_disabled"]}
}

test_tenant_task_profiles_admit_the_listed_ones if {
	decision := write.decision with input as valid_input
		with data.sessionstate.tenants as tenants({"write_task_profiles": ["general", "coding"]})
	decision == allowed
}

test_tenant_task_profiles_refuse_any_other if {
	decision := write.decision with input as valid_input
		with data.sessionstate.tenants as tenants({"write_task_profiles": ["writing"]})
	decision == denied(["session_state_task_profile_not_permitted"])
}

test_tenant_with_no_task_profiles_writes_nothing if {
	decision := write.decision with input as valid_input
		with data.sessionstate.tenants as tenants({"write_task_profiles": []})
	decision == denied(["session_state_task_profile_not_permitted"])
}
