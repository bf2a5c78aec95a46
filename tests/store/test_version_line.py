"""A session's versions as writes leave them, on LevelDB and PostgreSQL: the newest `kept`
stay, a lowered bound drops the rest at the next write, several writes of one batch
count as one run, and a write reads a fixed number of keys however many versions the
session had before (LevelDB keeps a deleted key's marker until a compaction, and a scan
steps over each: the line never scans below what it keeps)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from store.backends.contract import Lanes
from store.scope import TenantScope
from store.version_lane import (
    VersionLine,
    VersionSummary,
    change,
    number_of,
    stored_versions,
)

SCOPE = TenantScope(tenant_id="t-a", workspace_id="w-1", session_id="s-1")


class CountingView:
    """The lanes, counting every key a read returns, and the scans asked for."""

    def __init__(self, lanes: Lanes) -> None:
        self.lanes = lanes
        self.reads = 0
        self.scans = 0

    def get(self, key: Any) -> bytes | None:
        self.reads += 1
        return self.lanes.get(key)

    def scan(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        self.scans += 1
        for item in self.lanes.scan(*args, **kwargs):
            self.reads += 1
            yield item


def write(lanes: Lanes, writes: int, kept: int) -> int:
    """`writes` writes of the session in one batch; the keys the line read making them
    (after the one seek that finds the newest), asserting it scanned nothing."""
    view = CountingView(lanes)
    line = VersionLine.read(view, SCOPE, None)  # type: ignore[arg-type]
    view.reads = view.scans = 0
    with lanes.batch() as batch:
        for _ in range(writes):
            number = line.next_version
            summary = VersionSummary(
                version=number, state_digest=f"sha256:{number:064x}", written_at=None,
                decision_id=None,
            )  # fmt: skip
            for key, value in line.changes(view, summary, b"{}", kept=kept):  # type: ignore[arg-type]
                change(batch, key, value)
    assert view.scans == 0  # a scan would step over every deletion below the versions
    return view.reads


def stored(lanes: Lanes) -> list[int]:
    return [number_of(key) for key, _ in stored_versions(lanes, SCOPE)]


def test_the_newest_kept_stay_and_a_lowered_bound_drops_the_rest(lanes_on_both: Lanes) -> None:
    for _ in range(30):
        write(lanes_on_both, 1, kept=5)
    assert stored(lanes_on_both) == [30, 29, 28, 27, 26]
    write(lanes_on_both, 1, kept=2)
    assert stored(lanes_on_both) == [31, 30]
    write(lanes_on_both, 3, kept=2)  # three writes in one batch
    assert stored(lanes_on_both) == [34, 33]
    write(lanes_on_both, 1, kept=4)  # a raised bound keeps what is left
    assert stored(lanes_on_both) == [35, 34, 33]


def test_a_write_reads_as_many_keys_after_a_thousand_versions_as_after_ten(
    lanes_on_both: Lanes,
) -> None:
    reads = []
    for count in range(1, 1201):
        read = write(lanes_on_both, 1, kept=3)
        if count in (10, 1200):
            reads.append(read)
    assert reads[0] == reads[1] == 2  # the version dropped, and the one below it: gone
    assert stored(lanes_on_both) == [1200, 1199, 1198]
