"""The document OPA sees for every decision.

It is built from claims, scope, configuration and a *summary* of the record:
counts, flags, blockers and digests. It never carries raw text, so it can be
logged whole in the decision log. `policies/schemas/policy_input.json` is
generated from these models (`python -m service.policy.input`), and the Rego
packages are type-checked against it by `opa check --strict`.
"""

from __future__ import annotations

import json
import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from store.record.blockers import Blocker
from store.record.inputs import TaskProfile
from store.record.state_record import SessionStateRecord
from store.record.validation import record_blockers
from store.scope import ScopeId
from store.version_lane import MAX_VERSION

PolicyAction = Literal[
    "preview",
    "write",
    "read",
    "replay",
    "approval.grant",
    "approval.revoke",
    "approval.list",
    "decisions.read",
    "token.exchange",
    "policy.approve",
    # the session lifecycle: a workspace's sessions listed, a session (or workspace) erased
    "list",
    "erase",
    # Versions and rewind (`sessionstate.history`, `sessionstate.rewind`).
    "history",
    "rewind",
    # A fork: a session version written as another session's first record (`sessionstate.fork`).
    "fork",
]
Role = Literal["model-service", "operator", "auditor"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PolicyActor(_Strict):
    """Who asks: the verified token's claims (ids only, never the token)."""

    sub: str = Field(min_length=1, max_length=256)
    roles: list[str] = Field(max_length=16)
    tenant_id: ScopeId | None = None
    workspace_id: ScopeId | None = None
    session_id: ScopeId | None = None


class PolicyTarget(_Strict):
    """What is asked for. Workspace and session are absent for wider actions; the tenant
    only for a token exchange that names no usable session, by a caller without one."""

    tenant_id: ScopeId | None = None
    workspace_id: ScopeId | None = None
    session_id: ScopeId | None = None


class PolicyDeployment(_Strict):
    """Deployment switches the policy must honour."""

    durable_writes_enabled: bool


class PolicyApproval(_Strict):
    """The operator approval the service found for the target, if any."""

    approval_id: str = Field(min_length=1, max_length=64)
    tenant_id: ScopeId
    workspace_id: ScopeId
    session_id: ScopeId | None = None
    operator: str = Field(min_length=1, max_length=256)
    issued_at: int = Field(ge=0, description="Unix seconds")
    expires_at: int = Field(ge=0, description="Unix seconds")
    revoked: bool = False


class RecordCounts(_Strict):
    memory_anchors: int = Field(ge=0)
    gene_anchors: int = Field(ge=0)
    retrieval_evidence: int = Field(ge=0)
    routing_evidence: int = Field(ge=0)
    turns: int = Field(ge=0, description="turns the record keeps")
    compacted_turns: int = Field(
        ge=0, description="older turns summarised in `compacted_turns` (0 for a v1 record)"
    )
    source_trace_ids: int = Field(ge=0)


class RecordFlags(_Strict):
    raw_messages_stored: bool
    read_only: bool
    report_only: bool
    preview_only: bool
    write_allowed: bool


class PolicyRecordSummary(_Strict):
    """A record reduced to what a policy may judge: no text, only shape."""

    schema_: str = Field(alias="schema", max_length=64)
    state_id: str = Field(max_length=128)
    state_digest: str = Field(max_length=160)
    digest_valid: bool
    task_profile: TaskProfile = Field(
        description="the record's runtime profile's task profile (tenant settings may limit it)"
    )
    counts: RecordCounts
    flags: RecordFlags
    blockers: list[str] = Field(max_length=32)


class PolicyExchange(_Strict):
    """What the service found in a token exchange request (`POST /v1/token`): a word per
    parameter, never its value. `target` is the `resource` when that and the subject token
    are `valid`; an unverified subject's request names no target at all."""

    form: Literal["valid", "malformed"] = Field(
        description="malformed: the body is not form-encoded, or repeats a parameter "
        "(which then counts as missing)"
    )
    grant_type: Literal["token_exchange", "missing", "unsupported"]
    subject_token_type: Literal["jwt", "access_token", "missing", "unsupported"]
    subject_token: Literal["valid", "missing", "invalid", "expired", "unverifiable"] = Field(
        description="verified as a bearer token is; unverifiable: the identity provider's "
        "keys could not be fetched; expired too when it ends within the second. Unless "
        "valid, `actor` is the anonymous one and `target` names no tenant"
    )
    actor_token: Literal["absent", "present"] = Field(
        description="present: the request names an actor token (delegation is not supported)"
    )
    resource: Literal["valid", "missing", "malformed"] = Field(
        description="valid: a session's path of scope ids, or its URL under the service's "
        "configured public origin"
    )


class PolicyActivationAsk(_Strict):
    """`policy.approve`: the policy revision an operator approves, and who stands behind it
    already (SESSIONSTATE_POLICY_ACTIVATION_APPROVALS)."""

    revision: str = Field(min_length=1, max_length=160, description="the revision that waits")
    previous_revision: str = Field(
        min_length=1, max_length=160, description="the revision that decides while it waits"
    )
    requested_by: str = Field(
        min_length=1,
        max_length=256,
        description="the operator whose `policy reload` asked for it, or `system` (a bare "
        "SIGHUP, the watcher, a bundle's poll)",
    )
    approved_by: list[str] = Field(
        max_length=8, description="the operators who approved it so far, in order"
    )
    approvals: Literal[2, 3] = Field(description="how many operators the deployment asks for")
    approver_vouched_by: Literal["identity_provider", "this_host"] = Field(
        description="who vouches for the approver's token: an identity provider (a JWKS key, "
        "SESSIONSTATE_JWT_PUBLIC_KEY_FILE's), or this host (its HS256 secret, which "
        "`--operator` mints with: whoever reads the data dir can mint any name)"
    )


class PolicyErasure(_Strict):
    """`erase` of a session: what the erasure would delete, and why; no content. The
    entry that keeps it is the erasure's receipt."""

    reason: Literal["requested", "expired"] = Field(
        description="requested: a caller asked for it; expired: the idle-expiry sweep's"
    )
    versions: int = Field(
        ge=0,
        description="the session's versions it deletes, the current record among them (a "
        "record written before versions were kept is 1; 0: nothing is stored)",
    )
    state_digest: str | None = Field(
        max_length=160,
        description="the stored record's state digest (a corrupt one's `error_digest`); "
        "null when nothing is stored",
    )
    workspace_decision_id: str | None = Field(
        default=None,
        max_length=64,
        description="with a workspace's erasure: the decision that allowed it; else null",
    )
    idle_seconds: int | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        ge=0,
        description="`expired` only: whole seconds since the session was last written; "
        "absent otherwise",
    )
    idle_ttl_seconds: int | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        ge=1,
        description="`expired` only: the deployment's SESSIONSTATE_STATE_IDLE_TTL_SECONDS "
        "(a tenant's `idle_ttl_seconds` may only shorten it); absent otherwise",
    )


