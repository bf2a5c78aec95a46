"""Representative policy inputs: a few hundred documents of the input schema, made the same way
every time, that an admission check asks a candidate policy set (`service.policy.admission`).

Every value comes from the input models (`service.policy.input`): each action, each role, each
task profile and each word of a token exchange the models name. For every action and every
tenant (`TENANTS`, and the tenants a candidate's tenant settings name), one input each gate
would allow, then that input changed one part at a time: the actor's roles and scope (the
target's session, its workspace, its tenant only, another tenant's, none), the approval (none,
expired, revoked, another workspace's), the record (none, one with blockers), the deployment's
durable writes, each word of a token exchange, who stands behind a policy activation, and a rewind or a fork that names no version. Not every input: only what a gate is
likely to turn on. `service.policy.invariants` samples many more.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, get_args

from service.policy.input import (
    PolicyAction,
    PolicyExchange,
    PolicyInput,
    Role,
)
from store.record.inputs import TaskProfile

TENANTS = ("tenant-a", "tenant-b")
NOW = 1_800_000_000
ACTIONS: tuple[PolicyAction, ...] = get_args(PolicyAction)
ROLES: tuple[Role, ...] = get_args(Role)
_ROLE_OF: dict[str, Role] = {
    "approval.grant": "operator",
    "approval.revoke": "operator",
    "approval.list": "operator",
    "decisions.read": "auditor",
    "policy.approve": "operator",
}
_WITH_RECORD = ("write", "preview", "rewind", "fork")
_WORKSPACE_WIDE = ("list",)  # of a whole workspace: asked with a workspace's token
_WORKSPACE_TOKEN = ("list", "fork", "token.exchange")  # asked with a workspace's token


def representative_inputs(tenants: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The inputs as OPA receives them (JSON documents), each valid by the input schema."""
    every_tenant = dict.fromkeys((*TENANTS, *tenants))
    return [
        PolicyInput.model_validate(document).model_dump(mode="json", by_alias=True)
        for action in ACTIONS
        for tenant in every_tenant
        for document in _variants(action, tenant)
    ]


def _scope(tenant: str) -> dict[str, str]:
    return {"tenant_id": tenant, "workspace_id": "ws-1", "session_id": "chat-1"}


def _approval(tenant: str, **changes: Any) -> dict[str, Any]:
    return {
        "approval_id": "appr-1",
        "tenant_id": tenant,
        "workspace_id": "ws-1",
        "session_id": None,
        "operator": "op-1",
        "issued_at": NOW - 60,
        "expires_at": NOW + 600,
        "revoked": False,
        **changes,
    }


def _record(profile: TaskProfile = "coding", **changes: Any) -> dict[str, Any]:
    return {
        "schema": "sessionstate.record.v2",
        "state_id": "state-1",
        "state_digest": "sha256:" + "ab" * 32,
        "digest_valid": True,
        "task_profile": profile,
        "counts": dict.fromkeys(
            (
                "memory_anchors",
                "gene_anchors",
                "retrieval_evidence",
                "routing_evidence",
                "turns",
                "compacted_turns",
                "source_trace_ids",
            ),
            1,
        ),
        "flags": {
            "raw_messages_stored": False,
            "read_only": True,
            "report_only": True,
            "preview_only": True,
            "write_allowed": False,
        },
        "blockers": [],
        **changes,
    }


_REWIND = {"restored_version": 2, "replaced_version": 5}
_FORK = {
    "source_session_id": "chat-0",
    "source_version": 3,
    "source_state_digest": "sha256:" + "cd" * 32,
}


def _exchange(**changes: str) -> dict[str, str]:
    return {
        "form": "valid",
        "grant_type": "token_exchange",
        "subject_token_type": "jwt",
        "subject_token": "valid",
        "actor_token": "absent",
        "resource": "valid",
        **changes,
    }


def _activation(**changes: Any) -> dict[str, Any]:
    return {
        "revision": "sha256:" + "cd" * 32,
        "previous_revision": "sha256:" + "ab" * 32,
        "requested_by": "op-1",
        "approved_by": [],
        "approvals": 2,
        "approver_vouched_by": "identity_provider",
        **changes,
    }


def _erasure(**changes: Any) -> dict[str, Any]:
    return {
        "reason": "requested",
        "versions": 1,
        "state_digest": "sha256:" + "ab" * 32,
        "workspace_decision_id": None,
        **changes,
    }


