"""`DecisionJournal`: group commit of decision entries and the durable writes they allow.

Requests queue their entry (and, for a durable write, the record and its
precondition) on their chain's line (`service.decisions.group_commit`) and one
of them commits: the leader, which takes whatever is pending on its line, plans
the batch (`service.decisions.batch_plan`: it checks each write's precondition
in order against the stored state as the batch leaves it and seals each entry
onto its tenant's chain), and commits records, entries and indexes in one
synced batch. So many requests share one fsync; each chain stays strictly
ordered with no gaps; no record exists without the entry that allowed it; and
no entry says applied unless its record was written. One thread of its own
only reopens a store latched after a failed write, when no request comes to do
it (`service.decisions.recovery`).

On PostgreSQL each chain has a line of its own, and each batch is one
transaction of one tenant: a chain whose rows another transaction holds, or
whose statement is slow, holds only its own writers, while other chains'
leaders commit beside it (at most half the pool's connections at once: a
commit may use two). Its writers answer as the store's timeouts allow: the
hold of the chain gives up after the store's timeout, and a statement that
waits longer than `statement_timeout` fails, so the batch fails closed with
nothing written. On LevelDB one process owns the store and nothing outside it
can hold a chain, so every chain shares one line and one batch (one fsync for
all tenants); an entry of a chain whose head cannot be read fails alone.

Other writers (another journal, another process on PostgreSQL) may append to
the same chains. The commit expects the key of each chain's next seq to be
absent, and each replaced record to be as read: when another writer got there
first the store raises `ExpectationFailed` and nothing was written; the
journal then reads those chains' heads again, decides and seals the batch
again, and retries after a short random pause (at most `COMMIT_ATTEMPTS` times; then the batch fails and
no request of it is answered as committed).

A chain whose stored entries no longer reach the head the service signed and
remembers for it (`store.chain.signed_head.SignedHeads`: its tail was cut, or the
entry at that seq is another) takes no entry: extending it would re-use seqs
that signed head covered. Every entry for it fails with `ChainBehindSignedHead`
(nothing of it is stored), other chains are committed as usual, and the chain
is logged once as `decision_log_behind_signed_head`. It is checked whenever the
journal reads a chain's head (`service.decisions.known_heads`), and read again
at each entry for it until an operator records the loss (`sessionstate
decisions record-loss`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from service.decisions.batch_plan import BatchPlan, QueuedEntry, plan_batch
from service.decisions.group_commit import GroupCommits, GroupCommitsClosed
from service.decisions.known_heads import KnownHeads
from service.decisions.log import DecisionEntryBody, DecisionOutcome, decision_id_key
from service.decisions.record_writes import StateErase, StateWrite
from service.decisions.recovery import StoreRecovery
from service.decisions.revisions import SummaryCache
from service.observability import tracing
from store.backends.contract import ExpectationFailed, Lanes, StoreOffline, StoreOutcomeUnknown
from store.chain.entry import ChainCorrupt
from store.chain.evidence import EvidenceChain
from store.chain.head import ChainHead, format_timestamp
from store.chain.keys import chain_names, legacy_chain_present, marker_key
from store.chain.signed_head import SignedHeads
from store.key_codec import LaneKey
from store.record.state_record import SessionStateRecord
from store.session_state import Precondition
from store.version_lane import VERSIONS_KEPT_DEFAULT

log = logging.getLogger("sessionstate.journal")
MAX_BATCH = 512
COMMIT_ATTEMPTS = 32  # commits of one batch that lost a race to another writer, then it fails
MAX_RACE_BACKOFF_SECONDS = 0.05  # after a lost race: a random pause up to this, doubling from 1 ms


class JournalClosed(RuntimeError):
    """The journal is stopped or failed to commit: nothing of the request was stored."""


class JournalStoreUnavailable(JournalClosed, StoreOffline):
    """The store cannot write (it failed and is not reopened yet): nothing was stored."""


class JournalOutcomeUnknown(JournalClosed, StoreOutcomeUnknown):
    """The batch's commit failed after it may have landed (a COMMIT cut off): the request's
    entry, and what it changed, are either all stored or all absent, nobody knows which."""


class LegacyChainPresent(RuntimeError):
    """The store holds the one global chain of an older version: it must be upgraded first."""

    def __init__(self) -> None:
        super().__init__(
            "the decision log is the single global chain of an older sessionstate; stop the "
            "service and run `sessionstate db upgrade` to move it onto per-tenant chains"
        )


class ChainBehindSignedHead(JournalClosed):
    """The chain no longer reaches the signed head the service remembers for it: nothing of
    the request was stored, and nothing will be on that chain until its loss is recorded."""

    def __init__(self) -> None:
        super().__init__(
            "the decision log's chain is behind the head the service signed for it; "
            "`sessionstate decisions record-loss` records the loss"
        )


class CommitContended(RuntimeError):
    """Other writers kept appending to the batch's chains: nothing of the batch was stored."""


