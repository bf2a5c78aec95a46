"""Replay preview: the inputs docs/api.md describes, from digests and anchors only."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from service.replay import ReplayPreviewRequest, SessionReplayPlanner
from store.canonical import canonical_digest
from store.digests import DigestKey
from store.record.builder import build_record
from store.record.inputs import SessionStateInput
from tests.support.factories import GENE_DIGEST, record, scope, state_input

planner = SessionReplayPlanner()


def raw_texts(body: Any) -> list[str]:
    """Every raw text of a state input: evidence, payloads and the cancellation anchor."""
    if isinstance(body, dict):
        found = [
            value
            for name, value in body.items()
            if name in {"evidence", "payload", "cancellation_anchor"}
        ]
        return found + [text for value in body.values() for text in raw_texts(value)]
    if isinstance(body, list):
        return [text for item in body for text in raw_texts(item)]
    return []


def anchors(prefix: str, count: int) -> list[dict[str, str]]:
    return [
        {"anchor_id": f"{prefix}:{index}", "evidence": f"{prefix} {index}"}
        for index in range(count)
    ]


def test_replay_explains_retrieval_routing_and_gene_inputs_without_raw_payloads(
    digest_key: DigestKey,
) -> None:
    built = record(digest_key)
    preview = planner.preview(built, 16)
    assert preview.allowed is True
    assert preview.blocked_reasons == []
    assert [(i.kind, i.anchor_id, i.evidence_digest) for i in preview.retrieval_inputs] == [
        ("memory_chain", "memory:active", built.memory_anchors[0].evidence_digest),
        ("retrieval", "doc:borrowck", built.retrieval_evidence[0].evidence_digest),
    ]
    assert [(i.kind, i.anchor_id) for i in preview.routing_inputs] == [
        ("runtime_profile", "runtime_profile"),
        ("routing", "route:coder"),
    ]
    assert preview.routing_inputs[1].evidence_digest == built.routing_evidence[0].evidence_digest
    assert [(i.kind, i.anchor_id, i.evidence_digest) for i in preview.gene_inputs] == [
        ("gene_chain", "gene:rust-coding", GENE_DIGEST)
    ]
    wire = preview.model_dump_json()
    texts = raw_texts(state_input())
    assert len(texts) == 6
    for text in texts:
        assert text not in wire
    flags = json.loads(wire)
    assert flags["raw_payload_exposed"] is False
    assert flags["read_only"] is flags["report_only"] is flags["preview_only"] is True


def test_routing_starts_with_the_runtime_profile_summary(digest_key: DigestKey) -> None:
    built = record(digest_key)
    runtime = planner.preview(built, 16).routing_inputs[0]
    assert runtime.evidence_digest == canonical_digest(
        built.runtime_profile.model_dump(mode="json")
    )
    assert runtime.profile is not None
    assert runtime.profile.model_dump() == {
        "task_profile": "coding",
        "model_id": "qwen2.5-coder:7b",
        "tokenizer": "qwen2",
        "context_window": 4096,
        "max_tokens": 512,
        "streaming": True,
    }
    others = planner.preview(built, 16)
    assert all(item.profile is None for item in others.retrieval_inputs + others.gene_inputs)
    assert all(item.profile is None for item in others.routing_inputs[1:])


def test_each_list_is_capped_at_max_inputs(digest_key: DigestKey) -> None:
    built = record(
        digest_key,
        memory_anchors=anchors("memory", 4),
        retrieval_evidence=anchors("doc", 4),
        routing_evidence=anchors("route", 4),
        gene_anchors=anchors("gene", 4),
    )
    preview = planner.preview(built, 3)
    assert [i.anchor_id for i in preview.retrieval_inputs] == ["memory:0", "memory:1", "memory:2"]
    assert [i.anchor_id for i in preview.routing_inputs] == [
        "runtime_profile",
        "route:0",
        "route:1",
    ]
    assert [i.anchor_id for i in preview.gene_inputs] == ["gene:0", "gene:1", "gene:2"]
    wider = planner.preview(built, 6)
    assert [i.anchor_id for i in wider.retrieval_inputs][3:] == ["memory:3", "doc:0", "doc:1"]
    single = planner.preview(built, 1)
    assert [i.anchor_id for i in single.routing_inputs] == ["runtime_profile"]


def test_max_inputs_out_of_bounds_is_refused(digest_key: DigestKey) -> None:
    built = record(digest_key)
    for max_inputs in (0, 257):
        with pytest.raises(ValueError):
            planner.preview(built, max_inputs)


def test_evidence_digest_covers_the_three_lists(digest_key: DigestKey) -> None:
    preview = planner.preview(record(digest_key), 16)
    lists = preview.model_dump(
        mode="json", include={"retrieval_inputs", "routing_inputs", "gene_inputs"}
    )
    assert preview.evidence_digest == canonical_digest(lists)


def test_evidence_digest_is_stable(digest_key: DigestKey) -> None:
    first = planner.preview(record(digest_key), 16).evidence_digest
    assert first is not None
    assert planner.preview(record(digest_key), 16).evidence_digest == first


@pytest.mark.parametrize(
    "change",
    [
        {"memory_anchors": [{"anchor_id": "memory:active", "evidence": "user prefers Go"}]},
        {"retrieval_evidence": [{"anchor_id": "doc:other", "evidence": "the borrow checker"}]},
        {"routing_evidence": [{"anchor_id": "route:coder", "evidence": "writing intent"}]},
        {
            "gene_anchors": [
                {"anchor_id": "gene:go-coding", "evidence_digest": "sha256:" + "cd" * 32}
            ]
        },
        {"runtime_profile": {**state_input()["runtime_profile"], "max_tokens": 256}},
        {"runtime_profile": {**state_input()["runtime_profile"], "cancellation_anchor": "halt"}},
    ],
)
def test_evidence_digest_changes_when_an_input_changes(
    digest_key: DigestKey, change: dict[str, Any]
) -> None:
    before = planner.preview(record(digest_key), 16).evidence_digest
    assert planner.preview(record(digest_key, **change), 16).evidence_digest != before


def test_turns_and_traces_are_no_replay_inputs(digest_key: DigestKey) -> None:
    before = planner.preview(record(digest_key), 16)
    changed = record(
        digest_key,
        turns=[{"turn_id": "turn-9", "role": "user", "payload": "something else"}],
        source_trace_ids=["trace:other"],
    )
    after = planner.preview(changed, 16)
    assert after.model_dump(exclude={"history"}) == before.model_dump(exclude={"history"})
    assert after.history is not None and after.history.kept_turns == 1  # reported, not input


def test_the_preview_reports_the_kept_turns_and_the_summary(digest_key: DigestKey) -> None:
    turns = [
        {"turn_id": f"turn-{n}", "role": "user", "payload_digest": GENE_DIGEST, "token_estimate": n}
        for n in range(20)
    ]
    state = SessionStateInput.model_validate(state_input(turns=turns))
    long = build_record(scope(), state, digest_key, turns_kept=16)
    history = planner.preview(long, 16).history
    assert history is not None
    assert history.model_dump() == {
        "kept_turns": 16,
        "kept_token_estimate": sum(range(4, 20)),
        "compacted_turns": 4,
        "compacted_token_estimate": sum(range(4)),
        "compacted_digest": long.summary.digest,
    }


def test_blocked_preview_has_reasons_and_no_inputs() -> None:
    preview = SessionReplayPlanner.blocked(
        ["session_replay_cross_tenant_rejected", "role_not_permitted", "role_not_permitted"]
    )
    assert preview.model_dump() == {
        "allowed": False,
        "retrieval_inputs": [],
        "routing_inputs": [],
        "gene_inputs": [],
        "evidence_digest": None,
        "blocked_reasons": ["role_not_permitted", "session_replay_cross_tenant_rejected"],
        "history": None,
        "raw_payload_exposed": False,
        "read_only": True,
        "report_only": True,
        "preview_only": True,
    }


def test_replay_request_defaults_to_sixteen_inputs() -> None:
    assert ReplayPreviewRequest.model_validate({}).max_inputs == 16
    assert ReplayPreviewRequest(max_inputs=1).max_inputs == 1
    assert ReplayPreviewRequest(max_inputs=256).max_inputs == 256


@pytest.mark.parametrize("body", [{"max_inputs": 0}, {"max_inputs": 257}, {"max_input": 4}])
def test_replay_request_bounds(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ReplayPreviewRequest.model_validate(body)
