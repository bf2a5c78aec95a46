"""What the PostgreSQL lane store does beyond the shared contract, on a real server.

Rows carry their key's tenant; two store objects on one database (two
replicas) still compare-and-set without a lost update; a connection lost
while COMMIT is under way is never retried and latches the store; an
unreachable database is `StoreOffline` without the password in sight.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from store.backends.contract import StoreOffline, StoreOutcomeUnknown, StoreUnwritable
from store.backends.postgres import PostgresLaneStore, redacted, successor
from store.backends.postgres_schema import upgrade
from store.canonical import sha256_digest
from store.digests import DigestKey
from store.key_codec import LaneKey, TenantResourceLane
from store.record.blockers import CorruptionLabel
from store.session_state import SessionStateStore, state_key
from tests.store.test_lane_store_contract import run_compare_and_set
from tests.support.factories import scope
from tests.support.postgres import PostgresServer, free_port

APPROVALS = TenantResourceLane.APPROVAL_PACKET


@pytest.fixture
def store(postgres_conninfo: str) -> Iterator[PostgresLaneStore]:
    lanes = PostgresLaneStore(postgres_conninfo, timeout=2.0)
    yield lanes
    lanes.close()


def _rows(conninfo: str) -> list[tuple[str, bytes, bytes]]:
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(
            "SELECT tenant_id, key, value FROM sessionstate_lanes ORDER BY key"
        ).fetchall()
    return [(tenant, bytes(raw), bytes(value)) for tenant, raw, value in rows]


def test_each_row_carries_its_keys_tenant(store: PostgresLaneStore, postgres_conninfo: str) -> None:
    tenant_key = LaneKey(APPROVALS, "tenant-a", "ws-1", name=b"a")
    global_key = LaneKey(TenantResourceLane.TRACE_EVIDENCE, name=(1).to_bytes(8, "big"))
    store.put(tenant_key, b"1")
    store.put(global_key, b"2")
    assert sorted(_rows(postgres_conninfo)) == sorted(
        [("tenant-a", tenant_key.encode(), b"1"), ("", global_key.encode(), b"2")]
    )


def test_garbage_written_with_sql_reads_as_corrupt(
    store: PostgresLaneStore, postgres_conninfo: str
) -> None:
    garbage = b"\xff\xfe garbage from elsewhere"
    key = state_key(scope())
    with psycopg.connect(postgres_conninfo) as conn:
        conn.execute(
            "INSERT INTO sessionstate_lanes (tenant_id, key, value) VALUES (%s, %s, %s)",
            (scope().tenant_id, key.encode(), garbage),
        )
    report = SessionStateStore(store).read(scope())
    assert report is not None and report.corrupt and report.record is None
    assert report.redacted_error == CorruptionLabel.MALFORMED
    assert report.error_digest == sha256_digest(garbage)


def test_two_stores_on_one_database_lose_no_update(
    postgres_conninfo: str, digest_key: DigestKey
) -> None:
    """Two store objects, each with its own pool, as two replicas would have."""
    replicas = [PostgresLaneStore(postgres_conninfo, timeout=5.0) for _ in range(2)]
    try:
        stores = [SessionStateStore(replica) for replica in replicas]
        run_compare_and_set(stores * 3, digest_key, rounds=5)
    finally:
        for replica in replicas:
            replica.close()


def test_a_batch_can_be_held_to_one_tenant(postgres_conninfo: str) -> None:
    store = PostgresLaneStore(postgres_conninfo, timeout=2.0, single_tenant_batches=True)
    try:
        with store.batch() as batch:
            batch.put(LaneKey(APPROVALS, "tenant-a", name=b"1"), b"1")
            batch.put(LaneKey(APPROVALS, "tenant-a", "ws", name=b"2"), b"2")
        with pytest.raises(ValueError, match="more than one tenant"), store.batch() as batch:
            batch.put(LaneKey(APPROVALS, "tenant-a", name=b"3"), b"3")
            batch.put(LaneKey(APPROVALS, "tenant-b", name=b"3"), b"3")
        assert store.get(LaneKey(APPROVALS, "tenant-a", name=b"3")) is None
        assert store.count(APPROVALS) == 2
    finally:
        store.close()


def test_a_statement_that_hangs_fails_closed_and_writes_nothing(
    store: PostgresLaneStore, postgres_conninfo: str
) -> None:
    """A row locked by another session makes the write wait; statement_timeout (the store's
    timeout) ends the wait: StoreOffline, nothing written, and the store writes again after."""
    key = LaneKey(APPROVALS, "tenant-a", "ws-1", name=b"locked")
    store.put(key, b"before")
    with psycopg.connect(postgres_conninfo) as blocker:
        blocker.execute(
            "SELECT 1 FROM sessionstate_lanes WHERE tenant_id = %s AND key = %s FOR UPDATE",
            ("tenant-a", key.encode()),
        )
        with pytest.raises(StoreOffline):
            store.put(key, b"during")
        blocker.rollback()
    assert store.get(key) == b"before"
    store.put(key, b"after")
    assert store.get(key) == b"after"


def test_a_tenant_with_a_nul_is_refused_before_anything_is_sent(store: PostgresLaneStore) -> None:
    with pytest.raises(ValueError, match="NUL"):
        store.put(LaneKey(APPROVALS, "a\x00b", name=b"k"), b"v")


def test_an_unreachable_database_is_offline_without_the_password() -> None:
    conninfo = f"host=127.0.0.1 port={free_port()} user=u password=secret-canary dbname=d"
    with pytest.raises(StoreOffline) as raised:
        PostgresLaneStore(conninfo, timeout=0.5)
    assert "secret-canary" not in str(raised.value)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_the_connection_string_is_shown_without_its_password() -> None:
    shown = redacted("host=a,b port=1,2 user=u password=secret target_session_attrs=read-write")
    assert "secret" not in shown
    assert "host=a,b" in shown and "target_session_attrs=read-write" in shown
    assert "secret" not in redacted("postgresql://u:secret@db.example/app?sslmode=require")


def test_the_successor_bounds_a_prefix() -> None:
    assert successor(b"ab") == b"ac"
    assert successor(b"a\xff\xff") == b"b"
    assert successor(b"\xff") is None


def test_a_connection_lost_during_commit_is_not_retried_and_latches(
    postgres_own: PostgresServer, digest_key: DigestKey
) -> None:
    """COMMIT waits for a synchronous standby that never comes; the backend is terminated.

    The transaction has committed locally, yet the client cannot know: the store
    must not retry it nor claim it failed, and refuses writes until `reopen()`.
    """
    conninfo = postgres_own.create_database()
    upgrade(conninfo)
    key = LaneKey(APPROVALS, "tenant-a", name=b"k")
    outcome: list[BaseException | None] = []
    with postgres_own.connect() as admin:
        admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        admin.execute("SELECT pg_reload_conf()")
        _wait_for_setting(admin, "synchronous_standby_names", "nobody")
    # Opened only now: a backend started before the reload took effect would commit at once.
    store = PostgresLaneStore(conninfo, timeout=2.0)
    try:
        with postgres_own.connect() as admin:

            def write() -> None:
                try:
                    store.put(key, b"maybe")
                    outcome.append(None)
                except BaseException as error:
                    outcome.append(error)

            writer = threading.Thread(target=write)
            writer.start()
            waiting = _wait_for_syncrep(admin)
            admin.execute("SELECT pg_terminate_backend(%s)", (waiting,))
            writer.join()
            admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
            admin.execute("SELECT pg_reload_conf()")
            # reopen() checks the standby the server names: only once the reset is in force.
            _wait_for_setting(admin, "synchronous_standby_names", "")

        assert len(outcome) == 1 and isinstance(outcome[0], StoreOutcomeUnknown)
        assert "unknown" in str(outcome[0])
        assert not store.writable and store.write_failures == 1
        assert store.get(key) == b"maybe"  # it had committed: a retry would have run it twice
        with pytest.raises(StoreUnwritable) as refused:
            store.put(key, b"refused while latched")
        assert not isinstance(refused.value, StoreOutcomeUnknown)  # refused: nothing done
        store.reopen()
        assert store.writable and store.reopens == 1
        store.put(key, b"after")
        assert store.get(key) == b"after"
    finally:
        store.close()


def _wait_for_setting(admin: psycopg.Connection[tuple[object, ...]], name: str, value: str) -> None:
    """Until the server runs with a reloaded setting (`pg_reload_conf` only signals it)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = admin.execute("SELECT current_setting(%s)", (name,)).fetchone()
        if row is not None and row[0] == value:
            return
        time.sleep(0.02)
    raise AssertionError(f"{name} was not reloaded")


