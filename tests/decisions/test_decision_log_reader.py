"""`DecisionLogReader`: what every reader of the log (routes, page, bundle, review) sees.

On a real LevelDB, with entries written by the real journal.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from service.decisions.journal import DecisionJournal
from service.decisions.log import DecisionEntryBody
from service.decisions.pending import DecisionAlreadyKept, PendingDecision
from service.decisions.query import DecisionQuery
from service.decisions.reader import DecisionLogReader
from service.policy.input import PolicyActor, PolicyTarget
from service.policy.trace import DecisionEngine, DecisionTrace
from store.backends.leveldb import LevelDBLaneStore
from store.canonical import canonical_json
from store.chain.keys import entry_key

CLOCK = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def body(n: int, tenant: str, *, allow: bool = True) -> DecisionEntryBody:
    trace = DecisionTrace(
        decision_id=f"decision-{n}",
        action="read" if allow else "write",
        policy="sessionstate/read",
        allow=allow,
        reasons=[] if allow else ["cross_tenant_scope_rejected"],
        policy_revision="sha256:" + "0" * 64,
        input_digest="sha256:" + "1" * 64,
        evaluated_at=f"2026-11-30T12:00:{n:02d}.000Z",
        engine=DecisionEngine(version="test"),
        latency_ms=2.0,  # stored as 2: an export repeats the entry as stored
    )
    return DecisionEntryBody(
        decision=trace,
        actor=PolicyActor(sub="svc", roles=["model-service"], tenant_id=tenant),
        target=PolicyTarget(tenant_id=tenant),
        input={"n": n},
    )


@pytest.fixture
def journal(lanes: LevelDBLaneStore) -> Iterator[DecisionJournal]:
    running = DecisionJournal(lanes, clock=lambda: CLOCK)
    for n in range(1, 8):
        tenant = "tenant-a" if n % 2 else "tenant-b"
        running.record(body(n, tenant, allow=n != 5), status=200 if n != 5 else 403)
    yield running
    running.close()


def test_pages_follow_cursors_to_the_head_the_first_page_saw(
    journal: DecisionJournal, lanes: LevelDBLaneStore
) -> None:
    reader = DecisionLogReader(lanes, head=journal.head)
    first = reader.page("tenant-a", DecisionQuery(limit=2))
    assert [entry.seq for entry in first.entries] == [1, 2]  # tenant-a's own chain
    assert first.next_cursor is not None
    journal.record(body(9, "tenant-a"), status=200)  # after the first page: not shown
    second = reader.page("tenant-a", DecisionQuery(limit=2, cursor=first.next_cursor))
    assert [entry.seq for entry in second.entries] == [3, 4]
    assert second.next_cursor is None


def test_newest_first_pages_follow_cursors_down_from_the_head_the_first_page_saw(
    journal: DecisionJournal, lanes: LevelDBLaneStore
) -> None:
    reader = DecisionLogReader(lanes, head=journal.head)
    first = reader.page("tenant-a", DecisionQuery(order="desc", limit=3))
    assert [entry.seq for entry in first.entries] == [4, 3, 2]
    assert first.next_cursor is not None
    journal.record(body(9, "tenant-a"), status=200)  # after the first page: not shown
    second = reader.page("tenant-a", DecisionQuery(order="desc", limit=3, cursor=first.next_cursor))
    assert [entry.seq for entry in second.entries] == [1]
    assert second.next_cursor is None
    with pytest.raises(ValidationError):  # a cursor goes on in the order that issued it
        DecisionQuery(limit=3, cursor=first.next_cursor)
    asc = reader.page("tenant-a", DecisionQuery(limit=1)).next_cursor
    with pytest.raises(ValidationError):
        DecisionQuery(order="desc", cursor=asc)
    newest = reader.page("tenant-a", DecisionQuery(order="desc", limit=1)).entries
    assert [entry.decision.decision_id for entry in newest] == ["decision-9"]


def test_one_entry_holds_by_its_own_hash_and_its_link_to_the_one_before(
    journal: DecisionJournal, lanes: LevelDBLaneStore
) -> None:
    reader = DecisionLogReader(lanes)
    first = reader.get("tenant-a", "decision-1")
    assert first is not None and first.hash_ok  # links to genesis
    stored = journal.chain("tenant-a").get(2)
    assert stored is not None
    lanes.put(entry_key(2, "tenant-a"), canonical_json(stored | {"input": {"n": 0}}))
    edited, after = reader.get("tenant-a", "decision-3"), reader.get("tenant-a", "decision-5")
    assert edited is not None and not edited.hash_ok  # its hash no longer holds
    assert edited.entry.input == {"n": 0}  # shown as edited
    assert after is not None and after.hash_ok  # links to entry 2's stored hash, unchanged
    lanes.put(entry_key(2, "tenant-a"), canonical_json(stored | {"hash": "sha256:" + "f" * 64}))
    after = reader.get("tenant-a", "decision-5")
    assert after is not None and not after.hash_ok  # entry 2's hash is not its prev_hash


def test_filters_select_by_decision(journal: DecisionJournal, lanes: LevelDBLaneStore) -> None:
    reader = DecisionLogReader(lanes)
    denied = list(reader.entries("tenant-a", DecisionQuery(allow="false")))
    assert [entry.decision.decision_id for entry in denied] == ["decision-5"]
    writes = list(reader.entries("tenant-a", DecisionQuery(action="write")))
    assert writes == denied
    assert list(reader.entries("tenant-c")) == []


def test_one_entry_by_decision_id(journal: DecisionJournal, lanes: LevelDBLaneStore) -> None:
    reader = DecisionLogReader(lanes)
    found = reader.get("tenant-b", "decision-4")
    assert found is not None and found.hash_ok
    entry = found.entry
    assert (entry.seq, entry.target.tenant_id) == (2, "tenant-b")
    assert reader.get("tenant-a", "decision-4") is None  # another tenant's id: as unknown
    assert entry.outcome.status == 200 and not entry.outcome.applied
    # as stored: no member the entry lacks (no `shadow`, no `legacy`), 2 stays 2
    assert entry.model_dump(mode="json") == journal.find("tenant-b", "decision-4")
    assert '"latency_ms":2,' in entry.model_dump_json()
    assert reader.get("tenant-b", "decision-404") is None
    assert reader.get("tenant-b", "no/such id") is None  # not a decision id at all


def test_the_export_repeats_each_entry_as_stored(
    journal: DecisionJournal, lanes: LevelDBLaneStore
) -> None:
    reader = DecisionLogReader(lanes)
    lines = list(reader.export("tenant-b"))
    events = [json.loads(line) for line in lines]
    assert [event["decision_id"] for event in events] == ["decision-2", "decision-4", "decision-6"]
    assert all(line.endswith("\n") for line in lines)
    assert events[0]["sessionstate"] == journal.find("tenant-b", "decision-2")
    assert '"latency_ms": 2,' in lines[0]  # as stored, not re-serialised from the model
    assert events[0]["metrics"] == {"timer_server_handler_ns": 2_000_000}
    everyone = [json.loads(line)["decision_id"] for line in reader.export(None)]
    assert everyone == [f"decision-{n}" for n in (1, 3, 5, 7, 2, 4, 6)]  # chain by chain


def test_an_entry_without_the_shape_of_one_is_skipped_everywhere(
    journal: DecisionJournal, lanes: LevelDBLaneStore
) -> None:
    stored = journal.chain("tenant-a").get(2)
    assert stored is not None
    mangled: dict[str, Any] = {name: value for name, value in stored.items() if name != "outcome"}
    lanes.put(entry_key(2, "tenant-a"), canonical_json(mangled))
    reader = DecisionLogReader(lanes)
    assert [entry.seq for entry in reader.entries("tenant-a")] == [1, 3, 4]
    assert reader.get("tenant-a", "decision-3") is None
    assert len(list(reader.export("tenant-a"))) == 3
    assert len(reader.newest(2)) == 2


def test_a_pending_decision_is_kept_once(journal: DecisionJournal) -> None:
    pending = PendingDecision(body(20, "tenant-a"))
    kept = pending.record(journal, 404)
    assert kept["outcome"] == {"status": 404, "applied": False, "approval_id": None}
    assert pending.settled
    with pytest.raises(DecisionAlreadyKept):
        pending.record_effect(journal, 201, approval_id="appr_" + "0" * 24)
    dropped = PendingDecision(body(21, "tenant-a"))
    dropped.drop()
    assert dropped.settled and journal.find("tenant-a", "decision-21") is None