def _expiries(base: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The idle-expiry sweep's erasure (the system actor), idle enough and not."""
    system = {**base["actor"], "sub": "system", "roles": ["system"]}
    for idle in (0, 3600):
        erasure = _erasure(reason="expired", idle_seconds=idle, idle_ttl_seconds=60)
        yield {**base, "actor": system, "erasure": erasure}


def allowed_input(action: PolicyAction, tenant: str) -> dict[str, Any]:
    """The input of `action` at `tenant`'s session that every gate would allow."""
    return _base(action, tenant)


def _base(action: PolicyAction, tenant: str) -> dict[str, Any]:
    scope: dict[str, str | None] = {**_scope(tenant)}
    if action in _WORKSPACE_WIDE:
        scope["session_id"] = None
    actor: dict[str, Any] = {"sub": "svc-1", "roles": [_ROLE_OF.get(action, "model-service")]}
    actor |= {**scope, "session_id": None} if action in _WORKSPACE_TOKEN else scope
    return {
        "action": action,
        "now": NOW,
        "actor": actor,
        "target": scope,
        "deployment": {"durable_writes_enabled": True},
        "approval": _approval(tenant) if action in _WITH_RECORD else None,
        "record": _record() if action in _WITH_RECORD else None,
        **({"exchange": _exchange()} if action == "token.exchange" else {}),
        **({"activation": _activation()} if action == "policy.approve" else {}),
        **({"erasure": _erasure()} if action == "erase" else {}),
        **({"rewind": _REWIND} if action == "rewind" else {}),
        **({"fork": _FORK} if action == "fork" else {}),
        **({"history": {"version": 2}} if action == "history" else {}),
    }


def _variants(action: PolicyAction, tenant: str) -> Iterator[dict[str, Any]]:
    base = _base(action, tenant)
    yield base
    for actor in _actors(base["actor"], tenant):
        yield {**base, "actor": actor}
    yield {**base, "target": {"tenant_id": tenant, "workspace_id": None, "session_id": None}}
    yield {**base, "deployment": {"durable_writes_enabled": False}}
    for approval in (
        None,
        _approval(tenant, expires_at=NOW - 1),
        _approval(tenant, revoked=True),
        _approval(tenant, workspace_id="ws-2", session_id="chat-1"),
    ):
        yield {**base, "approval": approval}
    for record in (
        None,
        *(_record(profile) for profile in get_args(TaskProfile)),
        _record(digest_valid=False, blockers=["session_state_digest_mismatch"]),
    ):
        yield {**base, "record": record}
    if action == "policy.approve":
        for activation in (
            None,
            _activation(requested_by="svc-1"),  # the actor asked for it
            _activation(approved_by=["svc-1"]),  # the actor approved it already
            _activation(requested_by="system", approved_by=["op-2"], approvals=3),
            _activation(approver_vouched_by="this_host"),
        ):
            yield {**base, "activation": activation}
    if action == "erase":
        for erasure in (None, _erasure(versions=0, state_digest=None)):
            yield {**base, "erasure": erasure}
        yield from _expiries(base)
    if action == "rewind":
        yield {**base, "rewind": None}
    if action == "fork":
        yield {**base, "fork": None}
    if action == "history":
        yield {**base, "history": {"version": None}}  # the versions listed
    if action == "token.exchange":
        for field, info in PolicyExchange.model_fields.items():
            for word in get_args(info.annotation):
                yield {**base, "exchange": _exchange(**{field: word})}


def _actors(actor: dict[str, Any], tenant: str) -> Iterator[dict[str, Any]]:
    """The actor with each set of roles, then with each scope."""
    for roles in ([], *([role] for role in ROLES), list(ROLES)):
        yield {**actor, "roles": roles}
    for scope in (
        _scope(tenant),
        {"tenant_id": tenant, "workspace_id": "ws-1", "session_id": None},
        {"tenant_id": tenant, "workspace_id": None, "session_id": None},
        {"tenant_id": tenant, "workspace_id": "ws-2", "session_id": "chat-2"},
        _scope(TENANTS[1] if tenant == TENANTS[0] else TENANTS[0]),  # another tenant's
        {"tenant_id": None, "workspace_id": None, "session_id": None},
    ):
        yield {**actor, **scope}