class PolicyRewind(_Strict):
    """`rewind`: the version restored, and the version it replaces (the current one)."""

    restored_version: int = Field(ge=1, le=MAX_VERSION, description="`to_version` of the request")
    replaced_version: int = Field(ge=1, le=MAX_VERSION, description="the current version")


class PolicyHistory(_Strict):
    """`history`: which version is read (None: the versions are listed)."""

    version: int | None = Field(
        ge=1, le=MAX_VERSION, description="the version read; null: the versions listed"
    )


class PolicyFork(_Strict):
    """`fork`: the source version the target session is created from (the target is the
    decision's `target`; the source is in the same tenant and workspace)."""

    source_session_id: ScopeId
    source_version: int = Field(ge=1, le=MAX_VERSION, description="the version forked")
    source_state_digest: str = Field(max_length=160, description="that version's state digest")


class PolicyInput(_Strict):
    """The whole `input` document of every sessionstate decision."""

    action: PolicyAction
    now: int = Field(ge=0, description="Unix seconds at the time of the request")
    actor: PolicyActor
    target: PolicyTarget
    deployment: PolicyDeployment
    approval: PolicyApproval | None = None
    record: PolicyRecordSummary | None = None
    exchange: PolicyExchange | None = Field(
        default=None,
        exclude_if=lambda value: value is None,  # other actions' inputs stay as they were
        description="`token.exchange` only: what the request held; absent otherwise",
    )
    activation: PolicyActivationAsk | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="`policy.approve` only: the revision approved; absent otherwise",
    )
    erasure: PolicyErasure | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="`erase` of a session only: what it erases; absent otherwise (and for "
        "a workspace's erasure, whose sessions are each decided with their own)",
    )
    rewind: PolicyRewind | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="`rewind` only: the version restored; absent otherwise",
    )
    fork: PolicyFork | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="`fork` only: the source version; absent otherwise",
    )
    history: PolicyHistory | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="`history` only: the version read, or the list; absent otherwise",
    )


