"""The lane-store contract: what the chains, the session store and the journal need of a store.

Each backend is one class in a module of its own beside this one (the embedded
LevelDB in `leveldb.py`, PostgreSQL in `postgres.py`), registered by name in
`registry.py`. One parametrised suite (tests/store/test_lane_store_contract.py)
holds each to it. The contract has four parts:

- a read-only view (`LaneView`: get, scan, count, close), what a review or an
  impact run reads through;
- the core every backend keeps (`Lanes`: the view, a batch that commits
  together with its compare-and-set `expect`, a hold on a key, whether it
  takes writes, and the `Capabilities` it declares);
- optional capabilities, each a small Protocol the backend declares in its
  `Capabilities` and callers ask for by that declaration (`recovers`,
  `drops_log_tail`, `probes`), never by the backend's class;
- how a backend is opened (`Backend`: by location and `Mode`) and upgraded.

What the operations promise:

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
  was under way, or COMMIT did not answer within the store's timeout, as while
  it waits for a synchronous standby that is not there; LevelDB when the record reached its log whole but the sync
  failed). A latched store refuses writes (`StoreUnwritable`, nothing done)
  until `reopen()` has succeeded, so a writer that caches what it wrote (the
  journal's chain heads) reads it again first.
- `expunge` after a batch that deleted keys makes their values gone from the store's
  files where the engine keeps copies of them (LevelDB's tables and log), so an
  erasure leaves no bytes of what it erased behind.
- Lanes with no tenant component are keys too. A batch may mix tenants: on a
  store of one process (LevelDB) the journal's batches do (every tenant's chain
  shares one batch), while a store that declares `one_tenant_per_transaction`
  (PostgreSQL) gets batches that each hold one tenant's chain.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Protocol, TypeGuard

from store.key_codec import LaneKey, TenantResourceLane


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


class LocationInvalid(ValueError):
    """A backend cannot be at the location given; the message never quotes the location."""


class StoreUpgradeRefused(RuntimeError):
    """The database answered but refused a step of the upgrade; nothing of that step stayed."""


class Mode(StrEnum):
    """What a store is opened for."""

    SERVE = "serve"  # the service's own handle: reads and writes
    REVIEW = "review"  # a review's: every block read once at open where the engine can
    READ_ONLY = "read_only"  # nothing is written, not even an engine's own files


@dataclass(frozen=True)
class Capabilities:
    """What a backend declares of itself, so that callers ask this rather than its class."""

    shared: bool  # many processes may open it at once (else one process only)
    one_tenant_per_transaction: bool  # every batch touches one tenant's keys
    repair: bool  # `sessionstate db repair` rebuilds it
    connections: int  # operations it runs at once (a pool's size; 1 for an embedded engine)
    recovery: bool  # it reopens after a latched write and counts both (`Recovery`)
    log_tail: bool  # it drops a torn log tail at open and says how much (`LogTail`)
    probe: bool  # it answers readiness probes over the network (`Probe`)


class LaneBatch(Protocol):
    def put(self, key: LaneKey, value: bytes) -> None: ...
    def delete(self, key: LaneKey) -> None: ...
    def expect(self, key: LaneKey, value: bytes | None) -> None:
        """Commit only if key holds exactly value at commit time (None: key absent)."""
        ...


class LaneView(Protocol):
    """A lane store read, never written: what a review or an impact run needs."""

    def get(self, key: LaneKey) -> bytes | None: ...

    def get_many(self, keys: Sequence[LaneKey]) -> list[bytes | None]:
        """The values of keys, in their order (None: absent), read in one pass: one reader
        on an embedded engine, one statement a tenant on a server."""
        ...

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

    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...


class Lanes(LaneView, Protocol):
    """The core of a lane store, whichever engine holds it: every backend keeps this."""

    @property
    def capabilities(self) -> Capabilities: ...

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

    def expunge(self, lane: TenantResourceLane, *scope: str) -> bool:
        """Make what was deleted under lane and the leading scope components gone from the
        store's own files, as far as the engine can: an erasure's bytes, after its batch.

        LevelDB rewrites the files that held the range (and its write-ahead log), so no
        copy of a deleted value stays on disk; False when a read that began before the
        deletion kept a snapshot of it all the while (nothing is lost: call it again).
        PostgreSQL has nothing more to do once the rows are deleted: True (their dead
        tuples and WAL are the server's; docs/compliance.md says what that means).
        Raises `StoreOffline` (or `StoreUnwritable`) when it cannot be done now.
        """
        ...


class Recovery(Protocol):
    """Capability `recovery`: reopening after a latched write, and counting both."""

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


class LogTail(Protocol):
    """Capability `log_tail`: what opening dropped from the engine's own write-ahead log."""

    @property
    def dropped_log_bytes(self) -> int: ...

    def acknowledge_dropped_log_bytes(self) -> None:
        """The dropped bytes were reported; later opens no longer carry them."""
        ...


class ProbeWrite(StrEnum):
    """What a bounded probe write found."""

    COMMITTED = "committed"
    REFUSED = "refused"  # a step failed or timed out: a lock held elsewhere, a read-only server
    COMMIT_UNCONFIRMED = "commit_unconfirmed"  # COMMIT did not answer within the bound


class Probe(Protocol):
    """Capability `probe`: a store across the network, asked whether it answers and writes."""

    def reachable(self, timeout: float = 1.0) -> bool: ...

    def write_probe(self, timeout: float = 1.0) -> ProbeWrite: ...

    def sync_standby_missing(self, timeout: float = 1.0) -> bool | None:
        """Whether COMMITs wait for synchronous standbys that are not connected (None: it
        cannot be told, e.g. the role may not read the replication views)."""
        ...


class RecoveringLanes(Lanes, Recovery, Protocol): ...


class LogTailLanes(Lanes, LogTail, Protocol): ...


class ProbedLanes(Lanes, Probe, Protocol): ...


def recovers(lanes: Lanes) -> TypeGuard[RecoveringLanes]:
    return lanes.capabilities.recovery


def drops_log_tail(lanes: Lanes) -> TypeGuard[LogTailLanes]:
    return lanes.capabilities.log_tail


def probes(lanes: Lanes) -> TypeGuard[ProbedLanes]:
    return lanes.capabilities.probe


@dataclass(frozen=True)
class SchemaVersions:
    """A store's schema version before and after an upgrade (None: it has no schema)."""

    found: int | None
    now: int | None


class Backend(Lanes, Protocol):
    """A backend's class: its name, what it declares, and how a location is opened.

    A location is the text that finds the store (a directory, a connection string);
    it may carry a secret, so only `shown(location)` is ever printed.
    """

    NAME: ClassVar[str]
    CAPABILITIES: ClassVar[Capabilities]
    SETTING_FORMS: ClassVar[str | None]  # what a setting naming it looks like; None: never named

    @classmethod
    def claims(cls, location: str) -> bool:
        """Whether a configured location is meant for this backend (right or wrong)."""
        ...

    @classmethod
    def shown(cls, location: str) -> str:
        """What may be shown of location; `LocationInvalid` when it cannot be this store's."""
        ...

    @classmethod
    def present(cls, location: str) -> bool:
        """Whether there is a store at location to open (an embedded one may not exist yet)."""
        ...

    @classmethod
    def open(cls, location: str, mode: Mode) -> Lanes:
        """Open the store at location for mode; `StoreOffline` (or the engine's own open
        errors) when it cannot be."""
        ...

    @classmethod
    def upgrade(cls, location: str) -> SchemaVersions:
        """Bring the store's schema to this code's version (`StoreOffline`,
        `StoreUpgradeRefused`)."""
        ...


def reachable(lanes: Lanes) -> bool:
    """Whether the store answers now (across the network: a probe; embedded: it is open)."""
    if probes(lanes):
        return lanes.reachable()
    return not lanes.closed


def takes_writes(lanes: Lanes) -> ProbeWrite | None:
    """A store across the network: whether a probe write commits now, bounded. An embedded
    one: None, since this process alone writes it and `writable` says all there is to say."""
    if probes(lanes):
        return lanes.write_probe()
    return None


def sync_standby_missing(lanes: Lanes) -> bool | None:
    """A store across the network: whether its COMMITs wait for a synchronous standby that is
    not there. An embedded one: None."""
    if probes(lanes):
        return lanes.sync_standby_missing()
    return None
