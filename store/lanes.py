"""`LaneStore`: the one LevelDB database, addressed by `LaneKey`s.

It knows nothing of HTTP or policy. Writes are synced by default, and keys that
change together go through one `WriteBatch`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from store.integrity import check_tables, open_leveldb
from store.keys import LaneKey, TenantResourceLane, decode_key, lane_prefix, scope_prefix
from store.log_tail import forget_log_drops, remember_log_drop, torn_log_tail


class LaneBatch(Protocol):
    def put(self, key: LaneKey, value: bytes) -> None: ...
    def delete(self, key: LaneKey) -> None: ...


class _PlyvelBatch:
    def __init__(self, batch: Any) -> None:
        self._batch = batch

    def put(self, key: LaneKey, value: bytes) -> None:
        self._batch.put(key.encode(), value)

    def delete(self, key: LaneKey) -> None:
        self._batch.delete(key.encode())


class LaneStore:
    """One LevelDB database under `path`. LevelDB admits a single process.

    Opening raises `StoreBusy`, `StoreCorrupt` or `StoreUnavailable` (store.integrity)
    with a one-line message. `read_every_block` also reads every stored block once,
    checksums verified, so a flipped byte anywhere fails the open rather than a read.
    `dropped_log_bytes` is what LevelDB dropped from its write-ahead log at this open
    and at earlier ones that no service has reported yet (store.log_tail).
    """

    def __init__(self, path: Path, *, read_every_block: bool = False) -> None:
        self.path = path
        torn = torn_log_tail(path)
        db = open_leveldb(path)
        # Remembered before anything else can fail: the open has already dropped them.
        self.dropped_log_bytes = remember_log_drop(path, torn)
        try:
            check_tables(db, path, read_every_block=read_every_block)
        except BaseException:
            db.close()
            raise
        self._db: Any = db

    def acknowledge_dropped_log_bytes(self) -> None:
        """The dropped bytes were reported; later opens no longer carry them."""
        forget_log_drops(self.path)
        self.dropped_log_bytes = 0

    def get(self, key: LaneKey) -> bytes | None:
        value: bytes | None = self._db.get(key.encode())
        return value

    def put(self, key: LaneKey, value: bytes, *, sync: bool = True) -> None:
        self._db.put(key.encode(), value, sync=sync)

    def delete(self, key: LaneKey, *, sync: bool = True) -> None:
        self._db.delete(key.encode(), sync=sync)

    @contextmanager
    def batch(self, *, sync: bool = True) -> Iterator[LaneBatch]:
        """All puts and deletes inside commit together, or not at all on error."""
        with self._db.write_batch(transaction=True, sync=sync) as batch:
            yield _PlyvelBatch(batch)

    def scan(
        self, lane: TenantResourceLane, *scope: str, reverse: bool = False
    ) -> Iterator[tuple[LaneKey, bytes]]:
        """Keys and values of lane under the leading scope components, in key order."""
        for raw_key, value in self._db.iterator(prefix=scope_prefix(lane, *scope), reverse=reverse):
            yield decode_key(raw_key), value

    def count(self, lane: TenantResourceLane) -> int:
        """Keys in lane."""
        return sum(1 for _ in self._db.iterator(prefix=lane_prefix(lane), include_value=False))

    @property
    def closed(self) -> bool:
        return bool(self._db.closed)

    def close(self) -> None:
        if not self._db.closed:
            self._db.close()
