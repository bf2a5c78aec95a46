"""Replay inputs planned here, from a sanitized record: the service's own planner, again.

`ModelServiceSession.replay()` asks the service for the replay preview of the
stored record; with nothing stored (a new or preview-only session) it asks
for a preview of the state held and plans the replay inputs from that
sanitized record here, exactly as the service plans them (the same inputs,
the same `evidence_digest`; `tests/client/test_client_contract.py` compares them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from sessionstate_client.models import (
    ReplayHistory,
    ReplayInput,
    RuntimeProfileSummary,
    SessionReplayPreview,
    SessionRuntimeProfile,
    SessionStateAnchor,
    SessionStateRecord,
)

DEFAULT_REPLAY_INPUTS = 16
MAX_REPLAY_INPUTS = 256
RUNTIME_PROFILE_ANCHOR_ID = "runtime_profile"
_MAX_EXACT = 2**53 - 1


def plan_replay(record: SessionStateRecord, max_inputs: int) -> SessionReplayPreview:
    """The replay inputs of record, each list capped at max_inputs."""
    if not 1 <= max_inputs <= MAX_REPLAY_INPUTS:
        raise ValueError(f"max_inputs must be 1..{MAX_REPLAY_INPUTS}")
    retrieval = _from_anchors([*record.memory_anchors, *record.retrieval_evidence])
    routing = [
        _from_runtime_profile(record.runtime_profile),
        *_from_anchors(record.routing_evidence),
    ]
    gene = _from_anchors(record.gene_anchors)
    lists = {
        "retrieval_inputs": retrieval[:max_inputs],
        "routing_inputs": routing[:max_inputs],
        "gene_inputs": gene[:max_inputs],
    }
    digest = canonical_digest(
        {name: [item.model_dump(mode="json") for item in items] for name, items in lists.items()}
    )
    summary = record.summary
    history = ReplayHistory(
        kept_turns=len(record.turns),
        kept_token_estimate=sum(turn.token_estimate for turn in record.turns),
        compacted_turns=summary.count,
        compacted_token_estimate=summary.token_estimate,
        compacted_digest=summary.digest,
    )
    return SessionReplayPreview(
        allowed=True,
        **lists,
        evidence_digest=digest,
        blocked_reasons=[],
        history=history,
    )


def canonical_digest(value: Any) -> str:
    """`sha256:<hex>` of value's RFC 8785 canonical JSON.

    Only for values whose canonical form is Python's compact, key-sorted JSON:
    strings, booleans, null, integers in JSON's exact range, lists and objects
    with ASCII keys (no floats). Anything else raises `ValueError`.
    """
    _check_plain(value)
    encoded = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(encoded.encode("utf-8")).hexdigest()


def _check_plain(value: Any) -> None:
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return
    if kind is int and -_MAX_EXACT <= value <= _MAX_EXACT:
        return
    if kind is list:
        for item in value:
            _check_plain(item)
        return
    if kind is dict and all(type(key) is str and key.isascii() for key in value):
        for item in value.values():
            _check_plain(item)
        return
    raise ValueError("not a value this canonical encoding covers")


def _from_anchors(anchors: Iterable[SessionStateAnchor]) -> list[ReplayInput]:
    # Anchor kinds of a record's lists are exactly the replay kinds (the service checks).
    return [ReplayInput.model_validate(anchor.model_dump(mode="json")) for anchor in anchors]


def _from_runtime_profile(profile: SessionRuntimeProfile) -> ReplayInput:
    return ReplayInput(
        kind="runtime_profile",
        anchor_id=RUNTIME_PROFILE_ANCHOR_ID,
        evidence_digest=canonical_digest(profile.model_dump(mode="json")),
        profile=RuntimeProfileSummary.model_validate(
            profile.model_dump(exclude={"cancellation_anchor_digest"})
        ),
    )
