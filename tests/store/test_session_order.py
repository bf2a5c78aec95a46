"""A workspace's sessions walked in plain session-id order, on LevelDB and PostgreSQL:
ids of many lengths (which the key codec keeps shortest first) come back sorted, pages
resume after any cursor (stored or not), and other workspaces and tenants never show."""

from __future__ import annotations

import random

from store.backends.contract import Lanes
from store.key_codec import LaneKey, TenantResourceLane
from store.session_order import page_in_id_order

LANE = TenantResourceLane.SESSION_STATE
IDS = ["s-10", "s-2", "s-9", "s", "s-", "s-1", "s-100", "a", "z" * 128, "S", "_x", "s-1a", "s.1"]


def stored(lanes: Lanes, tenant: str, workspace: str, sessions: list[str]) -> None:
    for session in sessions:
        lanes.put(LaneKey(LANE, tenant, workspace, session), session.encode())


def walked(lanes: Lanes, after: str | None, limit: int) -> list[str]:
    """Every session after `after`, a page of `limit` at a time."""
    seen: list[str] = []
    while True:
        page, more = page_in_id_order(lanes, LANE, "t-a", "w-1", after, limit)
        assert len(page) <= limit
        seen += [key.session for key, _ in page]
        if not more:
            return seen
        after = page[-1][0].session


def test_sessions_come_in_id_order_page_by_page_and_only_the_workspace_s(
    lanes_on_both: Lanes,
) -> None:
    stored(lanes_on_both, "t-a", "w-1", IDS)
    stored(lanes_on_both, "t-a", "w-2", ["s-0", "b"])  # another workspace
    stored(lanes_on_both, "t-b", "w-1", ["s-0", "b"])  # another tenant, same workspace id
    for limit in (1, 2, 5, 100):
        assert walked(lanes_on_both, None, limit) == sorted(IDS)


def test_a_cursor_resumes_after_itself_whether_or_not_it_is_stored(lanes_on_both: Lanes) -> None:
    stored(lanes_on_both, "t-a", "w-1", IDS)
    for after in [*IDS, "s-0", "s-11", "r", "zz", "0", "s-1000"]:
        assert walked(lanes_on_both, after, 3) == [i for i in sorted(IDS) if i > after]


def test_random_ids_of_random_lengths_come_sorted(lanes_on_both: Lanes) -> None:
    rng = random.Random(29)
    alphabet = "ab-._Z9"
    ids = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(80)}
    ids = {i for i in ids if i[0] != "."}
    stored(lanes_on_both, "t-a", "w-1", sorted(ids))
    assert walked(lanes_on_both, None, 7) == sorted(ids)
    cut = sorted(ids)[len(ids) // 2]
    assert walked(lanes_on_both, cut, 4) == [i for i in sorted(ids) if i > cut]


def test_an_empty_workspace_has_no_page(lanes_on_both: Lanes) -> None:
    stored(lanes_on_both, "t-a", "w-2", ["s-1"])
    assert page_in_id_order(lanes_on_both, LANE, "t-a", "w-1", None, 10) == ([], False)
