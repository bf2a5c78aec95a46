"""Which store the service keeps its lanes in: `SESSIONSTATE_STORE`, parsed, opened, upgraded.

Unset, the lanes live in the embedded LevelDB under the data dir. Set to a
libpq connection string (a `postgresql://` URI or `key=value` pairs, multi-host
ones included), every lane lives in that PostgreSQL database
(`store.backends.postgres`). The connection string may carry a password: it
is never printed, logged or reported; `StoreTarget.target` is what may be
shown (`host:port/db`, without user or password).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

from service.settings import Settings
from store.backends import postgres_schema
from store.backends.contract import Lanes, StoreOffline
from store.backends.postgres import PostgresLaneStore
from store.lanes import LaneStore

VARIABLE = "SESSIONSTATE_STORE"
_URI_SCHEMES = ("postgresql://", "postgres://")


class StoreKind(StrEnum):
    LEVELDB = "leveldb"
    POSTGRESQL = "postgresql"


class StoreSettingInvalid(ValueError):
    """`SESSIONSTATE_STORE` cannot be a store; the message names the variable, never its value."""


class StoreUpgradeRefused(RuntimeError):
    """The database answered but refused a step of the upgrade; nothing of that step stayed."""


@dataclass(frozen=True)
class StoreTarget:
    """The configured store: its kind, what may be shown of it, and how to reach it."""

    kind: StoreKind
    target: str  # LevelDB: its directory; PostgreSQL: host:port/db, no user, no password
    conninfo: str | None = field(default=None, repr=False)  # PostgreSQL only: a secret
    leveldb_path: Path | None = None

    @property
    def shared(self) -> bool:
        """Whether more than one process may open it at once."""
        return self.kind is StoreKind.POSTGRESQL


def store_target(settings: Settings) -> StoreTarget:
    """The store `settings` name; `StoreSettingInvalid` for a value that cannot be one."""
    text = settings.store
    if text is None:
        path = settings.data_dir / "leveldb"
        return StoreTarget(StoreKind.LEVELDB, str(path), leveldb_path=path)
    text = text.strip()
    if not text:
        raise StoreSettingInvalid(
            f"{VARIABLE} is empty: unset it for the embedded LevelDB, "
            "or set a PostgreSQL connection string"
        )
    if "://" in text and not text.startswith(_URI_SCHEMES):
        raise StoreSettingInvalid(
            f"{VARIABLE} must be a postgresql:// URI or libpq key=value pairs"
        )
    if "://" not in text and "=" not in text:
        raise StoreSettingInvalid(
            f"{VARIABLE} must be a postgresql:// URI or libpq key=value pairs"
        )
    try:
        params = conninfo_to_dict(text)
    except psycopg.Error:  # its message quotes the string: not shown
        raise StoreSettingInvalid(
            f"{VARIABLE} is not a valid libpq connection string "
            "(a postgresql:// URI or key=value pairs)"
        ) from None
    return StoreTarget(StoreKind.POSTGRESQL, shown_target(params), conninfo=text)


def shown_target(params: Mapping[str, object]) -> str:
    """`host:port[,host:port]/db` from libpq parameters: no user, no password, no options."""
    hosts = str(params.get("host") or params.get("hostaddr") or "local").split(",")
    ports = str(params.get("port") or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    pairs = [
        f"{host}:{port}" if port else host
        for host, port in zip(hosts, ports + [""] * (len(hosts) - len(ports)), strict=False)
    ]
    dbname = str(params.get("dbname") or "")
    return ",".join(pairs) + (f"/{dbname}" if dbname else "")


def open_lanes(store: StoreTarget) -> Lanes:
    """Open the configured store (PostgreSQL: `StoreOffline`, `SchemaMismatch` on the way)."""
    if store.kind is StoreKind.POSTGRESQL:
        assert store.conninfo is not None
        return PostgresLaneStore(store.conninfo)
    assert store.leveldb_path is not None
    return LaneStore(store.leveldb_path)


def reachable(lanes: Lanes) -> bool:
    """Whether the store answers now (PostgreSQL: a `SELECT 1`; LevelDB: it is open)."""
    if isinstance(lanes, PostgresLaneStore):
        return lanes.reachable()
    return not lanes.closed


def takes_writes(lanes: Lanes) -> bool | None:
    """PostgreSQL: whether a probe write commits now, bounded (`write_probe`). LevelDB: None,
    since this process alone writes it and `writable` says all there is to say."""
    if isinstance(lanes, PostgresLaneStore):
        return lanes.write_probe()
    return None


@dataclass(frozen=True)
class StoreUpgrade:
    """What `sessionstate db upgrade` did, as it prints it."""

    store: StoreKind
    target: str
    found: int | None
    now: int | None

    @property
    def changed(self) -> bool:
        return self.found != self.now


def upgrade(store: StoreTarget) -> StoreUpgrade:
    """Bring the configured store's schema to this code's version.

    PostgreSQL: create or upgrade its tables and record the version. LevelDB
    has no schema to upgrade yet (its version is `None`).
    """
    if store.kind is StoreKind.LEVELDB:
        return StoreUpgrade(store.kind, store.target, None, None)
    assert store.conninfo is not None
    try:
        done = postgres_schema.upgrade(store.conninfo)
    except psycopg.OperationalError:
        raise StoreOffline(
            f"cannot reach the PostgreSQL store at {store.target} ({VARIABLE})"
        ) from None
    except psycopg.Error as error:  # e.g. no right to create tables: the state, not the text
        raise StoreUpgradeRefused(
            f"the PostgreSQL store at {store.target} refused the schema upgrade "
            f"(SQLSTATE {error.sqlstate or 'unknown'})"
        ) from None
    return StoreUpgrade(store.kind, store.target, done.found, done.now)
