"""`LevelDBLaneStore`: the embedded backend, one LevelDB database addressed by `LaneKey`s.

It knows nothing of HTTP or policy. Writes are synced by default, and keys that
change together go through one `WriteBatch`. It keeps the lane-store contract
(store/backends/contract.py): a batch's `expect` is checked under a lock that
every write of this handle takes, and LevelDB admits only this process. Its
location is a directory (`leveldb` under the data dir when no other store is
configured); it has no schema to upgrade.

A failed write latches the store read-only. LevelDB makes only a failed sync
sticky: after a failed append (a full disk, say) it keeps appending behind the
torn record, and at the next open it drops the torn record together with the
acknowledged writes that landed behind it. So after any failed write nothing
more is written through this handle; `reopen()` closes it and opens the
database again, which drops the torn tail (an unacknowledged write) and keeps
every acknowledged one, and only then are writes accepted again.

A failed append left nothing or a torn record (dropped at reopen): nothing of
the write happened, `StoreUnwritable`. A synced write whose record reached the
log whole but whose sync failed may be replayed at reopen: its outcome is
unknown, `StoreOutcomeUnknown` (`store.embedded.log_tail.may_have_landed` tells them
apart from the log's end before and after the write).

Modes: `serve` opens the directory; `review` also reads every stored block
once; `read_only` opens a copy taken under a shared lock on LevelDB's `LOCK`
(LevelDB writes to the directory it opens: its own log, a new manifest), which
refuses writes and is deleted at close.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import takewhile
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from store.backends.contract import (
    Backend,
    Capabilities,
    ExpectationFailed,
    LaneBatch,
    LogTailLanes,
    Mode,
    RecoveringLanes,
    SchemaVersions,
    StoreOffline,
    StoreOutcomeUnknown,
    StoreUnwritable,
)
from store.embedded.integrity import StoreBusy, check_tables, open_leveldb
from store.embedded.log_tail import (
    LogMark,
    forget_log_drops,
    log_mark,
    may_have_landed,
    remember_log_drop,
    torn_log_tail,
)
from store.key_codec import (
    LaneKey,
    TenantResourceLane,
    decode_key,
    key_range,
    lane_prefix,
    scope_prefix,
)

# Reopening replays the write-ahead log into a new table: room for the logs, and a margin.
REOPEN_MARGIN_BYTES = 4 * 1024 * 1024
READER_WAIT_SECONDS = 10.0
# Past every key under a prefix: a key's tail after its scope is at most 256 bytes.
_PAST_EVERY_KEY = b"\xff" * 257
DIRECTORY = "leveldb"  # its directory under a data dir


class _PlyvelBatch:
    def __init__(self, batch: Any) -> None:
        self._batch = batch
        self.expected: dict[bytes, bytes | None] = {}

    def put(self, key: LaneKey, value: bytes) -> None:
        self._batch.put(key.encode(), value)

    def delete(self, key: LaneKey) -> None:
        self._batch.delete(key.encode())

    def expect(self, key: LaneKey, value: bytes | None) -> None:
        self.expected[key.encode()] = value


class LevelDBLaneStore:
    """One LevelDB database under `path`. LevelDB admits a single process.

    Opening raises `StoreBusy`, `StoreCorrupt` or `StoreUnavailable` (store.embedded.integrity)
    with a one-line message. `read_every_block` also reads every stored block once,
    checksums verified, so a flipped byte anywhere fails the open rather than a read.
    `dropped_log_bytes` is what LevelDB dropped from its write-ahead log at this open
    and at earlier ones that no service has reported yet (store.embedded.log_tail).
    """

    NAME: ClassVar[str] = "leveldb"
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(
        shared=False,
        one_tenant_per_transaction=False,
        repair=True,
        connections=1,
        recovery=True,
        log_tail=True,
        probe=False,
    )
    SETTING_FORMS: ClassVar[str | None] = None  # the embedded store: never named by a setting

    def __init__(self, path: Path, *, read_every_block: bool = False) -> None:
        self.path = path
        self.dropped_log_bytes = 0
        self._db: Any = self._open(read_every_block=read_every_block)
        self._write_failed = False
        self._refusal: str | None = None  # why every write is refused (opened read-only)
        self._scratch: tempfile.TemporaryDirectory[str] | None = None  # a read-only copy's
        self._exclusive: dict[bytes, threading.Lock] = {}
        self._exclusive_guard = threading.Lock()
        self.write_failures = 0  # failed writes so far (each latched the store)
        self.reopens = 0  # successful reopens after a failed write
        # Readers in flight, so a reopen never closes the database under one of them.
        self._gate = threading.Condition()
        self._readers = 0
        # Readers by the epoch they began in: an expunge waits for those before its own.
        self._epoch = 0
        self._readers_in: Counter[int] = Counter()
        self._reopening = False
        # Writes of this handle, one at a time: a batch's `expect` is checked and its
        # writes land with no other write of this process in between.
        self._commit = threading.Lock()

    # -- as a backend ----------------------------------------------------------

    @classmethod
    def claims(cls, location: str) -> bool:
        return False  # only ever the data dir's own store

    @classmethod
    def shown(cls, location: str) -> str:
        return location

    @classmethod
    def present(cls, location: str) -> bool:
        return Path(location).is_dir()

    @classmethod
    def open(cls, location: str, mode: Mode) -> LevelDBLaneStore:
        path = Path(location)
        if mode is Mode.SERVE:
            return cls(path)
        if mode is Mode.REVIEW:
            return cls(path, read_every_block=True)
        scratch = tempfile.TemporaryDirectory(prefix="sessionstate-leveldb-")
        try:
            store = cls(copy_of(path, Path(scratch.name) / DIRECTORY))
        except BaseException:
            scratch.cleanup()
            raise
        store._scratch = scratch
        store._refusal = "the store was opened read-only"
        return store

    @classmethod
    def upgrade(cls, location: str) -> SchemaVersions:
        return SchemaVersions(None, None)  # no schema to upgrade yet

    @property
    def capabilities(self) -> Capabilities:
        return self.CAPABILITIES

    def _open(self, *, read_every_block: bool = False) -> Any:
        torn = torn_log_tail(self.path)
        db = open_leveldb(self.path)
        # Remembered before anything else can fail: the open has already dropped them.
        self.dropped_log_bytes = remember_log_drop(self.path, torn)
        try:
            check_tables(db, self.path, read_every_block=read_every_block)
        except BaseException:
            db.close()
            raise
        return db

    def acknowledge_dropped_log_bytes(self) -> None:
        """The dropped bytes were reported; later opens no longer carry them."""
        forget_log_drops(self.path)
        self.dropped_log_bytes = 0

    # -- reads ---------------------------------------------------------------

    @contextmanager
    def _reading(self) -> Iterator[Any]:
        with self._gate:
            if self._reopening or self._db.closed:
                raise StoreOffline("the store is being reopened or is closed")
            self._readers += 1
            epoch = self._epoch
            self._readers_in[epoch] += 1
        try:
            yield self._db
        finally:
            with self._gate:
                self._readers -= 1
                self._readers_in[epoch] -= 1
                if not self._readers_in[epoch]:
                    del self._readers_in[epoch]
                    self._gate.notify_all()

    def get(self, key: LaneKey) -> bytes | None:
        with self._reading() as db:
            value: bytes | None = db.get(key.encode())
            return value

    def get_many(self, keys: Sequence[LaneKey]) -> list[bytes | None]:
        encoded = [key.encode() for key in keys]
        with self._reading() as db:
            return [db.get(raw) for raw in encoded]

    def scan(
        self,
        lane: TenantResourceLane,
        *scope: str,
        reverse: bool = False,
        start: LaneKey | None = None,
        stop: LaneKey | None = None,
    ) -> Iterator[tuple[LaneKey, bytes]]:
        """Keys and values of lane under the leading scope components, in key order; from
        `start` on and before `stop`, when given (seeks: nothing outside is read)."""
        prefix = scope_prefix(lane, *scope)
        with self._reading() as db:
            if start is None and stop is None:
                iterator = db.iterator(prefix=prefix, reverse=reverse)
            else:
                low, high = key_range(prefix, start, stop)
                if high is not None and low >= high:
                    return
                # plyvel (1.5) yields nothing from a reverse iterator whose first key is its
                # `start`: a range of one key would read as empty. So a reverse scan is
                # bounded by `stop` alone, and ends at the first key below `low`.
                iterator = (
                    takewhile(lambda item: item[0] >= low, db.iterator(stop=high, reverse=True))
                    if reverse
                    else db.iterator(start=low, stop=high)
                )
            for raw_key, value in iterator:
                yield decode_key(raw_key), value

    def count(self, lane: TenantResourceLane) -> int:
        """Keys in lane."""
        with self._reading() as db:
            return sum(1 for _ in db.iterator(prefix=lane_prefix(lane), include_value=False))

    # -- writes --------------------------------------------------------------

    @property
    def writable(self) -> bool:
        """False from a failed write until a successful `reopen()`."""
        return not self._write_failed and self._refusal is None and not self._db.closed

    def put(self, key: LaneKey, value: bytes, *, sync: bool = True) -> None:
        with self._writing(sync) as db:
            db.put(key.encode(), value, sync=sync)

    def delete(self, key: LaneKey, *, sync: bool = True) -> None:
        with self._writing(sync) as db:
            db.delete(key.encode(), sync=sync)

    @contextmanager
    def batch(self, *, sync: bool = True) -> Iterator[LaneBatch]:
        """All puts and deletes inside commit together, or not at all on error."""
        with self._reading() as db:
            self._check_writable()
            batch = db.write_batch(sync=sync)
            pending = _PlyvelBatch(batch)
            yield pending  # an error in the body leaves the batch unwritten
            with self._commit:
                for key, value in pending.expected.items():
                    if db.get(key) != value:
                        raise ExpectationFailed("a key of the batch changed; nothing was written")
                before = log_mark(self.path) if sync else None
                try:
                    batch.write()
                except Exception as error:
                    self._latch(error, sync, before)

    def expunge(self, lane: TenantResourceLane, *scope: str) -> bool:
        """Rewrite the tables that hold the range under lane and scope, so that no value
        deleted in it stays in a file: a range compaction drops a deleted value only where
        it meets its deletion, which a flushed memtable's table may hold beside it at the
        bottom (never compacted again), so the range is compacted twice, each time after
        deletions of two keys that bracket it (no key is ever stored at either) so that
        its tables are pushed down through every level that holds the range. The write-
        ahead log goes with the flushed memtable. A snapshot keeps what it sees: the
        readers that began before this call are waited for (at most READER_WAIT_SECONDS;
        False when one still reads then: what it kept stays until the next expunge)."""
        low = scope_prefix(lane, *scope)
        high = low + _PAST_EVERY_KEY
        with self._gate:
            self._epoch += 1
            epoch = self._epoch
            settled = self._gate.wait_for(
                lambda: all(began >= epoch for began in self._readers_in),
                timeout=READER_WAIT_SECONDS,
            )
        for _ in range(2):
            with self._writing(True) as db:
                brackets = db.write_batch(sync=True)
                brackets.delete(low)
                brackets.delete(high)
                brackets.write()
            with self._reading() as db:
                db.compact_range(start=low, stop=high)
        return settled

    @contextmanager
    def exclusive(self, key: LaneKey) -> Iterator[None]:
        """Hold key against the other threads holding it (one process owns a LevelDB)."""
        with self._exclusive_guard:
            held = self._exclusive.setdefault(key.encode(), threading.Lock())
        with held:
            yield

    @contextmanager
    def _writing(self, sync: bool) -> Iterator[Any]:
        with self._reading() as db:
            self._check_writable()
            with self._commit:
                before = log_mark(self.path) if sync else None
                try:
                    yield db
                except Exception as error:
                    self._latch(error, sync, before)

    def _check_writable(self) -> None:
        if self._refusal is not None:
            raise StoreUnwritable(self._refusal)
        if self._write_failed:
            raise StoreUnwritable("a write failed; the store has not been reopened since")

    def _latch(self, error: Exception, synced: bool, before: LogMark) -> None:
        """Refuse writes from now on. Only a synced write can fail after its record is whole
        in the log (`before`: where the log ended); an unsynced one left nothing, or a torn
        record that the reopen drops."""
        self._write_failed = True
        self.write_failures += 1
        if synced and may_have_landed(self.path, before):
            raise StoreOutcomeUnknown(
                "the write's sync failed after its record reached the log; its outcome is unknown"
            ) from error
        raise StoreUnwritable("the write failed; nothing of it was acknowledged") from error

    # -- recovery ------------------------------------------------------------

    def room_to_reopen(self) -> bool:
        """Whether the file system has room to replay the write-ahead log into a table."""
        logs = sum(log.stat().st_size for log in self.path.glob("*.log"))
        return shutil.disk_usage(self.path).free >= logs + REOPEN_MARGIN_BYTES

    def reopen(self) -> None:
        """Close and open the database again; writes are accepted again once it opened.

        Waits for readers in flight; new ones get `StoreOffline` meanwhile. If
        the open fails (no room yet, say), the store stays closed and unwritable,
        and `reopen()` may be called again.
        """
        with self._gate:
            self._reopening = True
            if not self._gate.wait_for(lambda: self._readers == 0, timeout=READER_WAIT_SECONDS):
                self._reopening = False
                raise StoreOffline("readers did not finish; the store was not reopened")
        try:
            if not self._db.closed:
                self._db.close()
            self._db = self._open()
            self._write_failed = False
            self.reopens += 1
        finally:
            with self._gate:
                self._reopening = False

    @property
    def closed(self) -> bool:
        return bool(self._db.closed)

    def close(self) -> None:
        with self._gate:
            self._gate.wait_for(lambda: self._readers == 0, timeout=10)
            if not self._db.closed:
                self._db.close()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None


def copy_of(database: Path, into: Path) -> Path:
    """A copy of the LevelDB at `database`, taken while no other process can hold it
    (`StoreBusy` while one does)."""
    if not (database / "CURRENT").is_file():
        raise FileNotFoundError(f"no sessionstate database at {database}")
    try:
        lock = os.open(database / "LOCK", os.O_RDONLY)
    except FileNotFoundError:
        lock = None
    try:
        if lock is not None:
            try:  # LevelDB holds a write lock on LOCK while it is open; a read lock conflicts
                fcntl.lockf(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                raise StoreBusy(database) from None
        shutil.copytree(database, into, ignore=shutil.ignore_patterns("LOCK"))
    finally:
        if lock is not None:
            os.close(lock)
    return into


if TYPE_CHECKING:  # it keeps the contract and the capabilities it declares (mypy checks these)
    _BACKEND: type[Backend] = LevelDBLaneStore
    _RECOVERS: type[RecoveringLanes] = LevelDBLaneStore
    _LOG_TAIL: type[LogTailLanes] = LevelDBLaneStore
