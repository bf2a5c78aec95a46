"""Which policy decided when: a small summary per tenant and policy revision.

For each chain (tenant) and each policy revision OPA decided with, one key in
the `trace_meta` lane holds the first and last decision time (`evaluated_at`),
the count of decisions by action, and the count of decisions that failed while
it was live (OPA gave no answer, or refused the service: the entry names the
revision `unknown`; they count under the revision live on the instance then,
`service.decisions.live`). The journal updates it in the same batch as the
entries it counts (`SummaryCache.updates`), so a reader gets the list from a few keys
instead of a walk of the log. The summary keeps what was decided: entries pruned
by retention later still count. Rate limit summaries (the service decided
them) are not counted.

A reader gets each revision's summary beside its live intervals on the
deployment and its activations (`RevisionReport`, `service.decisions.activations`:
which set went live when, how and by whom, the same for every tenant); a
revision that was live or activated but decided nothing for the tenant is
listed with no decisions.

A store written before the summaries existed is summarised by `sessionstate db
upgrade` (`rebuild`), chain by chain, from the entries it still holds (a failed
decision counts under the revision whose live interval holds its time); until
then `complete` is false. A new store is complete from its start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.api.reasons import Reason
from service.decisions import activations
from service.decisions.activations import ActivationRecord
from service.decisions.live import LiveInterval, fits, live_at, stored
from service.decisions.log import DecisionEntryBody
from service.policy.client import UNKNOWN
from store.backends.contract import ExpectationFailed, LaneBatch, Lanes
from store.canonical import canonical_json
from store.chain.entry import parse_entry
from store.chain.evidence import EvidenceChain
from store.chain.keys import LEGACY_CHAIN, chain_names, entry_key, marker_key, tenant_chain_names
from store.key_codec import LaneKey, TenantResourceLane

_PREFIX = b"revision:"
SUMMARIES_COMPLETE = LaneKey(
    TenantResourceLane.TRACE_META, LEGACY_CHAIN, name=b"revisions_complete"
)
REBUILD_ATTEMPTS = 5


_FAILED = (
    "decisions that failed while it was live: OPA gave no answer or refused the service (the "
    "entry names the revision `unknown`), or the policies gave no decision "
    "(policy_decision_undefined)"
)


class RevisionSummary(BaseModel):
    """One policy revision's decisions on one tenant's chain."""

    model_config = ConfigDict(extra="forbid")

    policy_revision: str = Field(description="content hash of the policy set that decided")
    first_decided_at: str | None = Field(
        description="RFC 3339: its earliest decision (evaluated_at); null: it decided nothing"
    )
    last_decided_at: str | None = Field(description="RFC 3339: its latest decision")
    decisions: int = Field(ge=0, description="decisions it made (pruned entries included)")
    by_action: dict[str, int] = Field(description="decisions by action")
    failed: int = Field(default=0, ge=0, description=_FAILED)  # 0 in a summary stored before

    def add(self, action: str, evaluated_at: str) -> None:
        self.decisions += 1
        self.by_action[action] = self.by_action.get(action, 0) + 1
        moment = datetime.fromisoformat(evaluated_at)
        first, last = self.first_decided_at, self.last_decided_at
        if first is None or moment < datetime.fromisoformat(first):
            self.first_decided_at = evaluated_at
        if last is None or moment > datetime.fromisoformat(last):
            self.last_decided_at = evaluated_at

    @classmethod
    def empty(cls, revision: str) -> RevisionSummary:
        return cls(
            policy_revision=revision,
            first_decided_at=None,
            last_decided_at=None,
            decisions=0,
            by_action={},
        )


class RevisionReport(RevisionSummary):
    """A revision's decisions for the tenant, beside when it was live on the deployment."""

    failed: int = Field(ge=0, description=_FAILED)  # always there in an answer

    live: list[LiveInterval] = Field(
        description="when it was live, on each instance of the deployment, oldest first"
    )
    activations: list[ActivationRecord] = Field(
        description="each time the deployment made OPA decide with it (its entries on the "
        "`~system` chain), oldest first; empty for activations before they were recorded"
    )


def summary_key(chain: str, revision: str) -> LaneKey:
    return LaneKey(TenantResourceLane.TRACE_META, chain, name=_PREFIX + revision.encode())


def _counted(decision: Mapping[str, Any]) -> str | None:
    """The revision a decision counts for: the one OPA decided with, or for a failed one
    the one live then (`failed_under`); None for a rate limit summary and for an answer
    that named no revision."""
    engine = decision.get("engine") or {}
    if engine.get("name", "opa") != "opa":
        return None
    if _failed(decision):
        revision = decision.get("failed_under")
    elif (revision := decision.get("policy_revision")) == UNKNOWN:
        return None  # an answer that named no bundle revision: nothing to count it under
    if not isinstance(revision, str) or not fits(revision):
        return None
    return revision


