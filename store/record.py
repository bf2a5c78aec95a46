"""`SessionStateRecord`: the sanitized record, the only thing ever stored for a session."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from store.bounds import (
    MAX_ANCHORS_PER_LIST,
    MAX_CONTEXT_WINDOW,
    MAX_SOURCE_TRACE_IDS,
    MAX_TOKEN_ESTIMATE,
    MAX_TURNS,
    Identifier,
)
from store.canonical import canonical_digest
from store.digests import Digest
from store.inputs import TaskProfile, TurnRole
from store.scope import TenantScope

RECORD_SCHEMA = "sessionstate.record.v1"


class _Record(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        hide_input_in_errors=True,
        serialize_by_alias=True,
        validate_by_name=True,
        validate_by_alias=True,
    )


class AnchorKind(StrEnum):
    MEMORY_CHAIN = "memory_chain"
    GENE_CHAIN = "gene_chain"
    RUNTIME_KV = "runtime_kv"
    EXPERIENCE = "experience"
    RETRIEVAL = "retrieval"
    ROUTING = "routing"


class SessionRuntimeProfile(_Record):
    task_profile: TaskProfile
    model_id: Identifier
    tokenizer: Identifier
    context_window: int = Field(ge=1, le=MAX_CONTEXT_WINDOW)
    max_tokens: int = Field(ge=1, le=MAX_CONTEXT_WINDOW)
    streaming: bool
    cancellation_anchor_digest: Digest | None = None


class SessionStateAnchor(_Record):
    kind: AnchorKind
    anchor_id: Identifier
    evidence_digest: Digest


class SessionTurnDigest(_Record):
    turn_id: Identifier
    role: TurnRole
    payload_digest: Digest
    token_estimate: int = Field(ge=0, le=MAX_TOKEN_ESTIMATE)


Anchors = list[SessionStateAnchor]

# Which anchor kind each list of the record holds.
ANCHOR_LISTS: dict[str, AnchorKind] = {
    "memory_anchors": AnchorKind.MEMORY_CHAIN,
    "gene_anchors": AnchorKind.GENE_CHAIN,
    "retrieval_evidence": AnchorKind.RETRIEVAL,
    "routing_evidence": AnchorKind.ROUTING,
}


class SessionStateRecord(_Record):
    """Digests and bounded metadata of a session; never raw text."""

    schema_: str = Field(alias="schema", max_length=64)
    state_id: Identifier
    scope: TenantScope
    runtime_profile: SessionRuntimeProfile
    memory_anchors: Anchors = Field(max_length=MAX_ANCHORS_PER_LIST)
    gene_anchors: Anchors = Field(max_length=MAX_ANCHORS_PER_LIST)
    retrieval_evidence: Anchors = Field(max_length=MAX_ANCHORS_PER_LIST)
    routing_evidence: Anchors = Field(max_length=MAX_ANCHORS_PER_LIST)
    turns: list[SessionTurnDigest] = Field(max_length=MAX_TURNS)
    source_trace_ids: list[Identifier] = Field(max_length=MAX_SOURCE_TRACE_IDS)
    raw_messages_stored: bool = False
    read_only: bool = True
    report_only: bool = True
    preview_only: bool = True
    write_allowed: bool = False
    state_digest: Digest

    @model_validator(mode="after")
    def _anchor_kinds_match_lists(self) -> SessionStateRecord:
        for list_name, kind in ANCHOR_LISTS.items():
            anchors: Anchors = getattr(self, list_name)
            if any(anchor.kind != kind for anchor in anchors):
                raise PydanticCustomError(
                    "anchor_kind_mismatch",
                    "anchors of {list} must be of kind {kind}",
                    {"list": list_name, "kind": kind.value},
                )
        return self

    def content(self) -> dict[str, Any]:
        """The record as JSON, without its `state_digest`: what the digest covers."""
        return self.model_dump(mode="json", exclude={"state_digest"})

    def computed_state_digest(self) -> str:
        return compute_state_digest(self.content())

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def compute_state_digest(content: dict[str, Any]) -> str:
    """`sha256:` over the RFC 8785 canonical JSON of a record without `state_digest`."""
    return canonical_digest(content)
