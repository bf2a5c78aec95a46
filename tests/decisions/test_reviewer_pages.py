"""Deep pages of the decision log by cursor: exactly the entries after the cursor, read by
seeking to it (the entries before it are not read). On LevelDB and on PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from service.decisions.journal import DecisionJournal
from service.decisions.query import DecisionQuery, encode_cursor
from service.decisions.reader import DecisionLogReader
from store.backends.contract import Lanes
from tests.support.counting_lanes import CountingLanes
from tests.support.factories import decision_entry_body

ENTRIES = 60


@pytest.fixture
def lanes(lanes_on_both: Lanes) -> Lanes:
    return lanes_on_both


@pytest.fixture
def counting(lanes: Lanes) -> Iterator[CountingLanes]:
    """tenant-a's chain of 60 entries (every third a denial), tenant-b's of 10 between them."""
    journal = DecisionJournal(lanes)
    try:
        for n in range(1, ENTRIES + 1):
            body = decision_entry_body(f"a-{n}", "tenant-a", n=n)
            if n % 3 == 0:
                denied = body.decision.model_copy(update={"allow": False, "action": "write"})
                body = body.model_copy(update={"decision": denied})
            journal.record(body, status=200)
            if n % 6 == 0:
                journal.record(decision_entry_body(f"b-{n}", "tenant-b"), status=200)
    finally:
        journal.close()
    return CountingLanes(lanes)


def seqs(page: list[Any]) -> list[int]:
    return [entry.seq for entry in page]


def test_following_cursors_reads_every_entry_once_in_order(counting: CountingLanes) -> None:
    reader = DecisionLogReader(counting)  # type: ignore[arg-type]
    seen: list[int] = []
    query = DecisionQuery(limit=7)
    while True:
        page = reader.page("tenant-a", query)
        assert len(page.entries) <= 7
        seen += seqs(page.entries)
        if page.next_cursor is None:
            break
        query = DecisionQuery(limit=7, cursor=page.next_cursor)
    assert seen == list(range(1, ENTRIES + 1))
    assert all(entry.target.tenant_id == "tenant-a" for entry in reader.entries("tenant-a"))


def test_a_deep_page_holds_exactly_the_entries_after_its_cursor_and_reads_no_others(
    counting: CountingLanes,
) -> None:
    reader = DecisionLogReader(counting)  # type: ignore[arg-type]
    counting.scanned = 0
    page = reader.page("tenant-a", DecisionQuery(limit=5, cursor=encode_cursor(50, ENTRIES)))
    assert seqs(page.entries) == [51, 52, 53, 54, 55]
    assert page.next_cursor == encode_cursor(55, ENTRIES)
    assert counting.scanned == 6  # the page and the one that says more follow: none before


def test_a_deep_page_ends_at_the_head_the_first_page_saw(counting: CountingLanes) -> None:
    reader = DecisionLogReader(counting)  # type: ignore[arg-type]
    page = reader.page("tenant-a", DecisionQuery(limit=50, cursor=encode_cursor(55, 57)))
    assert seqs(page.entries) == [56, 57]
    assert page.next_cursor is None


def test_a_deep_filtered_page_skips_what_does_not_match(counting: CountingLanes) -> None:
    reader = DecisionLogReader(counting)  # type: ignore[arg-type]
    query = DecisionQuery(allow="false", limit=3, cursor=encode_cursor(40, ENTRIES))
    page = reader.page("tenant-a", query)
    assert seqs(page.entries) == [42, 45, 48]
    assert all(not entry.decision.allow for entry in page.entries)
    query = DecisionQuery(allow="false", limit=3, cursor=page.next_cursor)
    assert seqs(reader.page("tenant-a", query).entries) == [51, 54, 57]


def test_an_export_page_is_the_list_page_as_export_lines(counting: CountingLanes) -> None:
    reader = DecisionLogReader(counting)  # type: ignore[arg-type]
    query = DecisionQuery(limit=4, cursor=encode_cursor(30, ENTRIES))
    lines, next_cursor = reader.export_page("tenant-a", query)
    assert [json.loads(line)["sessionstate"]["seq"] for line in lines] == [31, 32, 33, 34]
    assert next_cursor == reader.page("tenant-a", query).next_cursor == encode_cursor(34, ENTRIES)
    last, none = reader.export_page("tenant-a", DecisionQuery(cursor=encode_cursor(58, ENTRIES)))
    assert len(last) == 2 and none is None


def test_another_tenants_chain_pages_on_its_own(counting: CountingLanes) -> None:
    reader = DecisionLogReader(counting)  # type: ignore[arg-type]
    page = reader.page("tenant-b", DecisionQuery(limit=3, cursor=encode_cursor(6, 10)))
    assert seqs(page.entries) == [7, 8, 9]
    assert {entry.decision.decision_id for entry in page.entries} == {"b-42", "b-48", "b-54"}
