package sessionstate.invariants.no_cross_session_read_test

import data.sessionstate.invariants.no_cross_session_read

read := {
	"action": "read",
	"now": 1700000000,
	"actor": {
		"sub": "svc",
		"roles": ["model-service"],
		"tenant_id": "tenant-a",
		"workspace_id": "ws-a",
		"session_id": "s-a",
	},
	"target": {"tenant_id": "tenant-a", "workspace_id": "ws-a", "session_id": "s-b"},
	"deployment": {"durable_writes_enabled": false},
	"approval": null,
	"record": null,
}

allowed := {"allow": true, "reasons": []}

test_default_policies_hold if {
	not no_cross_session_read.violation with input as read
}

test_a_read_of_another_session_allowed_violates if {
	no_cross_session_read.violation with input as read with data.sessionstate.read.decision as allowed
}

other_workspace := {"target": {"tenant_id": "tenant-a", "workspace_id": "ws-b", "session_id": "s-a"}}

test_a_read_of_another_workspace_allowed_violates if {
	no_cross_session_read.violation with input as object.union(read, other_workspace)
		with data.sessionstate.read.decision as allowed
}

test_the_history_of_another_session_allowed_violates if {
	no_cross_session_read.violation with input as object.union(read, {"action": "history"})
		with data.sessionstate.history.decision as allowed
}

test_default_policies_hold_for_history if {
	not no_cross_session_read.violation with input as object.union(read, {"action": "history"})
}
