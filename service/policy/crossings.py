"""Scope crossings: inputs built on purpose where the invariants are most likely broken.

Generated inputs (`service.policy.generated`) reach a rule guarded by several conditions
only by chance: one about the workspace `shared-support` that also checks the action and
the role is met by few of a few hundred random inputs, maybe none. These inputs are built
instead, the same every time: for every action, every target tenant (`samples.TENANTS` and
the tenants the candidate's settings name), and every scope id the candidate's Rego names
put in the target's workspace or session, an actor of each role whose workspace and session
are the target's and whose tenant is the target's own or another one. Each starts from the
representative input the gates would allow (`service.policy.samples`), so an approval and a
record are there where a write needs them. `service.policy.invariants` asks the invariants
of these beside the generated ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from service.policy.input import PolicyInput
from service.policy.samples import ACTIONS, ROLES, TENANTS, allowed_input


def scope_crossings(ids: Sequence[str], tenants: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The inputs, as OPA receives them (JSON documents), each valid by the input schema."""
    every_tenant = tuple(dict.fromkeys((*TENANTS, *tenants)))
    return [
        PolicyInput.model_validate(document).model_dump(mode="json", by_alias=True)
        for action in ACTIONS
        for tenant in every_tenant
        for target in _targets(tenant, ids)
        for document in _actors(allowed_input(action, tenant), target, every_tenant)
    ]


def _targets(tenant: str, ids: Sequence[str]) -> Iterator[dict[str, str]]:
    yield {"tenant_id": tenant, "workspace_id": "ws-1", "session_id": "chat-1"}
    for scope_id in ids:
        yield {"tenant_id": tenant, "workspace_id": scope_id, "session_id": "chat-1"}
        yield {"tenant_id": tenant, "workspace_id": "ws-1", "session_id": scope_id}


def _actors(
    base: dict[str, Any], target: dict[str, str], tenants: Sequence[str]
) -> Iterator[dict[str, Any]]:
    """The base input at `target`, asked by each role from its own tenant and another."""
    other = next(tenant for tenant in tenants if tenant != target["tenant_id"])
    for actor_tenant in (target["tenant_id"], other):
        for role in ROLES:
            actor = {**base["actor"], **target, "tenant_id": actor_tenant, "roles": [role]}
            yield {**base, "target": target, "actor": actor}
