"""The compliance decision log: what an entry holds, and where it is indexed.

Every decision the service makes becomes one entry of the evidence chain
(`store.chain`): the decision trace, who asked, for what, the full
policy input (which never holds raw text), and the outcome (HTTP status,
whether anything was applied). Each tenant's entries are a chain of their own
(`chain_name`: entries that name no tenant go on `NO_TENANT_CHAIN`), so a
tenant's listing is its chain. What the deployment records of itself (policy
activations, `SystemEntryBody`) goes on `SYSTEM_CHAIN`, which is no tenant's. The index by decision id lives in the
`trace_index` lane under the chain's name and is written in the same batch as
the entry: a decision id is only ever looked up within one tenant's chain.

An entry is a `DecisionEntryBody` from the moment a request builds it until
the journal gives it its outcome and the chain seals it; what the chain holds
reads back as a `DecisionLogEntry` (`service.decisions.reader`), which serializes
as exactly the members that were stored, so it hashes as it was hashed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime
from functools import cached_property
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    PrivateAttr,
    model_serializer,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema
from pydantic_core.core_schema import SerializerFunctionWrapHandler

from service.auth.tokens import Actor
from service.policy.client import EncodedInput
from service.policy.input import PolicyActor, PolicyTarget
from service.policy.shadow import ShadowDecision
from service.policy.trace import DecisionTrace
from store.backends.contract import Lanes
from store.canonical import Encoded
from store.chain.checkpoints import CheckpointSigner
from store.chain.evidence import EvidenceChain
from store.chain.head import SYSTEM_CHAIN
from store.chain.keys import chain_name, chain_names
from store.derived import DerivedOnce
from store.key_codec import LaneKey, TenantResourceLane


class DecisionOutcome(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    status: int = Field(ge=100, le=599, description="the HTTP status answered")
    applied: bool = Field(description="whether the request changed stored state")
    approval_id: str | None = Field(
        description="the approval an approval.grant or approval.revoke concerned; else null"
    )


class DecisionEntryBody(DerivedOnce):
    """An entry as a request builds it: before the journal dates it and gives it its outcome,
    and the chain seals it (seq, hashes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision: DecisionTrace
    actor: PolicyActor
    target: PolicyTarget
    input: dict[str, Any] = Field(description="what was decided on: the full policy input")
    shadow: ShadowDecision | None = None

    @property
    def chain(self) -> str:
        """The chain the entry goes on: its target tenant's, else `NO_TENANT_CHAIN`."""
        return chain_name(self.target.tenant_id)

    # The input as it was sent to OPA, encoded then (`entry_body`): kept while `input` is it.
    _input_encoded: Encoded | None = PrivateAttr(default=None)

    @cached_property
    def encoded_members(self) -> dict[str, Encoded]:
        """The entry's members as JSON, each with its canonical bytes: the only place the
        model becomes a dict. Made once (the journal asks in the request's thread, so the
        commit only seals); the input's bytes are those sent to OPA, when this is still
        the input they encode."""
        # An entry without a shadow has no `shadow` member at all, as before shadows existed.
        held = self._input_encoded
        if held is not None and held.value is not self.input:  # a copy with another input
            held = None
        excluded = ({"shadow"} if self.shadow is None else set()) | (
            {"input"} if held is not None else set()
        )
        document = self.model_dump(mode="json", exclude=excluded or None)
        members = {name: Encoded.of(value) for name, value in document.items()}
        if held is not None:
            members["input"] = held
        return members

    def sealable(self, outcome: DecisionOutcome, recorded_at: str) -> dict[str, Any]:
        """The entry's JSON for the chain to seal (`encoded_members` spares encoding it again)."""
        document = {name: member.value for name, member in self.encoded_members.items()}
        document["outcome"] = outcome.model_dump(mode="json")
        document["recorded_at"] = recorded_at
        return document


class SystemEntryBody(DecisionEntryBody):
    """An entry the deployment makes of itself (a policy activation): on `SYSTEM_CHAIN`,
    whatever it targets."""

    @property
    def chain(self) -> str:
        return SYSTEM_CHAIN


class LegacyLink(BaseModel):
    """Where a migrated entry was on the global chain: with the entry's other fields, the
    old entry can be rebuilt and its old hash checked against checkpoints kept before."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int = Field(ge=1)
    prev_hash: str
    hash: str


class DecisionLogEntry(BaseModel):
    """One link of the chain, exactly as stored: its members, and no other, hash to `hash`.

    A member the entry was stored without (`shadow`, `legacy`, `decision.trace_id`) is
    absent, not null; an entry edited in the store is shown as it was edited."""

    # An entry read from the chain (`as_stored`) serializes as the JSON it was read from,
    # member for member and value for value (a `latency_ms` of 2 stays 2), so it hashes as
    # it was hashed; the model is its wire shape, and what it is checked against. Its schema
    # is the validation one: a member without a value is absent, not null.
    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_mode_override="validation")

    seq: int = Field(ge=1)
    recorded_at: str = Field(description="RFC 3339, when the entry was committed")
    decision: DecisionTrace
    actor: PolicyActor
    target: PolicyTarget
    outcome: DecisionOutcome
    input: dict[str, Any] = Field(description="the full policy input: ids, flags, counts, digests")
    prev_hash: str
    hash: str
    shadow: ShadowDecision | None = Field(
        default=None,
        description="with a shadow policy set (SESSIONSTATE_SHADOW_POLICIES): what it would "
        "have decided, and whether it agrees with the decision; absent otherwise",
    )
    legacy: LegacyLink | None = Field(
        default=None,
        description="set on entries `sessionstate db upgrade` moved from the one global "
        "chain of older versions: where the entry was on it",
    )
    _stored: dict[str, Any] | None = PrivateAttr(default=None)

    @classmethod
    def as_stored(cls, stored: Mapping[str, Any]) -> DecisionLogEntry:
        """The entry the chain holds (raises `ValidationError` when it has not the shape of
        one), serializing as `stored`."""
        entry = cls.model_validate(stored)
        entry._stored = dict(stored)
        return entry

    @model_serializer(mode="wrap")
    def _serialize_as_stored(self, handler: SerializerFunctionWrapHandler) -> Any:
        return handler(self) if self._stored is None else self._stored

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """The fields' schema: what the entry serializes as (a stored entry of this shape),
        not the serializer's `Any`."""
        return handler({key: value for key, value in core_schema.items() if key != "serialization"})


def entry_body(
    trace: DecisionTrace,
    sent: EncodedInput,
    actor: Actor,
    shadow: ShadowDecision | None = None,
) -> DecisionEntryBody:
    """A decision OPA made, as an entry of the log (the outcome follows when it is known).
    Its input is the document sent to OPA, with the canonical bytes sent: encoded once."""
    body = DecisionEntryBody(
        decision=trace,
        actor=actor.to_policy(),
        target=sent.policy_input.target,
        input=sent.document,
        shadow=shadow,
    )
    body._input_encoded = Encoded(body.input, sent.encoded, sent.plain)
    return body


def seq_name(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def decision_id_key(chain: str, decision_id: str) -> LaneKey:
    """The index key of a decision id, under the chain (tenant) its entry is on."""
    return LaneKey(TenantResourceLane.TRACE_INDEX, chain, name=b"id:" + decision_id.encode())


def index_puts(body: DecisionEntryBody, seq: int) -> Iterator[tuple[LaneKey, bytes]]:
    """The index keys of entry seq of its chain: its decision id."""
    yield decision_id_key(body.chain, body.decision.decision_id), seq_name(seq)


def opa_event(entry: DecisionLogEntry) -> dict[str, Any]:
    """An entry in the field names of OPA's decision log events, where they overlap; the
    entry itself beside them, as stored (an entry read from the chain dumps as stored)."""
    decision = entry.decision
    event: dict[str, Any] = {
        "decision_id": decision.decision_id,
        "path": decision.policy + "/decision",
        "input": entry.input,
        "result": {"allow": decision.allow, "reasons": decision.reasons},
        "timestamp": decision.evaluated_at,
        "bundles": {"sessionstate": {"revision": decision.policy_revision}},
        "requested_by": entry.actor.sub,
        "labels": {"app": "sessionstate", "engine_version": decision.engine.version},
        "metrics": {"timer_server_handler_ns": int(decision.latency_ms * 1_000_000)},
        "sessionstate": entry.model_dump(mode="json"),
    }
    if decision.trace_id is not None:  # as OPA's own events carry it with tracing on
        event["trace_id"] = decision.trace_id
    return event


def prune_log(lanes: Lanes, before: datetime, signer: CheckpointSigner, now: datetime) -> int:
    """Retention: drop entries older than `before` from every chain, and their index keys.

    Each chain keeps an anchor (seq and hash of the last dropped entry, signed by
    `signer`, the checkpoint key, at `now`) in the same batch as its deletions, so
    what remains still verifies. Index keys of dropped entries are removed
    afterwards; until then they point at nothing and are skipped.
    """
    total = 0
    for name in chain_names(lanes):
        chain = EvidenceChain(lanes, name)
        pruned = chain.prune(before, signer, now)
        if not pruned:
            continue
        total += pruned
        last_dropped = chain.anchor().seq
        with lanes.batch(sync=True) as writes:
            for key, value in lanes.scan(TenantResourceLane.TRACE_INDEX, name):
                if key.name.startswith(b"id:") and int.from_bytes(value, "big") <= last_dropped:
                    writes.delete(key)
    return total
