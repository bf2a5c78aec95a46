"""The PostgreSQL store's COMMIT is bounded when it waits for a synchronous standby (issue 31).

Against a real primary and its synchronous standby: with the standby stopped, a
batch's COMMIT is cancelled after the store's timeout and raises
`StoreOutcomeUnknown` (it committed on the primary alone), the store stays latched
while the standby is away, and writes again once it is back. A role that may not
read `pg_stat_replication`'s `sync_state` cannot tell a standby missing from the
views; the probe write's bounded COMMIT tells it instead (`COMMIT_UNCONFIRMED`).
"""

from __future__ import annotations

import time

import pytest

from store.backends.contract import ProbeWrite, StoreOffline, StoreOutcomeUnknown, StoreUnwritable
from store.backends.postgres import PostgresLaneStore, synchronous_standbys_wanted
from store.backends.postgres_schema import upgrade
from store.key_codec import LaneKey, TenantResourceLane
from tests.support import postgres as pg

KEY = LaneKey(TenantResourceLane.SESSION_META, "acme", "ws", "s1")


@pytest.mark.parametrize(
    ("names", "wanted"),
    [
        ("", 0),
        ("  ", 0),
        ("standby1", 1),
        ("*", 1),
        ("a, b", 1),
        ("FIRST 2 (a, b, c)", 2),
        ("first 1 (a)", 1),
        ("ANY 2 (a, b, c)", 2),
        ("2 (a, b)", 2),
        ("3(a, b, c)", 3),
    ],
)
def test_how_many_synchronous_standbys_a_setting_asks_for(names: str, wanted: int) -> None:
    assert synchronous_standbys_wanted(names) == wanted


def test_a_commit_waiting_for_a_stopped_standby_is_cut_off_as_of_unknown_outcome(
    postgres_pair: pg.PostgresPair,
) -> None:
    conninfo = postgres_pair.primary.conninfo()
    upgrade(conninfo)
    store = PostgresLaneStore(conninfo, timeout=1.0)
    try:
        store.put(KEY, b"replicated")
        assert store.sync_standby_missing() is False
        assert store.write_probe() is ProbeWrite.COMMITTED

        postgres_pair.standby.stop()
        postgres_pair.wait_standby_gone()
        assert store.sync_standby_missing() is True
        with pytest.raises(StoreOutcomeUnknown):
            store.put(KEY, b"on the primary alone")
        assert not store.writable
        with pytest.raises(StoreUnwritable):
            store.put(KEY, b"refused at once")
        with pytest.raises(StoreOffline):  # stays latched while COMMITs would wait
            store.reopen()
        # The cut-off COMMIT committed on the primary (PostgreSQL's WARNING says so): it was
        # not acknowledged, and reads show it.
        assert store.get(KEY) == b"on the primary alone"

        postgres_pair.standby.start()
        postgres_pair.wait_synchronous()
        store.reopen()
        store.put(KEY, b"replicated again")
        assert store.get(KEY) == b"replicated again"
    finally:
        store.close()


def test_a_role_that_cannot_see_sync_state_relies_on_the_bounded_probe(
    postgres_pair: pg.PostgresPair,
) -> None:
    primary = postgres_pair.primary
    dbname = "sessionstate_watch"
    with primary.connect() as admin:
        admin.execute(f"CREATE DATABASE {dbname}")
        admin.execute(f"CREATE ROLE watcher LOGIN PASSWORD '{primary.password}'")
        admin.execute(f"ALTER DATABASE {dbname} OWNER TO watcher")
    as_watcher = primary.conninfo(dbname, user="watcher")
    upgrade(as_watcher)
    store = PostgresLaneStore(as_watcher, timeout=1.0)
    try:
        assert store.write_probe() is ProbeWrite.COMMITTED
        with primary.connect() as admin:  # two synchronous standbys wanted, one there
            admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'FIRST 2 (standby1, b)'")
            admin.execute("SELECT pg_reload_conf()")
        superuser = PostgresLaneStore(primary.conninfo(dbname), timeout=1.0)
        try:
            _until_missing(superuser)
        finally:
            superuser.close()
        assert store.sync_standby_missing() is None  # sync_state is hidden from it
        assert store.write_probe() is ProbeWrite.COMMIT_UNCONFIRMED
    finally:
        store.close()
        with primary.connect() as admin:
            admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
            admin.execute("SELECT pg_reload_conf()")


def _until_missing(store: PostgresLaneStore) -> None:
    """Until the reloaded setting shows (a reload is asynchronous)."""
    for _ in range(200):
        if store.sync_standby_missing():
            return
        time.sleep(0.05)
    raise AssertionError("the primary never asked for two synchronous standbys")
