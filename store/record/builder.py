"""Building a `SessionStateRecord` from a `SessionStateInput`.

Every raw text is digested under the digest key here and goes no further.
Exact duplicates of an anchor or turn collapse to the first; two entries with
the same id but different content are an input error, never a silent pick.
Turns beyond the window (`turns_kept`) are compacted into the summary the
record is based on (`store.record.compaction`); the caller never supplies a summary.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TypeVar

from store.canonical import canonical_digest
from store.digests import DigestKey
from store.record.bounds import DEFAULT_TURNS_KEPT
from store.record.compaction import compact
from store.record.inputs import SessionStateAnchorInput, SessionStateInput, SessionTurnInput
from store.record.state_record import (
    ANCHOR_LISTS,
    NO_COMPACTED_TURNS,
    RECORD_SCHEMA,
    AnchorKind,
    CompactedTurns,
    Lineage,
    SessionRuntimeProfile,
    SessionStateAnchor,
    SessionStateRecord,
    SessionTurnDigest,
    compute_state_digest,
)
from store.record.violations import FieldViolation, InputRejected
from store.scope import TenantScope

T = TypeVar("T")


def build_record(
    scope: TenantScope,
    state: SessionStateInput,
    key: DigestKey,
    *,
    compacted: CompactedTurns = NO_COMPACTED_TURNS,
    turns_kept: int = DEFAULT_TURNS_KEPT,
    lineage: Lineage | None = None,
) -> SessionStateRecord:
    """The sanitized record for scope: digests and bounded metadata only.

    `compacted` is the summary of the stored version this record replaces; the
    oldest turns beyond `turns_kept` extend it, in order. `lineage` is that version's
    (a forked session keeps where it came from).
    """
    violations: list[FieldViolation] = []
    profile = state.runtime_profile
    runtime_profile = SessionRuntimeProfile(
        task_profile=profile.task_profile,
        model_id=profile.model_id,
        tokenizer=profile.tokenizer,
        context_window=profile.context_window,
        max_tokens=profile.max_tokens,
        streaming=profile.streaming,
        cancellation_anchor_digest=(
            None
            if profile.cancellation_anchor is None
            else key.digest_text(profile.cancellation_anchor)
        ),
    )
    anchors = {
        list_name: _collapse(
            list_name,
            [_anchor(kind, item, key) for item in getattr(state, list_name)],
            lambda anchor: anchor.anchor_id,
            "anchor_id",
            violations,
        )
        for list_name, kind in ANCHOR_LISTS.items()
    }
    turns = _collapse(
        "turns",
        [_turn(item, key) for item in state.turns],
        lambda turn: turn.turn_id,
        "turn_id",
        violations,
    )
    if violations:
        raise InputRejected(violations)
    summary, kept = compact(compacted, turns, turns_kept)
    content = SessionStateRecord.model_construct(
        schema_=RECORD_SCHEMA,
        state_id=state.state_id or default_state_id(scope),
        scope=scope,
        runtime_profile=runtime_profile,
        memory_anchors=anchors["memory_anchors"],
        gene_anchors=anchors["gene_anchors"],
        retrieval_evidence=anchors["retrieval_evidence"],
        routing_evidence=anchors["routing_evidence"],
        turns=kept,
        compacted_turns=summary,
        source_trace_ids=list(dict.fromkeys(state.source_trace_ids)),
        lineage=lineage,
        raw_messages_stored=False,
        read_only=True,
        report_only=True,
        preview_only=True,
        write_allowed=False,
        state_digest="",  # not part of the content it is computed over
    ).content()
    return SessionStateRecord.model_validate_json(_json_with_digest(content), strict=True)


def default_state_id(scope: TenantScope) -> str:
    """A stable id per scope, so that a preview and the write after it agree."""
    return "state-" + canonical_digest(scope.model_dump())[len("sha256:") :][:32]


def estimate_tokens(text: str) -> int:
    """A rough token count (4 UTF-8 bytes a token), kept as bounded metadata."""
    size = len(text.encode("utf-8", "surrogatepass"))
    return (size + 3) // 4


def _anchor(kind: AnchorKind, item: SessionStateAnchorInput, key: DigestKey) -> SessionStateAnchor:
    digest = item.evidence_digest if item.evidence is None else key.digest_text(item.evidence)
    assert digest is not None  # exactly one of the two is set (input validation)
    return SessionStateAnchor(kind=kind, anchor_id=item.anchor_id, evidence_digest=digest)


def _turn(item: SessionTurnInput, key: DigestKey) -> SessionTurnDigest:
    if item.payload is None:
        assert item.payload_digest is not None
        digest, estimate = item.payload_digest, item.token_estimate or 0
    else:
        digest = key.digest_text(item.payload)
        estimate = (
            item.token_estimate
            if item.token_estimate is not None
            else estimate_tokens(item.payload)
        )
    return SessionTurnDigest(
        turn_id=item.turn_id, role=item.role, payload_digest=digest, token_estimate=estimate
    )


def _collapse(
    list_name: str,
    items: Sequence[T],
    id_of: Callable[[T], str],
    id_field: str,
    violations: list[FieldViolation],
) -> list[T]:
    kept: dict[str, T] = {}
    for index, item in enumerate(items):
        first = kept.setdefault(id_of(item), item)
        if first != item:
            violations.append(FieldViolation((list_name, index, id_field), "duplicate_id_conflict"))
    return list(kept.values())


def _json_with_digest(content: dict[str, object]) -> str:
    return json.dumps({**content, "state_digest": compute_state_digest(content)})
