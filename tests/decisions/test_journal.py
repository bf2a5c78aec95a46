"""`DecisionJournal`: the one writer of decision entries and session records.

Group commit, the write precondition checked at commit time, close and failure
paths, and recovery after a failed write, on a real LevelDB (and, for the
failure, a real full file system).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from service.decisions import known_heads
from service.decisions.batch_plan import QueuedEntry, plan_batch
from service.decisions.journal import DecisionJournal, JournalClosed, JournalStoreUnavailable
from service.decisions.log import DecisionEntryBody
from service.decisions.record_writes import StateErase, StateWrite
from service.decisions.revisions import SummaryCache
from store.backends.leveldb import LevelDBLaneStore
from store.chain.evidence import EvidenceChain
from store.chain.head import GENESIS
from store.chain.keys import LAST_SEQ, tree_key
from store.chain.merkle_tree import root
from store.chain.tree_frontier import TreeFrontier
from store.chain.tree_store import StoredTree
from store.digests import DigestKey
from store.key_codec import LaneKey, TenantResourceLane
from store.session_state import Precondition, SessionStateStore
from store.session_versions import SessionVersions
from tests.support import rfc6962_reference as reference
from tests.support.factories import decision_entry_body, record, scope

KEY = DigestKey(b"k" * 32)
CLOCK = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def body(n: int, tenant: str = "tenant-a", **extra: Any) -> DecisionEntryBody:
    """A decision entry body as the routes build it, with a small input."""
    return decision_entry_body(f"decision-{n}", tenant, n=n, **extra)


@pytest.fixture
def journal(lanes: LevelDBLaneStore) -> Iterator[DecisionJournal]:
    running = DecisionJournal(lanes, clock=lambda: CLOCK)
    yield running
    running.close()


def test_entries_form_one_gapless_chain_and_are_found_by_decision_id(
    journal: DecisionJournal, lanes: LevelDBLaneStore
) -> None:
    sealed = [journal.record(body(n), status=200) for n in range(5)]
    assert [entry["seq"] for entry in sealed] == [1, 2, 3, 4, 5]
    assert [entry["prev_hash"] for entry in sealed[1:]] == [e["hash"] for e in sealed[:-1]]
    assert journal.head("tenant-a").seq == 5
    assert journal.find("tenant-a", "decision-3") == sealed[3]
    assert journal.find("tenant-a", "decision-unknown") is None
    assert EvidenceChain(lanes, "tenant-a").verify().ok


def test_concurrent_requests_share_commits(
    journal: DecisionJournal, lanes: LevelDBLaneStore
) -> None:
    barrier = threading.Barrier(32)

    def one(n: int) -> None:
        barrier.wait()
        journal.record(body(n), status=200)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert journal.head("tenant-a").seq == 32
    assert journal.batches < 32  # some requests shared a synced batch
    assert EvidenceChain(lanes, "tenant-a").verify().ok


def test_a_write_is_stored_with_its_entry_and_its_outcome(
    journal: DecisionJournal, lanes: LevelDBLaneStore
) -> None:
    built = record(KEY)
    result = journal.record_write(body(1), built, Precondition(if_none_match_any=True))
    assert (result.applied, result.created) == (True, True)
    assert result.entry["outcome"] == {"status": 201, "applied": True, "approval_id": None}
    stored = SessionStateStore(lanes).read(scope())
    assert stored is not None and stored.record == built


def test_the_precondition_is_checked_at_commit_time_against_the_batch(
    journal: DecisionJournal,
) -> None:
    """Two writes based on the same version: the first wins, the second is 412, not applied."""
    first, second = record(KEY), record(KEY, turns=[])
    both_on_nothing = Precondition(if_none_match_any=True)
    outcomes: list[Any] = []
    barrier = threading.Barrier(2)

    def write(built: Any, n: int) -> None:
        barrier.wait()
        outcomes.append(journal.record_write(body(n), built, both_on_nothing))

    threads = [threading.Thread(target=write, args=(r, n)) for n, r in enumerate((first, second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = sorted(result.entry["outcome"]["status"] for result in outcomes)
    assert statuses == [201, 412]
    assert [result.applied for result in outcomes].count(True) == 1


def test_writes_of_one_session_in_one_batch_take_one_version_each(
    journal: DecisionJournal, lanes: LevelDBLaneStore
) -> None:
    """Concurrent writes share batches; each applied one is the next version, named by its
    decision and the batch's time, and only the newest `kept` stay."""
    barrier = threading.Barrier(12)
    results: dict[int, Any] = {}

    def write(n: int) -> None:
        barrier.wait()
        built = record(KEY, state_id=f"state-{n}")
        results[n] = journal.record_write(body(n), built, Precondition(), kept=5)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(result.version for result in results.values()) == list(range(1, 13))
    listed = SessionVersions(lanes).page(scope(), limit=20)
    assert [v.version for v in listed] == [12, 11, 10, 9, 8]
    by_version = {result.version: n for n, result in results.items()}
    for version in listed:
        assert version.decision_id == f"decision-{by_version[version.version]}"
        assert version.written_at == "2026-11-30T12:00:00.000000Z"
    current = SessionVersions(lanes).current(scope())
    assert current is not None and current[1] == 12


