package sessionstate.invariants.no_cross_tenant_allow_test

import data.sessionstate.invariants.no_cross_tenant_allow

across := {
	"action": "read",
	"now": 1700000000,
	"actor": {
		"sub": "svc",
		"roles": ["model-service"],
		"tenant_id": "tenant-a",
		"workspace_id": "ws-a",
		"session_id": "s-a",
	},
	"target": {"tenant_id": "tenant-b", "workspace_id": "ws-a", "session_id": "s-a"},
	"deployment": {"durable_writes_enabled": true},
	"approval": null,
	"record": null,
}

test_default_policies_hold if {
	not no_cross_tenant_allow.violation with input as across
}

test_a_read_allowed_across_tenants_violates if {
	no_cross_tenant_allow.violation with input as across
		with data.sessionstate.read.decision as {"allow": true, "reasons": []}
}

test_an_erasure_allowed_across_tenants_violates if {
	no_cross_tenant_allow.violation with input as object.union(across, {"action": "erase"})
		with data.sessionstate.erase.decision as {"allow": true, "reasons": []}
}

test_a_list_allowed_across_tenants_violates if {
	no_cross_tenant_allow.violation with input as object.union(across, {"action": "list"})
		with data.sessionstate.list.decision as {"allow": true, "reasons": []}
}

test_a_history_read_allowed_across_tenants_violates if {
	no_cross_tenant_allow.violation with input as object.union(across, {"action": "history"})
		with data.sessionstate.history.decision as {"allow": true, "reasons": []}
}

test_a_rewind_allowed_across_tenants_violates if {
	no_cross_tenant_allow.violation with input as object.union(across, {"action": "rewind"})
		with data.sessionstate.rewind.decision as {"allow": true, "reasons": []}
}

test_a_fork_allowed_across_tenants_violates if {
	no_cross_tenant_allow.violation with input as object.union(across, {"action": "fork"})
		with data.sessionstate.fork.decision as {"allow": true, "reasons": []}
}
