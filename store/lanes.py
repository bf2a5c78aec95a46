"""`LaneStore`: the one LevelDB database, addressed by `LaneKey`s.

It knows nothing of HTTP or policy. Writes are synced by default, and keys that
change together go through one `WriteBatch`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import plyvel

from store.keys import LaneKey, TenantResourceLane, decode_key, scope_prefix


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
    """One LevelDB database under `path`. LevelDB admits a single process."""

    def __init__(self, path: Path) -> None:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = path
        # No compression: stored bytes stay greppable, so "no raw text on disk" can be audited.
        self._db: Any = plyvel.DB(
            str(path), create_if_missing=True, paranoid_checks=True, compression=None
        )

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

    @property
    def closed(self) -> bool:
        return bool(self._db.closed)

    def close(self) -> None:
        if not self._db.closed:
            self._db.close()