def test_one_batch_of_writes_of_one_session_plans_consecutive_versions(
    lanes: LevelDBLaneStore,
) -> None:
    """Planned as one batch: each write is the next version of the batch so far, and a
    version the batch itself put is dropped when a later one leaves it beyond `kept`."""
    SessionStateStore(lanes).write(record(KEY, state_id="state-0"))  # version 1
    queued = [
        QueuedEntry(
            body(n), write=StateWrite(record(KEY, state_id=f"state-{n}"), Precondition(), 2)
        )
        for n in (1, 2, 3)
    ]
    plan = plan_batch(
        queued,
        lanes=lanes,
        head=lambda _: GENESIS,
        recorded_at="2026-11-30T12:00:00.000000Z",
        summaries=SummaryCache(lanes),
    )
    assert [item.version for item in queued] == [2, 3, 4]
    with lanes.batch() as batch:
        plan.add_to(batch)
    listed = SessionVersions(lanes).page(scope(), limit=10)
    assert [(v.version, v.decision_id) for v in listed] == [(4, "decision-3"), (3, "decision-2")]


def test_an_erasure_in_a_batch_takes_the_versions_the_batch_put_and_the_next_is_1(
    lanes: LevelDBLaneStore,
) -> None:
    """Write, erase, write, planned as one batch: the erasure deletes the stored versions
    and the one the batch put before it, and the write after it is version 1 again."""
    SessionStateStore(lanes).write(record(KEY, state_id="state-0"))  # version 1
    queued = [
        QueuedEntry(body(1), write=StateWrite(record(KEY, state_id="state-1"), Precondition())),
        QueuedEntry(body(2), erase=StateErase(scope(), Precondition())),
        QueuedEntry(body(3), write=StateWrite(record(KEY, state_id="state-3"), Precondition())),
    ]
    plan = plan_batch(
        queued,
        lanes=lanes,
        head=lambda _: GENESIS,
        recorded_at="2026-11-30T12:00:00.000000Z",
        summaries=SummaryCache(lanes),
    )
    assert [item.version for item in queued] == [2, None, 1]
    with lanes.batch() as batch:
        plan.add_to(batch)
    listed = SessionVersions(lanes).page(scope(), limit=10)
    assert [(v.version, v.decision_id) for v in listed] == [(1, "decision-3")]
    assert lanes.count(TenantResourceLane.SESSION_VERSION) == 1
    stored = SessionStateStore(lanes).read(scope())
    assert stored is not None and stored.record is not None
    assert stored.record.state_id == "state-3"


def test_an_if_match_on_a_stale_version_is_412_and_stores_nothing(
    journal: DecisionJournal, lanes: LevelDBLaneStore
) -> None:
    built = record(KEY)
    journal.record_write(body(1), built, Precondition(if_none_match_any=True))
    stale = journal.record_write(
        body(2), record(KEY, turns=[]), Precondition(if_match="sha256:" + "0" * 64)
    )
    assert (stale.applied, stale.entry["outcome"]["status"]) == (False, 412)
    stored = SessionStateStore(lanes).read(scope())
    assert stored is not None and stored.record == built


def test_a_body_the_chain_cannot_seal_fails_only_its_batch(journal: DecisionJournal) -> None:
    with pytest.raises(JournalClosed):
        journal.record(body(7, big=2.0**60), status=200)  # no canonical JSON reads it back
    assert journal.record(body(1), status=200)["seq"] == 1


def test_a_closed_journal_refuses_and_stores_nothing(lanes: LevelDBLaneStore) -> None:
    journal = DecisionJournal(lanes, clock=lambda: CLOCK)
    journal.record(body(1), status=200)
    journal.close()
    with pytest.raises(JournalClosed):
        journal.record(body(2), status=200)
    assert EvidenceChain(lanes, "tenant-a").head().seq == 1


def test_a_new_journal_extends_the_chain_it_finds(lanes: LevelDBLaneStore) -> None:
    first = DecisionJournal(lanes, clock=lambda: CLOCK)
    first.record(body(1), status=200)
    first.close()
    second = DecisionJournal(lanes, clock=lambda: CLOCK)
    try:
        assert second.record(body(2), status=200)["seq"] == 2
    finally:
        second.close()


