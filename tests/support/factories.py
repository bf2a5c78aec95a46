"""Small builders of valid inputs, shared by the tests."""

from __future__ import annotations

from typing import Any

from service.decisions.log import DecisionEntryBody
from service.policy.input import PolicyActor, PolicyTarget
from service.policy.trace import DecisionEngine, DecisionTrace
from store.canonical import canonical_digest, canonical_json
from store.digests import DigestKey
from store.record.bounds import MAX_TURNS
from store.record.builder import build_record
from store.record.inputs import SessionStateInput
from store.record.state_record import SessionStateRecord
from store.scope import TenantScope

GENE_DIGEST = "sha256:" + "ab" * 32


def scope(
    tenant: str = "tenant-a", workspace: str = "ws-1", session: str = "chat-1"
) -> TenantScope:
    return TenantScope(tenant_id=tenant, workspace_id=workspace, session_id=session)


def state_input(**overrides: Any) -> dict[str, Any]:
    """A valid SessionStateInput as JSON, with raw text in every raw field."""
    body: dict[str, Any] = {
        "runtime_profile": {
            "task_profile": "coding",
            "model_id": "qwen2.5-coder:7b",
            "tokenizer": "qwen2",
            "context_window": 4096,
            "max_tokens": 512,
            "streaming": True,
            "cancellation_anchor": "stop if the user says cancel",
        },
        "memory_anchors": [{"anchor_id": "memory:active", "evidence": "user prefers Rust"}],
        "gene_anchors": [{"anchor_id": "gene:rust-coding", "evidence_digest": GENE_DIGEST}],
        "retrieval_evidence": [{"anchor_id": "doc:borrowck", "evidence": "the borrow checker"}],
        "routing_evidence": [{"anchor_id": "route:coder", "evidence": "coding intent"}],
        "turns": [
            {"turn_id": "turn-1", "role": "user", "payload": "fix my lifetime error"},
            {"turn_id": "turn-2", "role": "assistant", "payload": "add a 'a bound"},
        ],
        "source_trace_ids": ["trace:session-state"],
    }
    body.update(overrides)
    return body


def record(
    key: DigestKey, target: TenantScope | None = None, **overrides: Any
) -> SessionStateRecord:
    return build_record(
        target or scope(), SessionStateInput.model_validate(state_input(**overrides)), key
    )


# Every member of a record as the v1 code path wrote it (before `compacted_turns`).
V1_MEMBERS = {
    "schema", "state_id", "scope", "runtime_profile", "memory_anchors", "gene_anchors",
    "retrieval_evidence", "routing_evidence", "turns", "source_trace_ids",
    "raw_messages_stored", "read_only", "report_only", "preview_only", "write_allowed",
    "state_digest",
}  # fmt: skip


def v1_record_bytes(
    key: DigestKey, target: TenantScope | None = None, **overrides: Any
) -> tuple[bytes, str]:
    """The bytes a v1 service stored for this input (up to 1,024 turns), and its state digest."""
    built = build_record(
        target or scope(),
        SessionStateInput.model_validate(state_input(**overrides)),
        key,
        turns_kept=MAX_TURNS,
    )
    content = {name: value for name, value in built.content().items() if name != "compacted_turns"}
    content["schema"] = "sessionstate.record.v1"
    digest = canonical_digest(content)
    stored = {**content, "state_digest": digest}
    assert set(stored) == V1_MEMBERS
    return canonical_json(stored), digest


def decision_entry_body(
    decision_id: str, tenant: str = "tenant-a", **input_: Any
) -> DecisionEntryBody:
    """A decision entry body as the routes build it, with a small input."""
    trace = DecisionTrace(
        decision_id=decision_id,
        action="read",
        policy="sessionstate/read",
        allow=True,
        reasons=[],
        policy_revision="sha256:" + "0" * 64,
        input_digest="sha256:" + "1" * 64,
        evaluated_at="2026-11-30T12:00:00.000Z",
        engine=DecisionEngine(version="test"),
        latency_ms=0.5,
    )
    return DecisionEntryBody(
        decision=trace,
        actor=PolicyActor(sub="svc", roles=["model-service"]),
        target=PolicyTarget(tenant_id=tenant),
        input=dict(input_),
    )
