# METADATA
# title: Decision log access
# description: >-
#   Decides `decisions.read`: listing, reading, verifying and exporting the
#   decision log. Only an auditor may read it, and only for its own tenant.
# schemas:
#   - input: schema.policy_input
package sessionstate.audit

import data.sessionstate.lib

# METADATA
# title: Audit decision
# description: >-
#   `allow`, and `reasons`: the sorted, unique codes of every failing gate.
#   Always defined, so the service never has to guess.
# entrypoint: true
decision := {"allow": allow, "reasons": sort(reasons)}

default allow := false

allow if count(reasons) == 0

reasons contains "action_not_supported" if input.action != "decisions.read"

reasons contains "role_not_permitted" if not lib.has_role(input.actor, "auditor")

reasons contains "cross_tenant_scope_rejected" if not lib.same_tenant(input.actor, input.target)