def test_known_heads_keep_the_frontiers_of_the_chains_committed_to_last(
    lanes: LevelDBLaneStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(known_heads, "FRONTIERS_KEPT", 2)
    heads = known_heads.KnownHeads(lanes, None)
    frontier = {name: TreeFrontier(GENESIS, None, {}) for name in "abc"}
    for name in "abca":
        heads.committed({name: GENESIS}, {name: frontier[name]})
    assert [heads.frontier(name) is not None for name in "abc"] == [True, False, True]
    heads.committed({"c": GENESIS}, {"c": None})
    assert heads.frontier("c") is None


class TreeReads:
    """A lane store that records which keys of the chain's tree its reads asked for."""

    def __init__(self, lanes: LevelDBLaneStore) -> None:
        self._lanes = lanes
        self.tree_keys: list[LaneKey] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lanes, name)

    def _seen(self, keys: Sequence[LaneKey]) -> None:
        self.tree_keys += [k for k in keys if k.lane is TenantResourceLane.MERKLE_NODE]
        self.tree_keys += [k for k in keys if k == tree_key("tenant-a")]

    def get(self, key: LaneKey) -> bytes | None:
        self._seen([key])
        return self._lanes.get(key)

    def get_many(self, keys: Sequence[LaneKey]) -> list[bytes | None]:
        self._seen(keys)
        return self._lanes.get_many(keys)


def test_the_journal_appends_on_the_tree_frontier_it_kept(lanes: LevelDBLaneStore) -> None:
    """After its first commit to a chain the journal reads nothing of its tree; after losing
    a race to another writer it reads the tree again, and the tree stays the entries'."""
    reads = TreeReads(lanes)
    journal = DecisionJournal(reads, clock=lambda: CLOCK)  # type: ignore[arg-type]
    try:
        journal.record(body(1), status=200)
        reads.tree_keys.clear()
        for n in range(2, 40):
            journal.record(body(n), status=200)
        assert reads.tree_keys == []
        EvidenceChain(lanes, "tenant-a").append([{"recorded_at": "2026-11-30T12:00:00.000000Z"}])
        journal.record(body(40), status=200)  # lost the race once: read the head, the tree
        assert tree_key("tenant-a") in reads.tree_keys
    finally:
        journal.close()
    chain = EvidenceChain(lanes, "tenant-a")
    assert chain.verify().ok and chain.head().seq == 41
    stored = [value for _, value in chain.stored_entries(until_seq=LAST_SEQ)]
    assert root(41, StoredTree(lanes, "tenant-a").node_at) == reference.mth(stored)


@pytest.fixture
def full_disk_lanes(tmp_path: Path) -> Iterator[tuple[LevelDBLaneStore, Path]]:
    """A LevelDBLaneStore on a small, real ext4 file system (root only: loop mount)."""
    if os.geteuid() != 0:
        pytest.skip("LOUD SKIP: the full-disk journal test mounts an ext4 image and needs root")
    image, mount = tmp_path / "disk.img", tmp_path / "mnt"
    mount.mkdir()
    with open(image, "wb") as handle:
        handle.truncate(24 * 1024 * 1024)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], capture_output=True)
    if (
        made.returncode
        or subprocess.run(
            ["mount", "-o", "loop", str(image), str(mount)], capture_output=True
        ).returncode
    ):
        pytest.skip("LOUD SKIP: cannot mount a loop device here")
    lanes = LevelDBLaneStore(mount / "leveldb")
    try:
        yield lanes, mount
    finally:
        lanes.close()
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_after_a_failed_write_the_journal_refuses_then_reopens_by_itself(
    full_disk_lanes: tuple[LevelDBLaneStore, Path],
) -> None:
    lanes, mount = full_disk_lanes
    journal = DecisionJournal(lanes, clock=lambda: CLOCK)
    try:
        balloon = mount / "balloon"
        with open(balloon, "wb") as handle:
            os.posix_fallocate(handle.fileno(), 0, shutil.disk_usage(mount).free - 64 * 1024)
        acknowledged = []
        with pytest.raises(JournalStoreUnavailable):
            for n in range(10_000):
                padded = body(n, pad="x" * 2000)
                acknowledged.append(journal.record(padded, status=200)["hash"])
        assert not lanes.writable
        with pytest.raises(JournalStoreUnavailable):  # refused at once, nothing written
            journal.record(body(-1), status=200)
        balloon.unlink()
        deadline = time.monotonic() + 10
        while not lanes.writable and time.monotonic() < deadline:
            time.sleep(0.05)  # no request: the committer reopens it on its own
        assert lanes.writable and lanes.reopens == 1
        after = journal.record(body(99_999), status=200)
        chain = EvidenceChain(lanes, "tenant-a")
        # Every acknowledged entry is there as acknowledged; the new one extends the chain
        # (after the failed batch, if its sync failed but its bytes had reached the disk).
        for seq, hash_ in enumerate(acknowledged, start=1):
            entry = chain.get(seq)
            assert entry is not None and entry["hash"] == hash_
        assert after["seq"] >= len(acknowledged) + 1
        assert chain.verify().ok
    finally:
        journal.close()
