"""The lane-store contract: what the chains, the session store and the journal need of a store.

Two backends keep it: the embedded LevelDB (`store.lanes.LaneStore`) and
PostgreSQL (`store.backends.postgres.PostgresLaneStore`). One parametrised
suite (tests/test_lane_store_contract.py) holds both to it.

- Keys are `LaneKey`s; values are bytes, returned exactly as written.
- A batch commits all its puts and deletes together, or nothing of them (an
  exception in its body writes nothing). An `expect` in it makes the commit
  conditional: the batch commits only if the key holds exactly those bytes
  (None: the key is absent) at commit time, else `ExpectationFailed` and
  nothing is written. That is compare-and-set across processes as well as
  threads.
- Scans are in key order (bytewise, as LevelDB orders keys), optionally
  reversed, over the keys under a lane and leading scope components; with no
  scope they cross tenants. A scan may start at a key and stop before one,
  seeking to them: the keys outside are never read. A scan sees every key that stays in place while
  it runs; LevelDB reads one snapshot, PostgreSQL a page at a time, so keys
  written meanwhile may or may not show.
- A store that cannot be reached or read now raises `StoreOffline`, and
  nothing of the operation happened. A failed write latches the store and
  raises `StoreUnwritable` when nothing of it happened (LevelDB after a failed
  append: its torn record is dropped at reopen), or `StoreOutcomeUnknown`
  when it may have landed (PostgreSQL when the connection broke while COMMIT
  was under way; LevelDB when the record reached its log whole but the sync
  failed). A latched store refuses writes (`StoreUnwritable`, nothing done)
  until `reopen()` has succeeded, so a writer that caches what it wrote (the
  journal's chain heads) reads it again first.
- Lanes with no tenant component are keys too. A batch may mix tenants: on
  LevelDB the journal's batches do (every tenant's chain shares one batch),
  while on PostgreSQL each of its batches holds one tenant's chain.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Protocol

from store.keys import LaneKey, TenantResourceLane


class StoreOffline(RuntimeError):
    """The open store cannot be read or written now; nothing of the operation happened."""


class StoreUnwritable(StoreOffline):
    """A write failed, or the store refuses writes until it has been reopened; nothing of
    this operation happened (but see `StoreOutcomeUnknown`)."""


class StoreOutcomeUnknown(StoreUnwritable):
    """A write failed after it may have landed: whether it did is unknown (it is either
    wholly there or wholly absent). The store is latched as after any failed write."""


class ExpectationFailed(Exception):
    """A batch's `expect` did not hold at commit: nothing of the batch was written."""


class LaneBatch(Protocol):
    def put(self, key: LaneKey, value: bytes) -> None: ...
    def delete(self, key: LaneKey) -> None: ...
    def expect(self, key: LaneKey, value: bytes | None) -> None:
        """Commit only if key holds exactly value at commit time (None: key absent)."""
        ...


class Lanes(Protocol):
    """A lane store, whichever engine holds it."""

    def get(self, key: LaneKey) -> bytes | None: ...

    def scan(
        self,
        lane: TenantResourceLane,
        *scope: str,
        reverse: bool = False,
        start: LaneKey | None = None,
        stop: LaneKey | None = None,
    ) -> Iterator[tuple[LaneKey, bytes]]:
        """Keys and values of lane under the leading scope components, in key order.

        `start` keeps only keys at or after it, `stop` only keys before it. Both are
        seeks: a scan between them never reads the keys outside, so its cost follows
        what it returns, not what the lane holds.
        """
        ...

    def count(self, lane: TenantResourceLane) -> int: ...

    def put(self, key: LaneKey, value: bytes, *, sync: bool = True) -> None: ...

    def delete(self, key: LaneKey, *, sync: bool = True) -> None: ...

    def batch(self, *, sync: bool = True) -> AbstractContextManager[LaneBatch]:
        """All puts and deletes inside commit together, or not at all on error."""
        ...

    def exclusive(self, key: LaneKey) -> AbstractContextManager[None]:
        """Hold key against every other holder of it, in this process or any other, until
        the block ends: writers of one decision chain take turns instead of racing.

        Reads inside see every write committed before the hold began. A key not stored yet
        holds nothing, and neither does a hold that could not be had within the store's
        timeout: writers then race, and their batches' expectations still keep them from
        overwriting each other. Raises `StoreOffline` when the store cannot be reached.
        """
        ...

    @property
    def writable(self) -> bool:
        """False from a latching write failure until a successful `reopen()`."""
        ...

    @property
    def write_failures(self) -> int:
        """Writes so far that latched the store."""
        ...

    @property
    def reopens(self) -> int:
        """Successful reopens after a latched write."""
        ...

    def room_to_reopen(self) -> bool: ...

    def reopen(self) -> None:
        """Accept writes again once the store is known to be readable; else `StoreOffline`."""
        ...

    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...
