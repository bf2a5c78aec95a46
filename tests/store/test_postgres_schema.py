"""The PostgreSQL store's schema: `upgrade` creates it once, the store refuses any other."""

from __future__ import annotations

import psycopg
import pytest

from store.backends import postgres_schema
from store.backends.contract import ProbeWrite
from store.backends.postgres import PostgresLaneStore
from store.backends.postgres_schema import (
    PROBE_TABLE,
    SCHEMA_VERSION,
    SchemaNotUpgraded,
    SchemaTooNew,
    Upgrade,
    upgrade,
)
from store.key_codec import LaneKey, TenantResourceLane
from tests.support.postgres import PostgresServer


def test_a_store_refuses_a_database_not_yet_upgraded(postgres: PostgresServer) -> None:
    conninfo = postgres.create_database()
    with pytest.raises(
        SchemaNotUpgraded, match=r"no sessionstate schema yet: run `sessionstate db upgrade`"
    ):
        PostgresLaneStore(conninfo, timeout=2.0)


def test_upgrade_creates_the_schema_once(postgres: PostgresServer) -> None:
    conninfo = postgres.create_database()
    assert upgrade(conninfo) == Upgrade(found=0, now=SCHEMA_VERSION)
    again = upgrade(conninfo)
    assert again == Upgrade(found=SCHEMA_VERSION, now=SCHEMA_VERSION) and not again.changed
    store = PostgresLaneStore(conninfo, timeout=2.0)
    try:
        store.put(LaneKey(TenantResourceLane.APPROVAL_PACKET, "t", name=b"k"), b"v")
    finally:
        store.close()
    with psycopg.connect(conninfo) as conn:
        versions = conn.execute(
            "SELECT tenant_id, version FROM sessionstate_schema ORDER BY version"
        ).fetchall()
    assert versions == [("", version) for version in range(1, SCHEMA_VERSION + 1)]


def test_a_newer_schema_is_refused_by_the_store_and_by_upgrade(postgres: PostgresServer) -> None:
    conninfo = postgres.create_database()
    upgrade(conninfo)
    with psycopg.connect(conninfo) as conn:
        conn.execute(
            "INSERT INTO sessionstate_schema (tenant_id, version) VALUES ('', %s)",
            (SCHEMA_VERSION + 1,),
        )
    newer = (
        rf"version {SCHEMA_VERSION + 1}, newer than this sessionstate knows \({SCHEMA_VERSION}\)"
    )
    with pytest.raises(SchemaTooNew, match=newer):
        PostgresLaneStore(conninfo, timeout=2.0)
    with pytest.raises(SchemaTooNew, match=newer):
        upgrade(conninfo)


def test_every_table_leads_its_primary_key_with_tenant_id(postgres: PostgresServer) -> None:
    conninfo = postgres.create_database()
    upgrade(conninfo)
    with psycopg.connect(conninfo) as conn:
        tables = conn.execute(
            "SELECT c.relname, a.attname, t.typname "
            "FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0] "
            "JOIN pg_type t ON t.oid = a.atttypid "
            "WHERE i.indisprimary AND n.nspname = 'public' ORDER BY c.relname"
        ).fetchall()
        every = conn.execute(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind = 'r' ORDER BY relname"
        ).fetchall()
        columns = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = 'sessionstate_lanes' ORDER BY ordinal_position"
        ).fetchall()
    assert [name for name, _, _ in tables] == [name for (name,) in every]
    assert tables == [
        ("sessionstate_lanes", "tenant_id", "text"),
        ("sessionstate_probe", "tenant_id", "text"),
        ("sessionstate_schema", "tenant_id", "text"),
    ]
    assert columns == [("tenant_id", "text"), ("key", "bytea"), ("value", "bytea")]


def test_a_version_1_store_is_refused_until_upgraded_then_takes_the_write_probe(
    postgres: PostgresServer,
) -> None:
    conninfo = postgres.create_database()
    with psycopg.connect(conninfo, autocommit=True) as conn:  # what release 1's upgrade left
        conn.execute(postgres_schema._VERSION_TABLE_DDL)
        for statement in postgres_schema._STEPS[1]:
            conn.execute(statement)
        conn.execute("INSERT INTO sessionstate_schema (tenant_id, version) VALUES ('', 1)")
    with pytest.raises(SchemaNotUpgraded, match="version 1, older"):
        PostgresLaneStore(conninfo, timeout=2.0)
    assert upgrade(conninfo) == Upgrade(found=1, now=2)
    store = PostgresLaneStore(conninfo, timeout=2.0)
    try:
        assert store.write_probe() is store.write_probe() is ProbeWrite.COMMITTED  # twice
    finally:
        store.close()
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(f"SELECT tenant_id, name FROM {PROBE_TABLE}").fetchall()
    assert rows == [("", "readiness")]
