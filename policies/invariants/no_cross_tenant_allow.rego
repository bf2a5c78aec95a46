# METADATA
# title: No decision allows across tenants
# description: >-
#   A deployment invariant (service/policy/invariants.py), never served: for
#   an input whose actor's tenant is not the target's, no decision allows.
# schemas:
#   - input: schema.policy_input
package sessionstate.invariants.no_cross_tenant_allow

# METADATA
# title: Violation
# description: True for an input across tenants that a decision package allows.
violation if {
	object.get(input.actor, "tenant_id", null) != input.target.tenant_id
	some name in {"approval", "audit", "erase", "fork", "history", "list", "read", "replay", "rewind", "token", "write"}
	data.sessionstate[name].decision.allow == true
}
