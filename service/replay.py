"""`SessionReplayPlanner`: what a replay of a session would feed the model, from digests only.

The replay preview (docs/api.md): retrieval inputs come from memory-chain and
retrieval anchors, routing inputs from the runtime profile and routing anchors,
gene inputs from gene-chain anchors. Beside them it reports the history the
record holds: the kept turns and the summary of the compacted ones (counts
and token estimates), so a model service can budget its context without
fetching the record. The planner works on a record already read
(and authorised) by the caller; it never touches a store and, since a record
holds no raw text, can emit none. A blocked preview carries reasons and no
inputs at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from store.canonical import canonical_digest
from store.digests import Digest
from store.record.bounds import JsonInt
from store.record.inputs import TaskProfile
from store.record.state_record import (
    SessionRuntimeProfile,
    SessionStateAnchor,
    SessionStateRecord,
    Sha256Digest,
)

DEFAULT_REPLAY_INPUTS = 16
MAX_REPLAY_INPUTS = 256
RUNTIME_PROFILE_ANCHOR_ID = "runtime_profile"

ReplayInputKind = Literal["memory_chain", "retrieval", "routing", "gene_chain", "runtime_profile"]


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReplayPreviewRequest(_Shape):
    """What a model service posts to preview a replay."""

    model_config = ConfigDict(strict=True, hide_input_in_errors=True)  # merged with `_Shape`'s

    max_inputs: JsonInt = Field(
        DEFAULT_REPLAY_INPUTS, ge=1, le=MAX_REPLAY_INPUTS, description="cap on each list of inputs"
    )


class RuntimeProfileSummary(_Shape):
    """The runtime profile's metadata a router reads (its cancellation digest is no input)."""

    task_profile: TaskProfile
    model_id: str
    tokenizer: str
    context_window: int
    max_tokens: int
    streaming: bool


class ReplayInput(_Shape):
    """One input to a replay: where it comes from and the digest of its evidence."""

    kind: ReplayInputKind
    anchor_id: str
    evidence_digest: Digest
    profile: RuntimeProfileSummary | None = None

    @model_validator(mode="after")
    def _profile_only_on_runtime_profile(self) -> ReplayInput:
        if (self.profile is not None) != (self.kind == "runtime_profile"):
            raise ValueError("profile is set on the runtime_profile input and no other")
        return self


class ReplayHistory(_Shape):
    """The turns behind a replay: those the record keeps, and the summary of older ones."""

    kept_turns: int = Field(ge=0, description="turns the record keeps (its newest)")
    kept_token_estimate: int = Field(ge=0)
    compacted_turns: int = Field(ge=0, description="older turns, summarised")
    compacted_token_estimate: int = Field(ge=0)
    compacted_digest: Sha256Digest = Field(description="the summary's hash chain over them")


class SessionReplayPreview(_Shape):
    """The replay preview of docs/api.md: inputs and their combined digest, or why there are none."""

    allowed: bool
    retrieval_inputs: list[ReplayInput]
    routing_inputs: list[ReplayInput]
    gene_inputs: list[ReplayInput]
    evidence_digest: Digest | None = Field(description="digest of the three lists; None if blocked")
    blocked_reasons: list[str]
    history: ReplayHistory | None = Field(description="the record's turns; None if blocked")
    raw_payload_exposed: Literal[False] = False
    read_only: Literal[True] = True
    report_only: Literal[True] = True
    preview_only: Literal[True] = True


class SessionReplayPlanner:
    """Plans replay previews from sanitized records. Stateless and read-only."""

    def preview(self, record: SessionStateRecord, max_inputs: int) -> SessionReplayPreview:
        """The replay inputs of record, each list capped at max_inputs."""
        if not 1 <= max_inputs <= MAX_REPLAY_INPUTS:
            raise ValueError(f"max_inputs must be 1..{MAX_REPLAY_INPUTS}")
        retrieval = _from_anchors([*record.memory_anchors, *record.retrieval_evidence])
        routing = [_from_runtime_profile(record.runtime_profile)]
        routing += _from_anchors(record.routing_evidence)
        gene = _from_anchors(record.gene_anchors)
        return _allowed(
            retrieval[:max_inputs], routing[:max_inputs], gene[:max_inputs], _history(record)
        )

    @staticmethod
    def blocked(reasons: Sequence[str]) -> SessionReplayPreview:
        """A refused preview: no inputs at all, only the reasons (sorted, each once)."""
        return SessionReplayPreview(
            allowed=False,
            retrieval_inputs=[],
            routing_inputs=[],
            gene_inputs=[],
            evidence_digest=None,
            blocked_reasons=sorted(set(reasons)),
            history=None,
        )


def _allowed(
    retrieval: list[ReplayInput],
    routing: list[ReplayInput],
    gene: list[ReplayInput],
    history: ReplayHistory,
) -> SessionReplayPreview:
    lists = {"retrieval_inputs": retrieval, "routing_inputs": routing, "gene_inputs": gene}
    digest = canonical_digest(
        {name: [item.model_dump(mode="json") for item in items] for name, items in lists.items()}
    )
    return SessionReplayPreview(
        allowed=True,
        retrieval_inputs=retrieval,
        routing_inputs=routing,
        gene_inputs=gene,
        evidence_digest=digest,
        blocked_reasons=[],
        history=history,
    )


def _history(record: SessionStateRecord) -> ReplayHistory:
    summary = record.summary
    return ReplayHistory(
        kept_turns=len(record.turns),
        kept_token_estimate=sum(turn.token_estimate for turn in record.turns),
        compacted_turns=summary.count,
        compacted_token_estimate=summary.token_estimate,
        compacted_digest=summary.digest,
    )


def _from_anchors(anchors: Iterable[SessionStateAnchor]) -> list[ReplayInput]:
    # Anchor kinds of a record's lists are exactly the replay kinds (the record checks).
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
