"""`SessionStateRecord`: the sanitized record, the only thing ever stored for a session."""

from __future__ import annotations

from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any

from pydantic import ConfigDict, Field, StringConstraints, model_validator
from pydantic_core import PydanticCustomError

from store.canonical import canonical_digest
from store.derived import DerivedOnce
from store.digests import Digest
from store.record.bounds import (
    MAX_ANCHORS_PER_LIST,
    MAX_CONTEXT_WINDOW,
    MAX_SAFE_INTEGER,
    MAX_SOURCE_TRACE_IDS,
    MAX_TOKEN_ESTIMATE,
    MAX_TURNS,
    Identifier,
)
from store.record.inputs import TaskProfile, TurnRole
from store.scope import ScopeId, TenantScope

RECORD_SCHEMA = "sessionstate.record.v2"
"""What every write produces: a record with `compacted_turns`."""
RECORD_SCHEMA_V1 = "sessionstate.record.v1"
"""Records written before compaction existed: no `compacted_turns`; they read as they are."""
RECORD_SCHEMAS = (RECORD_SCHEMA_V1, RECORD_SCHEMA)

GENESIS_DIGEST = "sha256:" + "0" * 64
"""The summary digest of no compacted turns: where the hash chain starts."""

Sha256Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]


class _Record(DerivedOnce):
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


class CompactedTurns(_Record):
    """The turns a record no longer keeps: how many, their token estimate, and a hash chain.

    `digest` starts at `GENESIS_DIGEST` and takes each compacted turn in order
    (see `store.record.compaction.chain_step`), so anyone holding the turns recomputes it.
    """

    count: int = Field(ge=0, le=MAX_SAFE_INTEGER)
    token_estimate: int = Field(ge=0, le=MAX_SAFE_INTEGER)
    digest: Sha256Digest


NO_COMPACTED_TURNS = CompactedTurns(count=0, token_estimate=0, digest=GENESIS_DIGEST)


def _present_when_set(schema: dict[str, Any]) -> None:
    """Absent (never null) on v1 records: the published schema says 'optional', not 'nullable'."""
    options = [option for option in schema.pop("anyOf") if option != {"type": "null"}]
    schema.update(options[0])
    schema.pop("default", None)


Anchors = list[SessionStateAnchor]


class ForkedFrom(_Record):
    """The session version a record was forked from: its scope, version and state digest."""

    tenant_id: ScopeId
    workspace_id: ScopeId
    session_id: ScopeId
    version: int = Field(ge=1, le=MAX_SAFE_INTEGER)
    state_digest: Digest


class Lineage(_Record):
    """Where a record came from, when it was not written from a model service's body."""

    forked_from: ForkedFrom


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
    compacted_turns: CompactedTurns | None = Field(
        default=None,
        description=(
            "the older turns the record no longer keeps in `turns` (always present in "
            f"{RECORD_SCHEMA}; absent in {RECORD_SCHEMA_V1} records)"
        ),
        exclude_if=lambda summary: summary is None,
        json_schema_extra=_present_when_set,
    )
    source_trace_ids: list[Identifier] = Field(max_length=MAX_SOURCE_TRACE_IDS)
    lineage: Lineage | None = Field(
        default=None,
        description="where a forked record was forked from (`POST .../fork`); absent on a "
        "record never forked, so its digest is what it always was",
        exclude_if=lambda lineage: lineage is None,
        json_schema_extra=_present_when_set,
    )
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

    @property
    def summary(self) -> CompactedTurns:
        """The compacted turns; a v1 record has none."""
        return NO_COMPACTED_TURNS if self.compacted_turns is None else self.compacted_turns

    def content(self) -> dict[str, Any]:
        """The record as JSON, without its `state_digest`: what the digest covers."""
        return self.model_dump(mode="json", exclude={"state_digest"})

    def computed_state_digest(self) -> str:
        """The digest of `content()`, computed once: a write checks it more than once."""
        return self._content_digest

    @cached_property
    def _content_digest(self) -> str:
        return compute_state_digest(self.content())

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def compute_state_digest(content: dict[str, Any]) -> str:
    """`sha256:` over the RFC 8785 canonical JSON of a record without `state_digest`."""
    return canonical_digest(content)
