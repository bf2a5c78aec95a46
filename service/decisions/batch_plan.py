"""`BatchPlan`: one group commit's batch, decided and sealed, with every write it makes.

The journal's leader takes the entries queued on its line (`QueuedEntry`) and
plans them in order (`plan_batch`): each durable write is decided by its
precondition against the state as the batch leaves it (`RecordWrites`), each
entry gets its outcome and is sealed onto its chain after the head the journal
knows (`ChainExtension`), and the plan carries what else the decisions write:
the keys they changed (an approval granted or revoked, an activation) with the
entries' indexes (`KeyChanges`), and the policy revisions' summaries
(`SummaryUpdate`). `BatchPlan.add_to` puts all of it in one store batch, with
what its commit expects; after a lost race the batch is planned again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import SpanContext

from service.decisions.log import DecisionEntryBody, DecisionOutcome, index_puts
from service.decisions.record_writes import RecordWrites, StateErase, StateWrite
from service.decisions.revisions import SummaryCache, SummaryUpdate
from store.backends.contract import LaneBatch, Lanes
from store.chain.append import ChainExtension
from store.chain.entry import SealedEntry
from store.chain.head import ChainHead
from store.chain.tree_frontier import TreeFrontier
from store.key_codec import LaneKey
from store.session_data import Erasure
from store.session_state import StoredVersion


@dataclass
class QueuedEntry:
    """One entry on its way to the chain, with what it changes if its decision allowed."""

    body: DecisionEntryBody
    status: int = 0  # the answer's; a write's is decided at commit, by its precondition
    approval_id: str | None = None
    write: StateWrite | None = None
    erase: StateErase | None = None
    puts: list[tuple[LaneKey, bytes | None]] = field(default_factory=list)  # None: delete
    # Set when the entry is committed (or failed), or when the lead is handed to this request.
    wake: threading.Event = field(default_factory=threading.Event)
    entry: dict[str, Any] | None = None
    error: BaseException | None = None
    link: SpanContext | None = None  # the request's commit span, which the batch's links to
    version: int | None = None  # an applied write's: the version its record is, once planned

    @property
    def settled(self) -> bool:
        """Committed (`entry`) or failed (`error`)."""
        return self.entry is not None or self.error is not None

    @property
    def change(self) -> StateWrite | StateErase | None:
        """The session record this entry writes or erases, if any."""
        return self.write or self.erase

    def outcome(self, stored: StoredVersion | None, newest: int | None = None) -> DecisionOutcome:
        """The entry's outcome, built here only. Any entry but a write or erasure is applied
        exactly when it has keys to store; a write, when its precondition holds against the
        stored version at commit (201 created, 200 replaced); an erasure, 204 when it holds,
        applied when something was stored; else either is 412 and not applied."""
        change = self.change
        if change is None or stored is None:
            status, applied = self.status, bool(self.puts)
        elif not change.precondition.holds(stored):
            status, applied = 412, False
        elif self.erase is not None and self.erase.newest not in (None, newest):
            status, applied = 412, False  # an expiry of a session written since its decision
        elif self.write is not None:
            status, applied = (201 if stored.version is None else 200), True
        else:
            status, applied = 204, stored.version is not None
        return DecisionOutcome(status=status, applied=applied, approval_id=self.approval_id)


@dataclass
class KeyChanges:
    """Keys a batch's decisions changed, and its entries' indexes (a value None deletes)."""

    changes: list[tuple[LaneKey, bytes | None]] = field(default_factory=list)

    def extend(self, changes: Iterable[tuple[LaneKey, bytes | None]]) -> None:
        self.changes.extend(changes)

    def add_to(self, batch: LaneBatch) -> None:
        for key, value in self.changes:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)


@dataclass
class BatchPlan:
    """A batch ready to commit: its entries (one per queued entry, in order), each chain's
    extension, and the effects the entries allowed."""

    entries: list[SealedEntry]
    chains: dict[str, ChainExtension]
    records: RecordWrites
    changes: KeyChanges
    summaries: SummaryUpdate

    @property
    def heads(self) -> dict[str, ChainHead]:
        """Each chain's head once the batch is committed."""
        return {name: chain.head for name, chain in self.chains.items()}

    @property
    def frontiers(self) -> dict[str, TreeFrontier | None]:
        """Each chain's tree frontier once the batch is committed (None: not known)."""
        return {name: chain.frontier for name, chain in self.chains.items()}

    def add_to(self, batch: LaneBatch) -> None:
        """Every write of the plan, and what its commit expects, in one store batch."""
        self.records.add_to(batch)
        self.changes.add_to(batch)
        self.summaries.add_to(batch)
        for chain in self.chains.values():
            chain.add_to(batch)


def plan_batch(
    queued: Sequence[QueuedEntry],
    *,
    lanes: Lanes,
    head: Callable[[str], ChainHead],
    frontier: Callable[[str], TreeFrontier | None] = lambda name: None,
    recorded_at: str,
    summaries: SummaryCache,
) -> BatchPlan:
    """Decide each write against the state as the batch leaves it, and seal each entry,
    dated `recorded_at`, onto its chain after `head(chain)` (read once per chain), with the
    tree's frontier the caller kept after that head, `frontier(chain)`, if any."""
    records = RecordWrites(lanes)
    changes = KeyChanges()
    chains: dict[str, ChainExtension] = {}
    entries: list[SealedEntry] = []
    for item in queued:
        change = item.change
        stored = None if change is None else records.version(change.scope)
        outcome = item.outcome(stored, None if change is None else records.newest(change.scope))
        body = item.body
        item.version = None
        if item.write is not None and outcome.applied:
            item.version = records.write(
                item.write, decision_id=body.decision.decision_id, written_at=recorded_at
            )
        if item.erase is not None and outcome.applied:
            erasure = Erasure(
                erased_at=recorded_at,
                erasure_decision_id=body.decision.decision_id,
                erasure_reason=item.erase.reason,
            )
            records.erase(item.erase.scope, erasure)
        changes.extend(item.puts)
        if body.chain not in chains:
            start = head(body.chain)
            chains[body.chain] = ChainExtension(body.chain, start, lanes, frontier(body.chain))
        (sealed,) = chains[body.chain].seal(
            [body.sealable(outcome, recorded_at)], encoded_members=[body.encoded_members]
        )
        changes.extend(index_puts(body, sealed.seq))
        entries.append(sealed)
    update = summaries.updates(item.body for item in queued)
    return BatchPlan(entries, chains, records, changes, update)