def _failed(decision: Mapping[str, Any]) -> bool:
    """OPA made no decision: it did not answer, answered wrongly, refused the service, or the
    policies gave none."""
    reasons = decision.get("reasons") or ()
    return (
        Reason.POLICY_ENGINE_UNAVAILABLE.value in reasons
        or Reason.POLICY_ENGINE_REFUSED.value in reasons
        or Reason.POLICY_DECISION_UNDEFINED.value in reasons
    )


def _parsed(value: bytes | None) -> RevisionSummary | None:
    if value is None:
        return None
    try:
        return RevisionSummary.model_validate_json(value)
    except ValidationError:
        return None  # a damaged summary starts again from what follows; `db upgrade` rebuilds


def _summarised(
    decisions: Iterable[Mapping[str, Any]], known: Mapping[str, RevisionSummary | None]
) -> dict[str, RevisionSummary]:
    """The summaries of `known` (by revision) with decisions added."""
    summaries: dict[str, RevisionSummary] = {}
    for decision in decisions:
        revision = _counted(decision)
        if revision is None:
            continue
        if revision not in summaries:
            base = known.get(revision) or RevisionSummary.empty(revision)
            # A copy with its own counts: `known` may be a cache's, which must stay as read.
            summaries[revision] = base.model_copy(update={"by_action": dict(base.by_action)})
        if _failed(decision):
            summaries[revision].failed += 1
        else:
            summaries[revision].add(str(decision["action"]), str(decision["evaluated_at"]))
    return summaries


@dataclass(frozen=True)
class SummaryUpdate:
    """A batch's summary writes: each summary's new value, and what the commit expects each
    key to hold (as read)."""

    puts: list[tuple[LaneKey, bytes]]
    read: list[tuple[LaneKey, bytes | None]]

    def add_to(self, batch: LaneBatch) -> None:
        for key, as_read in self.read:
            batch.expect(key, as_read)
        for key, value in self.puts:
            batch.put(key, value)


class SummaryCache:
    """The journal's summaries as it last read or wrote them, as stored and as parsed; cleared
    when a commit lost a race or the store was reopened: another writer may have added to
    them. A stale one could not be written anyway: the commit expects each summary as read.
    Leaders of different chains use it at once (each only its own chain's keys), one batch
    of a chain at a time."""

    def __init__(self, lanes: Lanes, live: Callable[[], str | None] | None = None) -> None:
        self._lanes = lanes
        self._live = live  # the revision live now, under which a failed decision counts
        self._known: dict[bytes, tuple[bytes | None, RevisionSummary | None]] = {}
        # What `updates` staged for each key, until written (a failed batch's is staged again).
        self._staged: dict[bytes, RevisionSummary] = {}

    def clear(self) -> None:
        self._known.clear()
        self._staged.clear()

    def updates(self, bodies: Iterable[DecisionEntryBody]) -> SummaryUpdate:
        """The summary puts for a batch's entries, and what the commit expects each key to
        hold (as read), so a summary is never overwritten with a count that missed some."""
        by_chain: dict[str, list[dict[str, Any]]] = {}
        live: str | None = None
        for body in bodies:
            trace = body.decision  # the fields a summary reads, without a whole dump
            failed = trace.engine_unavailable
            if failed and live is None:
                live = (self._live() if self._live is not None else None) or UNKNOWN
            by_chain.setdefault(body.chain, []).append(
                {
                    "action": trace.action,
                    "evaluated_at": trace.evaluated_at,
                    "policy_revision": trace.policy_revision,
                    "engine": {"name": trace.engine.name},
                    "reasons": trace.reasons if failed else (),
                    "failed_under": live if failed else None,
                }
            )
        puts: list[tuple[LaneKey, bytes]] = []
        expected: list[tuple[LaneKey, bytes | None]] = []
        for chain, decisions in by_chain.items():
            known: dict[str, RevisionSummary | None] = {}
            for decision in decisions:
                revision = _counted(decision)
                if revision is not None and revision not in known:
                    key = summary_key(chain, revision)
                    stored, known[revision] = self._read(key)
                    expected.append((key, stored))
            for revision, summary in _summarised(decisions, known).items():
                key = summary_key(chain, revision)
                puts.append((key, canonical_json(summary.model_dump())))
                self._staged[key.encode()] = summary
        return SummaryUpdate(puts, expected)

    def written(self, update: SummaryUpdate) -> None:
        """The last `updates`' puts were committed: they are what the store holds now."""
        for key, value in update.puts:
            encoded = key.encode()
            staged = self._staged.pop(encoded, None)
            self._known[encoded] = (value, staged if staged is not None else _parsed(value))

    def _read(self, key: LaneKey) -> tuple[bytes | None, RevisionSummary | None]:
        encoded = key.encode()
        known = self._known.get(encoded)  # one lookup: another chain's may clear it meanwhile
        if known is None:
            stored = self._lanes.get(key)
            known = self._known[encoded] = (stored, _parsed(stored))
        return known


