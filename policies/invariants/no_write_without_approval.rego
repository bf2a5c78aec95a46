# METADATA
# title: No write without an approval in force
# description: >-
#   A deployment invariant (service/policy/invariants.py), never served: a
#   write (or a rewind or a fork, which write) is allowed only under a live operator
#   approval (issued, not expired, not revoked) of the target's tenant,
#   workspace and, if it names one, session.
# schemas:
#   - input: schema.policy_input
package sessionstate.invariants.no_write_without_approval

# METADATA
# title: Violation
# description: True for a write, rewind or fork its decision allows with no approval in force.
violation if {
	input.action in {"write", "rewind", "fork"}
	data.sessionstate[input.action].decision.allow == true
	not _approval_in_force
}

_approval_in_force if {
	approval := input.approval
	approval.revoked == false
	approval.issued_at <= input.now
	input.now < approval.expires_at
	approval.tenant_id == input.target.tenant_id
	approval.workspace_id == input.target.workspace_id
	object.get(approval, "session_id", null) in {null, input.target.session_id}
}
