"""`CountingLanes`: a lane store wrapper counting what its reads hand out."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from store.backends.contract import Lanes
from store.key_codec import LaneKey, TenantResourceLane


class CountingLanes:
    """A lane store that counts what its reads hand out: keys scanned, keys got, and the
    passes the keys were got in."""

    def __init__(self, lanes: Lanes) -> None:
        self._lanes = lanes
        self.scanned = 0
        self.got = 0
        self.passes = 0  # the reads keys were got in (a `get` is a pass of one key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lanes, name)

    def get(self, key: LaneKey) -> bytes | None:
        self.got, self.passes = self.got + 1, self.passes + 1
        return self._lanes.get(key)

    def get_many(self, keys: Sequence[LaneKey]) -> list[bytes | None]:
        self.got, self.passes = self.got + len(keys), self.passes + 1
        return self._lanes.get_many(keys)

    def scan(
        self, lane: TenantResourceLane, *scope_: str, **options: Any
    ) -> Iterator[tuple[LaneKey, bytes]]:
        for found in self._lanes.scan(lane, *scope_, **options):
            self.scanned += 1
            yield found