def revisions(lanes: Lanes, chain: str) -> list[RevisionReport]:
    """The chain's revision summaries, each with its live intervals on the deployment, and
    the revisions live without deciding for it; by the earliest of their first live moment
    and first decision, oldest first."""
    found = {
        summary.policy_revision: summary
        for key, value in lanes.scan(TenantResourceLane.TRACE_META, chain)
        if key.name.startswith(_PREFIX) and (summary := _parsed(value)) is not None
    }
    live = stored(lanes)
    activated = activations.by_revision(activations.stored(lanes))
    reports = [
        RevisionReport(
            **(found.get(revision) or RevisionSummary.empty(revision)).model_dump(),
            live=sorted(live.get(revision, []), key=lambda i: datetime.fromisoformat(i.from_)),
            activations=activated.get(revision, []),
        )
        for revision in found.keys() | live.keys() | activated.keys()
    ]
    return sorted(reports, key=lambda r: (_since(r), r.policy_revision))


def _since(report: RevisionReport) -> datetime:
    moments = [datetime.fromisoformat(i.from_) for i in report.live]
    moments.extend(datetime.fromisoformat(a.at) for a in report.activations)
    if report.first_decided_at is not None:
        moments.append(datetime.fromisoformat(report.first_decided_at))
    return min(moments, default=datetime.max.replace(tzinfo=UTC))


def complete(lanes: Lanes) -> bool:
    """Whether every chain's summaries cover its whole log (False until `db upgrade` on a
    store written before them)."""
    return lanes.get(SUMMARIES_COMPLETE) is not None


def mark_complete_if_empty(lanes: Lanes) -> bool:
    """A store with no decision yet has nothing to summarise: mark it complete. True when
    complete (already, or now)."""
    if complete(lanes):
        return True
    if tenant_chain_names(lanes):  # the `~system` chain's activations are never summarised
        return False
    lanes.put(SUMMARIES_COMPLETE, b"", sync=True)
    return True


def rebuild(lanes: Lanes) -> int:
    """Summarise every chain from the entries it holds, then mark the summaries complete
    (`sessionstate db upgrade`; safe to run again, and beside a running service: each
    chain's summaries are replaced only if no entry was appended meanwhile, else read again).
    How many summaries were written."""
    written = 0
    for chain in chain_names(lanes):
        written += _rebuild_chain(lanes, chain)
    lanes.put(SUMMARIES_COMPLETE, b"", sync=True)
    return written


def _rebuild_chain(lanes: Lanes, chain: str) -> int:
    for _ in range(REBUILD_ATTEMPTS):
        with lanes.exclusive(marker_key(chain)):
            head = EvidenceChain(lanes, chain).head()
            summaries = _summarised(_decisions(lanes, chain, head.seq, stored(lanes)), {})
            stale = [
                key
                for key, _ in lanes.scan(TenantResourceLane.TRACE_META, chain)
                if key.name.startswith(_PREFIX)
            ]
            try:
                with lanes.batch(sync=True) as batch:
                    batch.expect(entry_key(head.seq + 1, chain), None)
                    for key in stale:
                        batch.delete(key)
                    for revision, summary in summaries.items():
                        batch.put(
                            summary_key(chain, revision), canonical_json(summary.model_dump())
                        )
            except ExpectationFailed:
                continue
            return len(summaries)
    raise RuntimeError(f"the chain {chain} kept growing while its summaries were rebuilt")


def _decisions(
    lanes: Lanes, chain: str, until: int, live: dict[str, list[LiveInterval]]
) -> Iterator[Mapping[str, Any]]:
    """The chain's decisions; a failed one names the revision live at its time."""
    for _, stored_entry in EvidenceChain(lanes, chain).stored_entries(until_seq=until):
        entry = parse_entry(stored_entry)
        decision = None if entry is None else entry.get("decision")
        if isinstance(decision, dict) and "action" in decision and "evaluated_at" in decision:
            if _failed(decision):
                under = live_at(live, str(decision["evaluated_at"])) or UNKNOWN
                decision = {**decision, "failed_under": under}
            yield decision
