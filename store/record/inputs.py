"""What a model service sends: `SessionStateInput`, with raw text still in it.

Validation lives here (bounds, patterns, exactly-one-of); nothing downstream
re-checks by hand. Raw text fields are excluded from repr so that a stray log
of a model never prints them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from store.digests import Digest
from store.record.bounds import (
    MAX_ANCHORS_PER_LIST,
    MAX_CONTEXT_WINDOW,
    MAX_SOURCE_TRACE_IDS,
    MAX_TOKEN_ESTIMATE,
    MAX_TURNS_PER_WRITE,
    Identifier,
    JsonInt,
    RawText,
    exactly_one_of,
    integral_number,
)

TaskProfile = Literal["general", "coding", "writing", "long_document"]
TurnRole = Literal["user", "assistant", "tool", "system"]


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, hide_input_in_errors=True)


def _exactly_one(raw: object, digest: object, raw_name: str, digest_name: str) -> None:
    if (raw is None) == (digest is None):
        raise PydanticCustomError(
            "exactly_one_of",
            "exactly one of {fields} is required",
            {"fields": f"{raw_name}, {digest_name}"},
        )


class SessionRuntimeProfileInput(_Input):
    """How the model runs. `max_tokens` must not exceed `context_window`."""

    task_profile: TaskProfile
    model_id: Identifier
    tokenizer: Identifier
    context_window: JsonInt = Field(ge=1, le=MAX_CONTEXT_WINDOW)
    max_tokens: JsonInt = Field(ge=1, le=MAX_CONTEXT_WINDOW)
    streaming: bool
    cancellation_anchor: RawText | None = Field(default=None, repr=False)

    @model_validator(mode="after")
    def _max_tokens_fit(self) -> SessionRuntimeProfileInput:
        if self.max_tokens > self.context_window:
            raise PydanticCustomError(
                "max_tokens_exceeds_context_window", "max_tokens must not exceed context_window"
            )
        return self


class SessionStateAnchorInput(_Input):
    model_config = ConfigDict(json_schema_extra=exactly_one_of("evidence", "evidence_digest"))

    anchor_id: Identifier
    evidence: RawText | None = Field(default=None, repr=False)
    evidence_digest: Digest | None = None

    @model_validator(mode="after")
    def _one_evidence(self) -> SessionStateAnchorInput:
        _exactly_one(self.evidence, self.evidence_digest, "evidence", "evidence_digest")
        return self


class SessionTurnInput(_Input):
    model_config = ConfigDict(json_schema_extra=exactly_one_of("payload", "payload_digest"))

    turn_id: Identifier
    role: TurnRole
    payload: RawText | None = Field(default=None, repr=False)
    payload_digest: Digest | None = None
    # Bounds before the validator: that order keeps them `minimum`/`maximum` in the schema.
    token_estimate: (
        Annotated[int, Field(ge=0, le=MAX_TOKEN_ESTIMATE), BeforeValidator(integral_number)] | None
    ) = None

    @model_validator(mode="after")
    def _one_payload(self) -> SessionTurnInput:
        _exactly_one(self.payload, self.payload_digest, "payload", "payload_digest")
        return self


AnchorList = list[SessionStateAnchorInput]


class SessionStateInput(_Input):
    """A model service's view of a session's state, before sanitizing.

    Raw text (`payload`, `evidence`, `cancellation_anchor`) is digested and dropped.
    Exact duplicates of an anchor id (per list) or a turn id collapse to one; the
    same id with different content is refused (`duplicate_id_conflict`). There is
    no summary of compacted turns here: only the service makes one.
    """

    state_id: Identifier | None = None
    runtime_profile: SessionRuntimeProfileInput
    memory_anchors: AnchorList = Field(default_factory=list, max_length=MAX_ANCHORS_PER_LIST)
    gene_anchors: AnchorList = Field(default_factory=list, max_length=MAX_ANCHORS_PER_LIST)
    retrieval_evidence: AnchorList = Field(default_factory=list, max_length=MAX_ANCHORS_PER_LIST)
    routing_evidence: AnchorList = Field(default_factory=list, max_length=MAX_ANCHORS_PER_LIST)
    turns: list[SessionTurnInput] = Field(
        default_factory=list,
        max_length=MAX_TURNS_PER_WRITE,
        description=(
            "oldest first: the turns the stored record keeps, then the new ones; the service "
            "folds the oldest beyond its window into the record's compacted_turns"
        ),
    )
    source_trace_ids: list[Identifier] = Field(
        default_factory=list, max_length=MAX_SOURCE_TRACE_IDS
    )