def policy_input_schema() -> dict[str, object]:
    """JSON Schema of the policy input, as OPA's `schemas` annotations expect it."""
    schema = PolicyInput.model_json_schema(by_alias=True, mode="serialization")
    definitions = schema.pop("$defs", {})
    inlined = _inline_refs(schema, definitions)
    assert isinstance(inlined, dict)
    inlined["$schema"] = "http://json-schema.org/draft-07/schema#"
    return inlined


def _inline_refs(node: object, definitions: dict[str, object]) -> object:
    """Replace `$ref`s with their definitions, and `X | None` with a nullable X.

    OPA's type checker does not look inside `anyOf`, so `anyOf: [X, null]`
    becomes X with `"type": [X's type, "null"]`, and fields under a nullable
    object (`input.record.*`) are type-checked too.
    """
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            return _inline_refs(definitions[ref.rsplit("/", 1)[-1]], definitions)
        inlined = {key: _inline_refs(value, definitions) for key, value in node.items()}
        return _nullable(inlined)
    if isinstance(node, list):
        return [_inline_refs(item, definitions) for item in node]
    return node


def _nullable(node: dict[str, object]) -> dict[str, object]:
    options = node.get("anyOf")
    if not isinstance(options, list) or len(options) != 2 or {"type": "null"} not in options:
        return node
    (kept,) = [option for option in options if option != {"type": "null"}]
    if not isinstance(kept, dict) or not isinstance(kept.get("type"), str):
        return node
    rest = {key: value for key, value in node.items() if key != "anyOf"}
    return {**kept, **rest, "type": [kept["type"], "null"]}


def render_schema() -> str:
    return json.dumps(policy_input_schema(), indent=2, sort_keys=True) + "\n"


def record_summary(record: SessionStateRecord) -> PolicyRecordSummary:
    """A record as the policy sees it: counts, flags, blockers and digests, no text."""
    blockers = record_blockers(record)
    return PolicyRecordSummary.model_validate(
        {
            "schema": record.schema_,
            "state_id": record.state_id,
            "state_digest": record.state_digest,
            "digest_valid": Blocker.DIGEST_MISMATCH not in blockers,
            "task_profile": record.runtime_profile.task_profile,
            "counts": {
                "memory_anchors": len(record.memory_anchors),
                "gene_anchors": len(record.gene_anchors),
                "retrieval_evidence": len(record.retrieval_evidence),
                "routing_evidence": len(record.routing_evidence),
                "turns": len(record.turns),
                "compacted_turns": record.summary.count,
                "source_trace_ids": len(record.source_trace_ids),
            },
            "flags": {
                "raw_messages_stored": record.raw_messages_stored,
                "read_only": record.read_only,
                "report_only": record.report_only,
                "preview_only": record.preview_only,
                "write_allowed": record.write_allowed,
            },
            "blockers": [str(blocker) for blocker in blockers],
        }
    )


if __name__ == "__main__":  # pragma: no cover - used by `make schema`
    sys.stdout.write(render_schema())
