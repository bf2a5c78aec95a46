package sessionstate.invariants.no_write_without_approval_test

import data.sessionstate.invariants.no_write_without_approval

approval := {
	"approval_id": "appr-1",
	"tenant_id": "tenant-a",
	"workspace_id": "ws-a",
	"session_id": null,
	"operator": "op-1",
	"issued_at": 1699999000,
	"expires_at": 1700001000,
	"revoked": false,
}

write := {
	"action": "write",
	"now": 1700000000,
	"actor": {
		"sub": "svc",
		"roles": ["model-service"],
		"tenant_id": "tenant-a",
		"workspace_id": "ws-a",
		"session_id": "s-a",
	},
	"target": {"tenant_id": "tenant-a", "workspace_id": "ws-a", "session_id": "s-a"},
	"deployment": {"durable_writes_enabled": true},
	"approval": null,
	"record": null,
}

allowed := {"allow": true, "reasons": []}

test_default_policies_hold if {
	not no_write_without_approval.violation with input as write
}

test_a_write_allowed_without_an_approval_violates if {
	no_write_without_approval.violation with input as write
		with data.sessionstate.write.decision as allowed
}

test_a_write_allowed_under_a_live_approval_holds if {
	not no_write_without_approval.violation with input as object.union(write, {"approval": approval})
		with data.sessionstate.write.decision as allowed
}

test_a_rewind_allowed_without_an_approval_violates if {
	no_write_without_approval.violation with input as object.union(write, {"action": "rewind"})
		with data.sessionstate.rewind.decision as allowed
}

test_a_rewind_allowed_under_a_live_approval_holds if {
	rewind := object.union(write, {"action": "rewind", "approval": approval})
	not no_write_without_approval.violation with input as rewind
		with data.sessionstate.rewind.decision as allowed
}

test_a_fork_allowed_without_an_approval_violates if {
	no_write_without_approval.violation with input as object.union(write, {"action": "fork"})
		with data.sessionstate.fork.decision as allowed
}

test_a_fork_allowed_under_a_live_approval_holds if {
	forked := object.union(write, {"action": "fork", "approval": approval})
	not no_write_without_approval.violation with input as forked
		with data.sessionstate.fork.decision as allowed
}
