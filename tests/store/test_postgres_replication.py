"""The primary-and-standby fixture: a synchronous commit survives losing the primary.

The groundwork for failover tests: kill -9 the primary, promote the standby,
and a store object given both hosts (`target_session_attrs=read-write`)
serves again from the new primary, with every write it saw acknowledged.
"""

from __future__ import annotations

import time

import pytest

from store.backends.contract import StoreOffline
from store.backends.postgres import PostgresLaneStore
from store.backends.postgres_schema import upgrade
from store.key_codec import LaneKey, TenantResourceLane
from tests.support.postgres import PostgresPair

KEY = LaneKey(TenantResourceLane.APPROVAL_PACKET, "tenant-a", "ws-1", name=b"k")


def test_the_standby_is_synchronous(postgres_pair: PostgresPair) -> None:
    with postgres_pair.primary.connect() as conn:
        settings = conn.execute(
            "SELECT current_setting('synchronous_commit'), "
            "current_setting('synchronous_standby_names')"
        ).fetchone()
        sync_state = conn.execute("SELECT sync_state FROM pg_stat_replication").fetchall()
    assert settings == ("on", "standby1")
    assert sync_state == [("sync",)]


def test_an_acknowledged_write_is_on_the_standby_after_promotion(
    postgres_pair: PostgresPair,
) -> None:
    conninfo = postgres_pair.conninfo()
    upgrade(conninfo)
    store = PostgresLaneStore(conninfo, timeout=1.0)
    try:
        store.put(KEY, b"acknowledged")  # returns once the standby has it too
        postgres_pair.kill_primary()
        with pytest.raises(StoreOffline):  # no writable host until the standby is promoted
            store.get(KEY)
        postgres_pair.promote()

        with postgres_pair.standby.connect() as conn:
            row = conn.execute(
                "SELECT value FROM sessionstate_lanes WHERE tenant_id = %s AND key = %s",
                (KEY.tenant, KEY.encode()),
            ).fetchone()
        assert row is not None and bytes(row[0]) == b"acknowledged"  # type: ignore[arg-type]

        # The same store object reaches the new primary through the multi-host string.
        assert _first_answer(store) == b"acknowledged"
        store.put(KEY, b"after failover")
        assert store.get(KEY) == b"after failover"
    finally:
        store.close()


def _first_answer(store: PostgresLaneStore) -> bytes | None:
    """Read until the pool has reconnected (a bounded wait; nothing timed is asserted)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return store.get(KEY)
        except StoreOffline:
            if time.monotonic() > deadline:
                raise