@dataclass(frozen=True)
class WriteResult:
    applied: bool
    created: bool
    entry: dict[str, Any]
    version: int | None = None  # the version the record is, when applied


class DecisionJournal:
    """The one writer of the decision log and of session records."""

    def __init__(
        self,
        lanes: Lanes,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        max_batch: int = MAX_BATCH,
        on_reopened: Callable[[Lanes], None] | None = None,
        live_revision: Callable[[], str | None] | None = None,
        signed_heads: SignedHeads | None = None,
    ) -> None:
        if legacy_chain_present(lanes):
            raise LegacyChainPresent()
        self._lanes = lanes
        self._clock = clock
        # A store of one process (LevelDB): one line for every chain (one batch, one fsync).
        self._one_line = not lanes.capabilities.shared
        self._lines: GroupCommits[QueuedEntry] = GroupCommits(
            self._commit,
            partial(self._fail, error=JournalClosed("the batch was not committed")),
            max_batch=max_batch,
            concurrent=_concurrent_commits(lanes),
        )
        # Each chain's head as this journal last committed or read it; a lost race re-reads it.
        self._heads = KnownHeads(lanes, signed_heads)
        self._guard = threading.Lock()  # of the counts, and of the summaries' reset
        # Shared by the chains' leaders (each writes its own chain's); a failed decision counts
        # under live_revision().
        self._summaries = SummaryCache(lanes, live_revision)
        self.conflicts = 0  # commits that lost a race to another writer and were retried
        self.batches = 0  # commits so far (entries / batches shows the grouping)
        self._closed = threading.Event()
        # Its lock is held by each commit on LevelDB too (whose reopen closes the database).
        self._recovery = StoreRecovery(lanes, self._forget, on_reopened)

    def chain(self, name: str) -> EvidenceChain:
        return EvidenceChain(self._lanes, name)

    def head(self, name: str) -> ChainHead:
        """The newest entry of chain `name` this journal knows of: what it committed last, or
        what the store held when it first looked (another writer may have appended since)."""
        return _reached(self._heads.head(name))

    def _read_head(self, name: str) -> ChainHead:
        """The stored head of chain `name`, checked against its signed head."""
        return _reached(self._heads.read(name))

    def read_every_head(self) -> None:
        """Read each chain's head now, so a chain behind its signed head is found (logged, and
        counted for `/readyz`) as the service starts, not at that tenant's first request. A
        head that does not read is left to the request that needs it, which fails closed."""
        for name in chain_names(self._lanes):
            try:
                self._read_head(name)
            except (ChainCorrupt, ChainBehindSignedHead):  # the latter is counted, and logged
                continue

    def chains_behind_signed_head(self) -> int:
        """How many chains were found behind their signed head when last read (`/readyz`)."""
        return self._heads.behind

    def record(self, body: DecisionEntryBody, *, status: int) -> dict[str, Any]:
        """Append one decision entry that changed nothing; returns it sealed, once on disk."""
        pending = self._submit(QueuedEntry(body, status))
        assert pending.entry is not None
        return pending.entry

    def record_effect(
        self,
        body: DecisionEntryBody,
        *,
        status: int,
        puts: Sequence[tuple[LaneKey, bytes | None]] = (),
        approval_id: str | None = None,
    ) -> dict[str, Any]:
        """Append an entry together with the keys its decision changed, in one batch (a
        value None deletes its key).

        The outcome says `applied` exactly when there was something to store.
        """
        pending = self._submit(QueuedEntry(body, status, approval_id, puts=list(puts)))
        assert pending.entry is not None
        return pending.entry

    def record_write(
        self,
        body: DecisionEntryBody,
        record: SessionStateRecord,
        precondition: Precondition,
        *,
        kept: int = VERSIONS_KEPT_DEFAULT,
    ) -> WriteResult:
        """Store record if precondition holds at commit, with its entry, in one batch, as its
        session's next version (the newest `kept` versions are kept).

        The entry's outcome is set here: 201 created, 200 replaced, or 412 and
        not applied when the stored version moved on.
        """
        pending = self._submit(QueuedEntry(body, write=StateWrite(record, precondition, kept)))
        assert pending.entry is not None
        outcome = DecisionOutcome.model_validate(pending.entry["outcome"])
        return WriteResult(
            applied=outcome.applied,
            created=outcome.status == 201,
            entry=pending.entry,
            version=pending.version,
        )

    def record_erase(self, body: DecisionEntryBody, erase: StateErase) -> WriteResult:
        """Erase the session if erase's precondition holds at commit, with its entry (the
        erasure's receipt), in one batch.

        The entry's outcome is set here: 204, applied when something was stored (the
        session's data deleted, its tombstone left), or 412 and not applied when the
        stored version is not the one the erasure was decided on.
        """
        pending = self._submit(QueuedEntry(body, erase=erase))
        assert pending.entry is not None
        outcome = DecisionOutcome.model_validate(pending.entry["outcome"])
        return WriteResult(applied=outcome.applied, created=False, entry=pending.entry)

    def find(self, chain: str, decision_id: str) -> dict[str, Any] | None:
        """The entry of a decision id on a chain, through the index written with it."""
        seq = self._lanes.get(decision_id_key(chain, decision_id))
        return None if seq is None else self.chain(chain).get(int.from_bytes(seq, "big"))

    def close(self, timeout: float = 10.0) -> None:
        """Take no more entries; wait (at most `timeout`) for those already queued."""
        if self._closed.is_set():
            return
        self._closed.set()
        deadline = time.monotonic() + timeout
        self._lines.close(timeout)
        self._recovery.close(deadline - time.monotonic())

    def _submit(self, pending: QueuedEntry) -> QueuedEntry:
        pending.body.encoded_members  # noqa: B018 - encoded here, in parallel, not in the commit
        with tracing.commit_span(pending.body.decision.decision_id) as span:
            pending.link = tracing.link_of(span)
            try:
                self._lines.submit("" if self._one_line else pending.body.chain, pending)
            except GroupCommitsClosed:
                raise JournalClosed("the decision journal is closed") from None
            tracing.note_commit(span, pending.entry, pending.error is not None)
        if isinstance(pending.error, StoreOutcomeUnknown):
            raise JournalOutcomeUnknown("the commit's outcome is unknown") from pending.error
        if isinstance(pending.error, StoreOffline):
            raise JournalStoreUnavailable("the store cannot write now") from pending.error
        if isinstance(pending.error, ChainBehindSignedHead):
            raise ChainBehindSignedHead() from pending.error
        if pending.error is not None:
            raise JournalClosed("the decision entry could not be committed") from pending.error
        return pending

    def _forget(self) -> None:
        """After a reopen: read every head and summary again (a write of unknown outcome may
        have landed)."""
        self._heads.forget()
        with self._guard:
            self._summaries.clear()

    def _commit(self, batch: list[QueuedEntry]) -> None:
        links = ((pending.link, pending.body.decision.decision_id) for pending in batch)
        with tracing.batch_span(len(batch), links) as span:
            self._commit_batch(batch)
            tracing.note_batch(span, (pending.error for pending in batch))

    def _commit_batch(self, batch: list[QueuedEntry]) -> None:
        if self._one_line:  # one process: one batch, one fsync; never beside a reopen
            with self._recovery.lock:
                if self._recovered(batch):
                    self._commit_unit(batch, nullcontext)
            return
        if self._recovered(batch):  # one chain's line: one tenant per transaction
            chain = marker_key(batch[0].body.chain)
            self._commit_unit(batch, partial(self._lanes.exclusive, chain))

    def _recovered(self, batch: list[QueuedEntry]) -> bool:
        """Whether the store can write, reopened if it was latched; else batch fails."""
        if self._recovery.writable():
            return True
        self._fail(batch, StoreOffline("the store is latched after a failed write"))
        return False

    def _commit_unit(
        self, batch: list[QueuedEntry], hold: Callable[[], AbstractContextManager[Any]]
    ) -> None:
        """Plan batch on the heads this journal knows, then commit it in one store batch
        while holding its chain (`hold`): writers of one chain (other workers, other
        replicas) take turns. After losing a race, read the heads again and plan again while
        still holding it, so the next attempt cannot lose to another journal."""
        try:
            batch = self._refuse_behind(batch)
            if not batch:
                return
            plan = self._plan(batch)
            with hold():
                for attempt in range(COMMIT_ATTEMPTS):
                    try:
                        with self._lanes.batch(sync=True) as writes:
                            plan.add_to(writes)
                    except ExpectationFailed:  # another writer came first: nothing was written
                        plan = self._plan_again(batch, attempt)
                        continue
                    self._acknowledge(batch, plan)
                    return
        except Exception as error:  # nothing of this batch was acknowledged; each fails closed
            log.error("journal_commit_failed", extra={"error_type": type(error).__name__})
            self._fail(batch, error)
            return
        log.error("journal_commit_contended", extra={"attempts": COMMIT_ATTEMPTS})
        self._fail(batch, CommitContended("other writers kept appending to these chains"))

    def _plan(self, batch: list[QueuedEntry]) -> BatchPlan:
        return plan_batch(
            batch,
            lanes=self._lanes,
            head=self.head,
            frontier=self._heads.frontier,
            recorded_at=format_timestamp(self._clock()),
            summaries=self._summaries,
        )

    def _plan_again(self, batch: list[QueuedEntry], attempt: int) -> BatchPlan:
        """After a lost race: read the batch's chains again (and forget the summaries, which
        another writer may have added to too), pause, and plan the batch again."""
        with self._guard:
            self.conflicts += 1
        self._summaries.clear()
        for name in {pending.body.chain for pending in batch}:
            self._read_head(name)
        # A random pause, so two writers that keep colliding (a hold that could not be had
        # holds nothing) stop doing so in step.
        pause = min(MAX_RACE_BACKOFF_SECONDS, 0.001 * 2**attempt)
        time.sleep(random.uniform(0, pause))  # noqa: S311 - jitter
        return self._plan(batch)

    def _acknowledge(self, batch: list[QueuedEntry], plan: BatchPlan) -> None:
        self._heads.committed(plan.heads, plan.frontiers)
        with self._guard:
            self._summaries.written(plan.summaries)
            self.batches += 1
        plan.records.committed()  # what the next read of each session will find
        for pending, sealed in zip(batch, plan.entries, strict=True):
            pending.entry = sealed.entry
            pending.wake.set()

    def _refuse_behind(self, batch: list[QueuedEntry]) -> list[QueuedEntry]:
        """Fail the entries of chains whose head cannot be had (behind their signed head, or
        corrupt): the others, of other chains, to commit."""
        refused: dict[str, BaseException] = {}
        for name in {pending.body.chain for pending in batch}:
            try:
                self.head(name)
            except ChainBehindSignedHead as behind:  # logged when found
                refused[name] = behind
            except ChainCorrupt as corrupt:
                log.error("journal_commit_failed", extra={"error_type": type(corrupt).__name__})
                refused[name] = corrupt
        for name, why in refused.items():
            self._fail([pending for pending in batch if pending.body.chain == name], why)
        return [pending for pending in batch if pending.body.chain not in refused]

    @staticmethod
    def _fail(batch: list[QueuedEntry], error: BaseException) -> None:
        for pending in batch:
            pending.error = error
            pending.wake.set()


def _reached(head: ChainHead | None) -> ChainHead:
    if head is None:  # the chain is behind its signed head (logged when found)
        raise ChainBehindSignedHead()
    return head


def _concurrent_commits(lanes: Lanes) -> int:
    """How many chains may commit at once: half the store's connections (a commit holds its
    chain on one connection and writes on another), at least one."""
    return max(1, lanes.capabilities.connections // 2)
