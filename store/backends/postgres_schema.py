"""The PostgreSQL store's schema: created and upgraded by `upgrade`, checked by `check`.

Every table has `tenant_id` as the leading column of its primary key, so an
engine that shards by tenant (Citus with `tenant_id` as distribution column,
CockroachDB) keeps each tenant's rows together. Rows that name no tenant use
`tenant_id = ''`, which no tenant id can be (scope ids are never empty).
Even the version table follows the rule: its rows are the store's own, so
they name no tenant.

Each upgrade step runs in one transaction together with the row recording its
version, so a step is applied whole or not at all. A store refuses to open on
a schema older than the code's (not yet upgraded) or newer (written by a
newer sessionstate), with a message that says what to do.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

SCHEMA_VERSION = 2
NO_TENANT = ""
LANES_TABLE = "sessionstate_lanes"
VERSION_TABLE = "sessionstate_schema"
PROBE_TABLE = "sessionstate_probe"  # the readiness probe's row: `PostgresLaneStore.write_probe`

_VERSION_TABLE_DDL = f"""
CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (
    tenant_id text NOT NULL,
    version integer NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, version)
)
"""

# Step n brings the schema from version n - 1 to n. Portable SQL only.
_STEPS: dict[int, tuple[str, ...]] = {
    1: (
        f"""
        CREATE TABLE {LANES_TABLE} (
            tenant_id text NOT NULL,
            key bytea NOT NULL,
            value bytea NOT NULL,
            PRIMARY KEY (tenant_id, key)
        )
        """,
        # Scans that name no tenant (retention, counts) walk keys across tenants in order.
        f"CREATE INDEX {LANES_TABLE}_by_key ON {LANES_TABLE} (key)",
    ),
    # The row `/readyz` writes to prove the store takes writes (one per store, no tenant).
    2: (
        f"""
        CREATE TABLE {PROBE_TABLE} (
            tenant_id text NOT NULL,
            name text NOT NULL,
            probed_at timestamptz NOT NULL,
            PRIMARY KEY (tenant_id, name)
        )
        """,
    ),
}


class SchemaMismatch(RuntimeError):
    """The database's schema is not the one this code reads and writes."""


class SchemaNotUpgraded(SchemaMismatch):
    """No schema yet, or an older one: `sessionstate db upgrade` makes it current."""


class SchemaTooNew(SchemaMismatch):
    """A newer sessionstate upgraded the schema; this one must not write to it."""


@dataclass(frozen=True)
class Upgrade:
    """What `upgrade` did: the version found and the version left."""

    found: int
    now: int

    @property
    def changed(self) -> bool:
        return self.found != self.now


def stored_version(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """The schema version the database records; 0 when it has no sessionstate schema."""
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (VERSION_TABLE,)).fetchone()
    if exists is None or not exists[0]:
        return 0
    row = conn.execute(
        f"SELECT max(version) FROM {VERSION_TABLE} WHERE tenant_id = %s",  # noqa: S608
        (NO_TENANT,),
    ).fetchone()
    found = None if row is None else row[0]
    return found if isinstance(found, int) else 0


def check(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Raise `SchemaMismatch` unless the database holds exactly this code's schema version."""
    found = stored_version(conn)
    if found > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"the PostgreSQL store's schema is version {found}, newer than this sessionstate "
            f"knows ({SCHEMA_VERSION}): run the sessionstate release that upgraded it, "
            "or point SESSIONSTATE_STORE at another database"
        )
    if found == 0:
        raise SchemaNotUpgraded(
            "the PostgreSQL store has no sessionstate schema yet: "
            "run `sessionstate db upgrade` against it first"
        )
    if found < SCHEMA_VERSION:
        raise SchemaNotUpgraded(
            f"the PostgreSQL store's schema is version {found}, older than this sessionstate's "
            f"({SCHEMA_VERSION}): run `sessionstate db upgrade` first"
        )


def upgrade(conninfo: str) -> Upgrade:
    """Create or upgrade the schema to `SCHEMA_VERSION`; refuses a newer one (`SchemaTooNew`).

    Safe to run again: a current schema is left as it is. Nothing prepared, no session
    setting: it runs behind PgBouncer in transaction pooling as well.
    """
    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as conn:
        found = stored_version(conn)
        if found > SCHEMA_VERSION:
            check(conn)  # raises SchemaTooNew
        conn.execute(_VERSION_TABLE_DDL)
        for version in range(found + 1, SCHEMA_VERSION + 1):
            with conn.transaction():
                for statement in _STEPS[version]:
                    conn.execute(statement)
                conn.execute(
                    f"INSERT INTO {VERSION_TABLE} (tenant_id, version) VALUES (%s, %s)",  # noqa: S608
                    (NO_TENANT, version),
                )
        return Upgrade(found=found, now=max(found, SCHEMA_VERSION))
