package sessionstate.erase_test

import data.sessionstate.erase

# A model service erasing its own session. Tests change it with object.union.
valid_input := {
	"action": "erase",
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
	"erasure": {"reason": "requested", "versions": 1, "state_digest": "sha256:ab", "workspace_decision_id": null},
}

operator := {"sub": "op-a", "roles": ["operator"], "tenant_id": "tenant-a", "workspace_id": null, "session_id": null}

workspace := {"tenant_id": "tenant-a", "workspace_id": "ws-a", "session_id": null}

denied(reasons) := {"allow": false, "reasons": reasons}

test_own_session_erased if {
	erase.decision == {"allow": true, "reasons": []} with input as valid_input
}

# Erasing stores nothing: durable writes and approvals do not come into it.
test_erasure_needs_no_durable_writes if {
	erase.decision.allow with input as object.union(valid_input, {"deployment": {"durable_writes_enabled": true}})
}

test_operator_erases_any_session_of_its_tenant if {
	changes := {"actor": operator, "target": {"workspace_id": "ws-b", "session_id": "session-b"}}
	erase.decision.allow with input as object.union(valid_input, changes)
}

test_operator_erases_a_workspace if {
	erase.decision.allow with input as object.union(valid_input, {"actor": operator, "target": workspace})
}

test_model_service_may_not_erase_a_workspace if {
	changes := {"actor": {"session_id": null}, "target": workspace}
	decision := erase.decision with input as object.union(valid_input, changes)
	decision == denied(["role_not_permitted"])
}

test_unsupported_action_rejected if {
	decision := erase.decision with input as object.union(valid_input, {"action": "write"})
	decision == denied(["action_not_supported"])
}

test_auditor_rejected if {
	decision := erase.decision with input as object.union(valid_input, {"actor": {"roles": ["auditor"]}})
	decision == denied(["role_not_permitted"])
}

test_cross_tenant_erase_rejected if {
	decision := erase.decision with input as object.union(valid_input, {"actor": {"tenant_id": "tenant-b"}})
	decision == denied(["cross_tenant_scope_rejected"])
}

test_operator_of_another_tenant_rejected if {
	changes := {"actor": object.union(operator, {"tenant_id": "tenant-b"})}
	decision := erase.decision with input as object.union(valid_input, changes)
	decision == denied(["cross_tenant_scope_rejected"])
}

test_another_session_rejected if {
	decision := erase.decision with input as object.union(valid_input, {"actor": {"session_id": "session-b"}})
	decision == denied(["cross_session_scope_rejected"])
}

# A token of the whole workspace is not the session's own.
test_workspace_token_rejected if {
	decision := erase.decision with input as object.union(valid_input, {"actor": {"session_id": null}})
	decision == denied(["cross_session_scope_rejected"])
}

test_denial_lists_every_failing_gate if {
	changes := {"action": "list", "actor": {"roles": [], "tenant_id": "tenant-b"}}
	decision := erase.decision with input as object.union(valid_input, changes)
	decision == denied(["action_not_supported", "cross_tenant_scope_rejected", "role_not_permitted"])
}

# The idle-expiry sweep's erasure: the system, a session idle for the deployment's TTL.
system := object.union(valid_input.actor, {"sub": "system", "roles": ["system"]})

expiry := object.union(valid_input.erasure, {"reason": "expired", "idle_seconds": 5, "idle_ttl_seconds": 3})

expiry_input := object.union(valid_input, {"actor": system, "erasure": expiry})

test_system_expires_an_idle_session if {
	erase.decision == {"allow": true, "reasons": []} with input as expiry_input
}

test_system_expires_a_session_of_any_workspace if {
	changes := {"target": {"workspace_id": "ws-b", "session_id": "session-b"}}
	erase.decision.allow with input as object.union(expiry_input, changes)
}

test_a_session_not_idle_for_the_ttl_is_kept if {
	decision := erase.decision with input as object.union(expiry_input, {"erasure": {"idle_seconds": 2}})
	decision == denied(["session_not_idle"])
}

test_an_expiry_without_idle_figures_is_refused if {
	decision := erase.decision with input as object.union(expiry_input, {"erasure": {"idle_seconds": null}})
	decision == denied(["session_not_idle"])
}

test_a_tenant_setting_shortens_the_ttl if {
	tenants := {"settings": [{"tenant_id": "tenant-a", "idle_ttl_seconds": 1}]}
	changes := {"erasure": {"idle_seconds": 2, "idle_ttl_seconds": 60}}
	erase.decision.allow with input as object.union(expiry_input, changes)
		with data.sessionstate.tenants as tenants
}

test_a_tenant_setting_never_lengthens_the_ttl if {
	tenants := {"settings": [{"tenant_id": "tenant-a", "idle_ttl_seconds": 600}]}
	decision := erase.decision with input as expiry_input with data.sessionstate.tenants as tenants
	decision.allow
}

test_only_the_system_expires if {
	changes := {"erasure": {"reason": "expired", "idle_seconds": 5, "idle_ttl_seconds": 3}}
	decision := erase.decision with input as object.union(valid_input, changes)
	decision == denied(["role_not_permitted"])
}

test_the_system_erases_nothing_but_expiries if {
	decision := erase.decision with input as object.union(expiry_input, {"erasure": {"reason": "requested"}})
	decision == denied(["role_not_permitted"])
}

test_the_system_does_not_expire_a_workspace if {
	decision := erase.decision with input as object.union(expiry_input, {"target": workspace})
	decision == denied(["cross_session_scope_rejected", "role_not_permitted"])
}

test_the_system_does_not_expire_across_tenants if {
	decision := erase.decision with input as object.union(expiry_input, {"actor": {"tenant_id": "tenant-b"}})
	decision == denied(["cross_tenant_scope_rejected"])
}
