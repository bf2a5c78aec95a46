"""The backends by name: a new backend is a module beside the others and one line here.

`EMBEDDED` is the store a data dir holds when no other is configured; a
configured location goes to the backend that `claims` it.
"""

from __future__ import annotations

from pathlib import Path

from store.backends import leveldb
from store.backends.contract import Backend
from store.backends.leveldb import LevelDBLaneStore
from store.backends.postgres import PostgresLaneStore

BACKENDS: dict[str, type[Backend]] = {
    LevelDBLaneStore.NAME: LevelDBLaneStore,
    PostgresLaneStore.NAME: PostgresLaneStore,
}
EMBEDDED: type[Backend] = LevelDBLaneStore


def embedded_location(data_dir: Path) -> str:
    """Where the embedded store lives in a data dir."""
    return str(data_dir / leveldb.DIRECTORY)


def backend(name: str) -> type[Backend]:
    """The backend registered under name (`KeyError` for a name none has)."""
    return BACKENDS[name]


def claiming(location: str) -> type[Backend] | None:
    """The backend a configured location is meant for; None when none claims it."""
    return next((found for found in BACKENDS.values() if found.claims(location)), None)


def setting_forms() -> str:
    """What a setting naming a backend may look like, for the message that refuses one."""
    return " or ".join(
        found.SETTING_FORMS for found in BACKENDS.values() if found.SETTING_FORMS is not None
    )
