"""`sessions_in_id_order`: a workspace's keys of one lane, in plain session-id order.

The key codec length-prefixes the session id, so the store keeps a workspace's
sessions shortest id first, ids of one length byte by byte. A list is asked for
in session-id order (`s-10` before `s-2`), so the walk merges one key-ordered
stream per id length present: ids of one length are already in id order, and a
merge of sorted streams is sorted. Finding the lengths present takes one seek
per length (ids are at most 128 bytes), not a read of the workspace, so a page
costs its own size and the number of id lengths, whatever else the store holds.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from itertools import islice

from store.backends.contract import LaneView
from store.key_codec import LaneKey, TenantResourceLane

Item = tuple[LaneKey, bytes]


def sessions_in_id_order(
    view: LaneView, lane: TenantResourceLane, tenant: str, workspace: str, after: str | None
) -> Iterator[Item]:
    """The workspace's keys in lane (one per session: its `name` empty) whose session id
    sorts after `after` (None: from the first), in session-id order."""
    streams = [
        _stream(view, lane, tenant, workspace, length, after)
        for length in _lengths(view, lane, tenant, workspace)
    ]
    return heapq.merge(*streams, key=lambda item: item[0].session.encode())


def _lengths(
    view: LaneView, lane: TenantResourceLane, tenant: str, workspace: str
) -> Iterator[int]:
    """The session-id lengths the workspace's keys in lane hold, one seek each."""
    length = 1
    while True:
        first = next(
            iter(view.scan(lane, tenant, workspace, start=_least(lane, tenant, workspace, length))),
            None,
        )
        if first is None:
            return
        length = len(first[0].session.encode())
        yield length
        length += 1


def _stream(
    view: LaneView,
    lane: TenantResourceLane,
    tenant: str,
    workspace: str,
    length: int,
    after: str | None,
) -> Iterator[Item]:
    """The keys whose session id is `length` bytes long and sorts after `after`."""
    start, skip = _least(lane, tenant, workspace, length), None
    if after is not None:
        # An id of this length sorts after `after` when it passes `after`'s first
        # `length` bytes, or starts with all of `after` and is longer.
        head = after[:length]
        start = LaneKey(lane, tenant, workspace, head.ljust(length, "\x00"))
        skip = head if len(head) == length else None
    stop = _least(lane, tenant, workspace, length + 1)
    scan = view.scan(lane, tenant, workspace, start=start, stop=stop)
    return (item for item in scan if item[0].session != skip)


def _least(lane: TenantResourceLane, tenant: str, workspace: str, length: int) -> LaneKey:
    """A key below every key of the workspace whose session id is `length` bytes or longer."""
    return LaneKey(lane, tenant, workspace, "\x00" * length)


def page_in_id_order(
    view: LaneView,
    lane: TenantResourceLane,
    tenant: str,
    workspace: str,
    after: str | None,
    limit: int,
) -> tuple[list[Item], bool]:
    """Up to `limit` items after `after` in session-id order, and whether more follow."""
    found = list(islice(sessions_in_id_order(view, lane, tenant, workspace, after), limit + 1))
    return found[:limit], len(found) > limit
