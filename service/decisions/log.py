"""The compliance decision log: what an entry holds, and where it is indexed.

Every decision the service makes becomes one entry of the evidence chain
(`store.evidence_chain`): the decision trace, who asked, for what, the full
policy input (which never holds raw text), and the outcome (HTTP status,
whether anything was applied). Indexes by tenant and by decision id live in
the `trace_index` lane and are written in the same batch as the entry.

An entry is a `DecisionEntryBody` from the moment a request builds it until
the journal gives it its outcome and the chain seals it; what the chain holds
reads back as a `DecisionLogEntry` (`service.decisions.reader`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.auth import Actor
from service.policy.input import PolicyActor, PolicyInput, PolicyTarget
from service.policy.trace import DecisionTrace
from store.evidence_chain import EvidenceChain
from store.keys import LaneKey, TenantResourceLane
from store.lanes import LaneStore

UNSCOPED = "-"  # index tenant of entries that name no tenant (cannot happen today; kept total)


class DecisionOutcome(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    status: int = Field(ge=100, le=599, description="the HTTP status answered")
    applied: bool = Field(description="whether the request changed stored state")
    approval_id: str | None = Field(
        description="the approval an approval.grant or approval.revoke concerned; else null"
    )


class DecisionEntryBody(BaseModel):
    """An entry as a request builds it: before the journal dates it and gives it its outcome,
    and the chain seals it (seq, hashes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision: DecisionTrace
    actor: PolicyActor
    target: PolicyTarget
    input: dict[str, Any] = Field(description="what was decided on: the full policy input")

    def sealable(self, outcome: DecisionOutcome, recorded_at: str) -> dict[str, Any]:
        """The entry's JSON for the chain to seal: the only place the model becomes a dict."""
        document = self.model_dump(mode="json")
        document["outcome"] = outcome.model_dump(mode="json")
        document["recorded_at"] = recorded_at
        return document


class DecisionLogEntry(BaseModel):
    """One link of the chain, as stored, listed and verified."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int = Field(ge=1)
    recorded_at: str = Field(description="RFC 3339, when the entry was committed")
    decision: DecisionTrace
    actor: PolicyActor
    target: PolicyTarget
    outcome: DecisionOutcome
    input: dict[str, Any] = Field(description="the full policy input: ids, flags, counts, digests")
    prev_hash: str
    hash: str


def entry_body(trace: DecisionTrace, policy_input: PolicyInput, actor: Actor) -> DecisionEntryBody:
    """A decision OPA made, as an entry of the log (the outcome follows when it is known)."""
    return DecisionEntryBody(
        decision=trace,
        actor=actor.to_policy(),
        target=policy_input.target,
        input=policy_input.model_dump(mode="json", by_alias=True),
    )


def seq_name(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def tenant_index_key(tenant_id: str | None, seq: int) -> LaneKey:
    return LaneKey(TenantResourceLane.TRACE_INDEX, tenant_id or UNSCOPED, name=seq_name(seq))


def decision_id_key(decision_id: str) -> LaneKey:
    return LaneKey(TenantResourceLane.TRACE_INDEX, name=b"id:" + decision_id.encode())


def index_puts(body: DecisionEntryBody, seq: int) -> Iterator[tuple[LaneKey, bytes]]:
    """The index keys of entry seq: its tenant's listing, and its decision id."""
    yield tenant_index_key(body.target.tenant_id, seq), b""
    yield decision_id_key(body.decision.decision_id), seq_name(seq)


def opa_event(entry: DecisionLogEntry, as_stored: Mapping[str, Any]) -> dict[str, Any]:
    """An entry in the field names of OPA's decision log events, where they overlap; the
    entry itself beside them, as stored."""
    decision = entry.decision
    return {
        "decision_id": decision.decision_id,
        "path": decision.policy + "/decision",
        "input": entry.input,
        "result": {"allow": decision.allow, "reasons": decision.reasons},
        "timestamp": decision.evaluated_at,
        "bundles": {"sessionstate": {"revision": decision.policy_revision}},
        "requested_by": entry.actor.sub,
        "labels": {"app": "sessionstate", "engine_version": decision.engine.version},
        "metrics": {"timer_server_handler_ns": int(decision.latency_ms * 1_000_000)},
        "sessionstate": as_stored,
    }


def prune_log(lanes: LaneStore, before: datetime) -> int:
    """Retention: drop entries older than `before` and their index keys.

    The chain keeps an anchor (seq and hash of the last dropped entry) in the
    same batch as the deletions, so what remains still verifies. Index keys of
    dropped entries are removed afterwards; until then they point at nothing
    and are skipped.
    """
    chain = EvidenceChain(lanes)
    pruned = chain.prune(before)
    if pruned:
        last_dropped = chain.anchor().seq
        with lanes.batch(sync=True) as writes:
            for key, value in lanes.scan(TenantResourceLane.TRACE_INDEX):
                seq_bytes = value if key.name.startswith(b"id:") else key.name
                if int.from_bytes(seq_bytes, "big") <= last_dropped:
                    writes.delete(key)
    return pruned
