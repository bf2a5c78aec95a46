"""Issue 31: the PostgreSQL store behind a real PgBouncer in transaction pooling.

PgBouncer (Debian's) in `pool_mode = transaction` runs each transaction, or each
statement outside one, on whichever server connection is free, and refuses the
`options` startup parameter. The store relies on no session state there: it sees
the refusal and sets `statement_timeout` in each transaction, bounds single
statements from the client, and prepares no statements.

1. The store itself, with `options` refused and with it dropped
   (`ignore_startup_parameters = options`): many concurrent batches and reads (more than psycopg's
   auto-prepare threshold) on few server connections; a statement held by a table
   lock fails within the store's timeout, reads and writes alike; a read-only
   store cannot write; a direct connection keeps its session options.
2. `db upgrade` and two `sessionstate serve` instances through it: clients write one
   session with `If-Match` over both, and read from both; every chain verifies; a
   table locked from a direct connection makes a PUT answer `503 store_unavailable`
   (it does not hang) and `/readyz` `503 store_write_probe_failed`, and writes
   succeed once it is released.
3. A served instance through it while PostgreSQL behind it is stopped: PgBouncer
   queues a client waiting for a server connection (until `query_wait_timeout`,
   120 s) and drops a cancel request for it, yet `/readyz` answers `503` with a
   store reason (the store bounds its probes from the client and shuts down a
   connection that a cancel did not free), a PUT `503 store_unavailable`, and
   `/readyz` `200` again once PostgreSQL is back (after PgBouncer's
   `server_login_retry`). The store alone shows the same for each probe and a read.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import psycopg
import pytest
import requests

from store.backends.contract import Mode, ProbeWrite, StoreOffline
from store.backends.postgres import PostgresLaneStore
from store.backends.postgres_schema import LANES_TABLE, upgrade
from store.key_codec import LaneKey, TenantResourceLane
from tests.runtime.test_postgres_replicas import (
    SessionLedger,
    _approve,
    _bearer,
    _body,
    _check_chains,
    _contender,
    _read_digest,
    _ready,
    _run_all,
    _state,
    _two_instances,
    _until,
)
from tests.runtime.test_postgres_service import stop
from tests.support import pgbouncer as bouncers
from tests.support import postgres as pg
from tests.support.served import ROOT, start

CLIENT_SECONDS = 30  # a request still unanswered by then hung: the test fails
OUTAGE_CLIENT_SECONDS = 20  # /readyz still unanswered by then, with PostgreSQL down, hung


@pytest.fixture(params=["", "options"], ids=["options-refused", "options-dropped"])
def bounced(
    postgres: pg.PostgresServer, request: pytest.FixtureRequest
) -> Iterator[tuple[str, str]]:
    """(through PgBouncer, direct): connection strings of one fresh database; PgBouncer
    refuses the `options` startup parameter, or drops it (`ignore_startup_parameters`)."""
    reason = bouncers.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    direct = postgres.create_database()
    dbname = str(psycopg.conninfo.conninfo_to_dict(direct)["dbname"])
    with bouncers.pgbouncer(postgres, pool_size=4, ignored=request.param) as bouncer:
        yield bouncer.conninfo(dbname), direct


def _key(tenant: str, n: int) -> LaneKey:
    return LaneKey(TenantResourceLane.SESSION_META, tenant, "ws", f"s{n}")


def _locked(direct: str) -> psycopg.Connection[tuple[object, ...]]:
    """A direct connection holding the lanes table against every read and write."""
    conn = psycopg.connect(direct)
    conn.execute(f"LOCK TABLE {LANES_TABLE} IN ACCESS EXCLUSIVE MODE")
    return conn


def test_the_store_keeps_no_session_state_behind_pgbouncer(bounced: tuple[str, str]) -> None:
    through, direct = bounced
    upgraded = subprocess.run(  # the schema, through PgBouncer
        [sys.executable, "-m", "service.cli", "db", "upgrade"],
        env={**os.environ, "SESSIONSTATE_STORE": through, "SESSIONSTATE_DATA_DIR": "unused"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert upgraded.returncode == 0, upgraded.stderr
    store = PostgresLaneStore(through, timeout=2.0)
    assert store.session_options is False  # PgBouncer refused or dropped `options`
    plain = PostgresLaneStore(direct, timeout=2.0)
    plain.close()
    assert plain.session_options is True  # a direct connection keeps its options
    try:
        errors: list[BaseException] = []

        def worker(n: int) -> None:
            try:
                for turn in range(25):  # past psycopg's prepare threshold on each connection
                    with store.batch() as batch:
                        batch.put(_key(f"t{n}", turn), f"{n}-{turn}".encode())
                    assert store.get(_key(f"t{n}", turn)) == f"{n}-{turn}".encode()
                    assert len(list(store.scan(TenantResourceLane.SESSION_META, f"t{n}"))) == (
                        turn + 1
                    )
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert not errors, errors
        assert store.write_probe() is ProbeWrite.COMMITTED
        assert store.sync_standby_missing() is False

        holder = _locked(direct)  # a statement that hangs fails within the store's timeout
        try:
            with pytest.raises(StoreOffline):
                store.get(_key("t0", 0))
            with pytest.raises(StoreOffline):
                store.put(_key("t0", 0), b"held")
            assert store.write_probe() is ProbeWrite.REFUSED
        finally:
            holder.close()
        store.put(_key("t0", 0), b"released")
        assert store.get(_key("t0", 0)) == b"released"

        reader = PostgresLaneStore.open(through, Mode.READ_ONLY)
        try:
            assert reader.get(_key("t0", 0)) == b"released"
            with pytest.raises(StoreOffline):
                reader.put(_key("t0", 0), b"from a read-only store")
        finally:
            reader.close()
        assert store.get(_key("t0", 0)) == b"released"
    finally:
        store.close()


def _put_answers(url: str, tenant: str, session: str) -> requests.Response:
    return requests.put(
        _state(url, tenant, session),
        json=_body("while-locked"),
        headers=_bearer(tenant, "model-service", session),
        timeout=CLIENT_SECONDS,
    )


def _reason(url: str) -> list[str]:
    answer = requests.get(url + "/readyz", timeout=CLIENT_SECONDS)
    reasons: list[str] = answer.json()["reasons"]
    return reasons if answer.status_code == 503 else []


@pytest.mark.slow
def test_two_instances_serve_through_pgbouncer_in_transaction_pooling(
    postgres: pg.PostgresServer, opa_bin: str, tmp_path: Path
) -> None:
    reason = bouncers.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    direct = postgres.create_database()
    dbname = str(psycopg.conninfo.conninfo_to_dict(direct)["dbname"])
    tenants, session, writes = ["tenant-a", "tenant-b"], "shared", 4
    with bouncers.pgbouncer(postgres, pool_size=40) as bouncer:
        through = bouncer.conninfo(dbname)
        upgraded = subprocess.run(
            [sys.executable, "-m", "service.cli", "db", "upgrade"],
            env={**os.environ, "SESSIONSTATE_STORE": through, "SESSIONSTATE_DATA_DIR": "unused"},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert upgraded.returncode == 0, upgraded.stderr + bouncer.log_tail()
        with _two_instances(through, opa_bin, tmp_path) as instances:
            ledgers = {tenant: SessionLedger() for tenant in tenants}
            for tenant in tenants:
                _approve(instances[0].url, tenant)
                first = requests.put(
                    _state(instances[1].url, tenant, session),
                    json=_body("created"),
                    headers=_bearer(tenant, "model-service", session),
                    timeout=CLIENT_SECONDS,
                )
                assert first.status_code == 201, first.text
            _run_all(
                [
                    partial(
                        _contender,
                        instances[n % 2].url,
                        tenant,
                        session,
                        f"c{n}",
                        writes,
                        ledgers[tenant],
                    )
                    for tenant in tenants
                    for n in range(4)
                ]
            )
            for tenant in tenants:  # both instances read what both wrote
                headers = _bearer(tenant, "model-service", session)
                digests = {
                    _read_digest(requests.Session(), instance.url, tenant, session, headers)
                    for instance in instances
                }
                assert len(digests) == 1
                assert len(ledgers[tenant].applied) == 4 * writes
            _check_chains(instances, tenants, through)

            holder = _locked(direct)  # a hung statement fails within the store's timeout
            try:
                held = _put_answers(instances[0].url, "tenant-a", "held")
                assert held.status_code == 503, held.text
                assert held.json()["reason"] == "store_unavailable", held.text
                _until(
                    lambda: "store_write_probe_failed" in _reason(instances[1].url),
                    "store_write_probe_failed",
                )
            finally:
                holder.close()
            for instance in instances:
                _until(lambda url=instance.url: not _reason(url), "ready again")
            after = _put_answers(instances[1].url, "tenant-a", "after")
            assert after.status_code == 201, after.text
            _check_chains(instances, tenants, through)


def test_the_store_bounds_its_probes_while_postgres_behind_pgbouncer_is_down(
    postgres_own: pg.PostgresServer,
) -> None:
    """PgBouncer queues a statement on a connection it has while the server is down, and
    drops a cancel for it: each probe, read, write and hold gives up (its connection shut
    down), and answers as on a store that cannot be reached, long before
    `query_wait_timeout`."""
    reason = bouncers.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    direct = postgres_own.create_database()
    dbname = str(psycopg.conninfo.conninfo_to_dict(direct)["dbname"])
    upgrade(direct)
    with bouncers.pgbouncer(postgres_own, pool_size=4) as bouncer:
        store = PostgresLaneStore(bouncer.conninfo(dbname), timeout=2.0)
        try:
            assert store.reachable() is True
            postgres_own.stop("immediate")
            try:
                for _ in range(2):  # on the pooled connection PgBouncer queues, then on others
                    assert store.reachable() is False
                    assert store.write_probe() is ProbeWrite.REFUSED
                    assert store.sync_standby_missing() is None
                    with pytest.raises(StoreOffline):
                        store.get(_key("t0", 0))
                    with pytest.raises(StoreOffline):
                        store.put(_key("t0", 0), b"while down")
                    with pytest.raises(StoreOffline), store.exclusive(_key("t0", 0)):
                        pass
                # a cancel did not end the queued wait: the watch shut the connection down
                assert store._deadlines.severed >= 1, bouncer.log_tail()
            finally:
                postgres_own.start()
            _until(store.reachable, "reachable once PostgreSQL is back")
            assert store.write_probe() is ProbeWrite.COMMITTED
        finally:
            store.close()


def _upgraded(through: str, bouncer: bouncers.PgBouncer) -> None:
    upgraded = subprocess.run(
        [sys.executable, "-m", "service.cli", "db", "upgrade"],
        env={**os.environ, "SESSIONSTATE_STORE": through, "SESSIONSTATE_DATA_DIR": "unused"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert upgraded.returncode == 0, upgraded.stderr + bouncer.log_tail()


@pytest.mark.slow
def test_readyz_answers_while_postgres_behind_pgbouncer_is_down(
    postgres_own: pg.PostgresServer, opa_bin: str, tmp_path: Path
) -> None:
    reason = bouncers.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    direct = postgres_own.create_database()
    dbname = str(psycopg.conninfo.conninfo_to_dict(direct)["dbname"])
    with bouncers.pgbouncer(postgres_own, pool_size=40) as bouncer:
        through = bouncer.conninfo(dbname)
        _upgraded(through, bouncer)
        env = {
            "SESSIONSTATE_STORE": through,
            "SESSIONSTATE_RATE_LIMIT": "off",
            "SESSIONSTATE_DENIAL_RATE_LIMIT": "off",
        }
        instance = start(opa_bin, tmp_path / "var", tmp_path, env)
        try:
            _approve(instance.url, "tenant-a")
            assert _put_answers(instance.url, "tenant-a", "before").status_code == 201
            assert _ready(instance.url)
            postgres_own.stop("immediate")  # PgBouncer stays up, its clients connected
            try:
                for _ in range(3):  # each time on a pooled connection PgBouncer queues
                    answer = requests.get(instance.url + "/readyz", timeout=OUTAGE_CLIENT_SECONDS)
                    assert answer.status_code == 503, answer.text
                    reasons = answer.json()["reasons"]
                    assert any(reason.startswith("store_") for reason in reasons), reasons
                    assert answer.json()["store"]["takes_writes"] is not True
                held = _put_answers(instance.url, "tenant-a", "during")
                assert held.status_code == 503, held.text
                assert held.json()["reason"] == "store_unavailable", held.text
            finally:
                postgres_own.start()
            _until(lambda: _ready(instance.url), "ready again once PostgreSQL is back")
            after = _put_answers(instance.url, "tenant-a", "after")
            assert after.status_code == 201, after.text
        except Exception as failure:  # with what the instance and PgBouncer logged
            raise AssertionError(
                f"{type(failure).__name__}: {failure}\n--- instance\n"
                + instance.log.read_text()[-4000:]
                + "\n--- pgbouncer\n"
                + bouncer.log_tail()
            ) from failure
        finally:
            stop(instance)