def _wait_for_syncrep(admin: psycopg.Connection[tuple[object, ...]]) -> int:
    """The pid of the backend waiting for synchronous replication (bounded wait, no timing)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
        ).fetchone()
        if row is not None:
            return int(row[0])  # type: ignore[call-overload]
        time.sleep(0.02)
    raise AssertionError("no backend waited for synchronous replication")


def test_a_serialization_failure_is_retried(
    store: PostgresLaneStore, postgres_conninfo: str
) -> None:
    """A concurrent transaction changes the row the batch waits for: 40001, then a retry."""
    key = LaneKey(APPROVALS, "tenant-a", name=b"k")
    store.put(key, b"v1")
    failures: list[BaseException] = []
    with psycopg.connect(postgres_conninfo, autocommit=True) as other:
        other.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        other.execute(
            "UPDATE sessionstate_lanes SET value = 'other' WHERE tenant_id = %s AND key = %s",
            (key.tenant, key.encode()),
        )

        def write() -> None:
            try:
                store.put(key, b"v2")
            except BaseException as error:
                failures.append(error)

        writer = threading.Thread(target=write)
        writer.start()
        _wait_for(other, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        other.execute("COMMIT")
        writer.join()
    assert failures == []
    assert store.conflict_retries == 1
    assert store.get(key) == b"v2"


def test_a_connection_lost_before_commit_is_retried(
    store: PostgresLaneStore, postgres: PostgresServer, postgres_conninfo: str
) -> None:
    key = LaneKey(APPROVALS, "tenant-a", name=b"k")
    store.put(key, b"v1")
    # pg_terminate_backend(pid, timeout) returns once the backend is gone (PostgreSQL 14+).
    with postgres.connect() as admin:  # on the `postgres` database, not the store's
        terminated = admin.execute(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE datname = %s",
            (conninfo_to_dict(postgres_conninfo)["dbname"],),
        ).fetchall()
    assert terminated and all(ok for (ok,) in terminated)
    store.put(key, b"v2")  # the pooled connection is dead: the write runs again on a new one
    assert store.writable
    assert store.get(key) == b"v2"
    assert store.connection_retries >= 1


def _wait_for(conn: psycopg.Connection[tuple[object, ...]], query: str) -> None:
    deadline = time.monotonic() + 30
    while conn.execute(query).fetchone() is None:
        if time.monotonic() > deadline:
            raise AssertionError("the awaited state never came")
        time.sleep(0.02)
