"""Several journals appending to the same tenants' chains on one store.

Two `DecisionJournal`s (two workers, or two replicas on PostgreSQL) commit
concurrently from 8 threads. A journal that loses the race for a chain's
next seq re-reads the head and seals again, so every chain stays gapless,
unforked and verifiable, and every entry acknowledged is stored once. On
LevelDB both journals share the one open store (one process); on PostgreSQL
each has a connection pool of its own, as two processes would.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from service.decisions.journal import DecisionJournal
from store.backends.contract import Lanes
from store.backends.leveldb import LevelDBLaneStore
from store.chain.evidence import EvidenceChain
from store.chain.keys import chain_names
from tests.support.factories import decision_entry_body

THREADS = 8
PER_THREAD = 12
TENANTS = ("tenant-a", "tenant-b", "tenant-c")
CLOCK = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["leveldb", "postgresql"])
def two_stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Lanes, Lanes]]:
    """What each journal writes through: one store for both, or two clients of one database."""
    if request.param == "leveldb":
        shared = LevelDBLaneStore(tmp_path / "leveldb")
        yield shared, shared
        shared.close()
        return
    from store.backends.postgres import PostgresLaneStore

    conninfo = request.getfixturevalue("postgres_conninfo")
    first, second = PostgresLaneStore(conninfo), PostgresLaneStore(conninfo)
    yield first, second
    first.close()
    second.close()


def test_two_journals_keep_every_chain_gapless_and_verified(
    two_stores: tuple[Lanes, Lanes],
) -> None:
    journals = [DecisionJournal(lanes, clock=lambda: CLOCK) for lanes in two_stores]
    barrier = threading.Barrier(THREADS)
    acknowledged: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    guard = threading.Lock()

    def writer(thread: int) -> None:
        barrier.wait()
        for n in range(PER_THREAD):
            tenant = TENANTS[(thread + n) % len(TENANTS)]
            body = decision_entry_body(f"d-{thread}-{n}", tenant, n=n)
            try:
                entry = journals[thread % 2].record(body, status=200)
            except Exception as error:  # reported below, with every other
                with guard:
                    errors.append(error)
                continue
            with guard:
                acknowledged.append(entry)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for journal in journals:
        journal.close()

    assert errors == []
    assert len(acknowledged) == THREADS * PER_THREAD
    lanes = two_stores[0]
    assert sorted(chain_names(lanes)) == sorted(TENANTS)
    stored_total = 0
    for tenant in TENANTS:
        chain = EvidenceChain(lanes, tenant)
        verified = chain.verify()
        assert verified.ok, (tenant, verified)
        entries = list(chain.scan())
        seqs = [entry["seq"] for entry in entries]
        assert seqs == list(range(1, len(entries) + 1))  # no seq repeated or skipped
        mine = [e for e in acknowledged if e["target"]["tenant_id"] == tenant]
        assert sorted(e["seq"] for e in mine) == seqs  # each acknowledged entry, once
        assert {e["hash"] for e in mine} == {e["hash"] for e in entries}  # no fork
        stored_total += len(entries)
    assert stored_total == THREADS * PER_THREAD
