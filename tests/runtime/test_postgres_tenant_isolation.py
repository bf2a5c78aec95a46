"""Issue 27, finding 5: one tenant's locked chain never delays another tenant's commits.

A psycopg connection holds `SELECT … FOR UPDATE` on every row of tenant `acme`
in the lanes table (its chain's head and marker, its summaries, its records)
while the served process, on real PostgreSQL, takes writes of `acme` and of
`other`:

1. `other`'s 20 writes are all acknowledged while the rows are still held and
   `acme`'s writes are still waiting for them (the statement timeout is long
   here, so `acme`'s commit waits until the rows are let go); `acme`'s then
   succeed, and every acknowledged write and its entry are there, both chains
   verify gapless.
2. With the store's own timeouts, `acme`'s write answers `503
   store_unavailable` while its rows are still held, with nothing written; once
   they are let go, `acme` writes again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
import requests

from store.backends.postgres_schema import LANES_TABLE
from tests.runtime.test_postgres_replicas import _approve, _bearer, _body, _check_chains, _state
from tests.runtime.test_postgres_service import stop
from tests.support.served import Served, start

ACME, OTHER = "acme", "other"
OTHER_WRITES = 20
ACME_WRITES = 3
PROBLEM = "application/problem+json"
_BLOCKED = "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"


@contextmanager
def _served(conninfo: str, opa_bin: str, tmp_path: Path) -> Iterator[Served]:
    running = start(
        opa_bin,
        tmp_path / "var",
        tmp_path,
        {
            "SESSIONSTATE_STORE": conninfo,
            "SESSIONSTATE_RATE_LIMIT": "off",
            "SESSIONSTATE_DENIAL_RATE_LIMIT": "off",
        },
    )
    try:
        yield running
    except Exception as failure:  # with what the service logged
        raise AssertionError(f"{failure}\n--- log\n{running.log.read_text()[-4000:]}") from failure
    finally:
        stop(running)


@contextmanager
def _rows_held(conninfo: str, tenant: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """Every row of tenant held `FOR UPDATE` by a transaction of its own, rolled back after."""
    with psycopg.connect(conninfo) as holder:
        rows = holder.execute(
            f"SELECT key FROM {LANES_TABLE} WHERE tenant_id = %s FOR UPDATE",
            (tenant,),
        ).fetchall()
        assert rows, "the tenant has rows to hold"
        try:
            yield holder
        finally:
            holder.rollback()


def _blocked_by(holder: psycopg.Connection[tuple[object, ...]], conninfo: str) -> int:
    """How many other backends wait for a lock the holder's transaction has."""
    with psycopg.connect(conninfo, autocommit=True) as probe:
        row = probe.execute(_BLOCKED, (holder.info.backend_pid,)).fetchone()
    assert row is not None
    return int(str(row[0]))


def _until_blocked(holder: psycopg.Connection[tuple[object, ...]], conninfo: str) -> None:
    """Until some backend (the service's commit of acme) waits for the holder's rows."""
    while not _blocked_by(holder, conninfo):
        time.sleep(0.05)


def _put(url: str, tenant: str, session: str, label: str) -> requests.Response:
    return requests.put(
        _state(url, tenant, session),
        json=_body(label),
        headers=_bearer(tenant, "model-service", session),
        timeout=120,
    )


def _acknowledged(answer: requests.Response) -> tuple[str, str]:
    assert answer.status_code in (200, 201), answer.text
    return answer.json()["record"]["state_digest"], answer.json()["decision"]["decision_id"]


def _check_there(url: str, tenant: str, digests: dict[str, str], decisions: list[str]) -> None:
    """Each session holds its last acknowledged record; each acknowledged entry says applied."""
    for session, digest in digests.items():
        read = requests.get(
            _state(url, tenant, session),
            headers=_bearer(tenant, "model-service", session),
            timeout=30,
        )
        assert read.status_code == 200, read.text
        assert read.json()["read_report"]["record"]["state_digest"] == digest
    for decision_id in decisions:
        found = requests.get(
            f"{url}/v1/decisions/{decision_id}", headers=_bearer(tenant, "auditor"), timeout=30
        )
        assert found.status_code == 200, decision_id
        assert found.json()["entry"]["outcome"]["applied"] is True


def _check_nothing_written(url: str, tenant: str, session: str) -> None:
    read = requests.get(
        _state(url, tenant, session), headers=_bearer(tenant, "model-service", session), timeout=30
    )
    assert read.status_code == 404, read.text


def _both_tenants_written(url: str) -> None:
    """Each tenant approved, with a record and entries on its chain (rows to hold)."""
    for tenant in (ACME, OTHER):
        _approve(url, tenant)
        _acknowledged(_put(url, tenant, "first", f"{tenant}-first"))


@pytest.mark.slow
def test_a_tenant_whose_rows_are_held_delays_no_other_tenant(
    postgres_conninfo: str, opa_bin: str, tmp_path: Path
) -> None:
    # A statement waits for a held row until it is let go (the store's 5 s would fail it).
    waits = postgres_conninfo + " options='-c statement_timeout=600000'"
    with _served(waits, opa_bin, tmp_path) as served:
        _both_tenants_written(served.url)
        acme: dict[str, requests.Response] = {}

        def acme_writes(session: str) -> None:
            acme[session] = _put(served.url, ACME, session, f"acme-{session}")

        writers = [
            threading.Thread(target=acme_writes, args=(f"held-{n}",)) for n in range(ACME_WRITES)
        ]
        other_digests: dict[str, str] = {}
        other_decisions: list[str] = []
        with _rows_held(postgres_conninfo, ACME) as holder:
            for writer in writers:
                writer.start()
            _until_blocked(holder, postgres_conninfo)
            for n in range(OTHER_WRITES):
                digest, decision_id = _acknowledged(_put(served.url, OTHER, f"s{n}", f"o{n}"))
                other_digests[f"s{n}"] = digest
                other_decisions.append(decision_id)
            # All acknowledged while acme's rows are held and acme's writes still wait.
            assert not acme and all(writer.is_alive() for writer in writers)
        for writer in writers:
            writer.join(120)
        assert set(acme) == {f"held-{n}" for n in range(ACME_WRITES)}
        acme_digests: dict[str, str] = {}
        acme_decisions: list[str] = []
        for session, answer in acme.items():
            if answer.status_code == 503:  # failed closed: nothing of it stored
                assert answer.headers["Content-Type"].startswith(PROBLEM), answer.text
                _check_nothing_written(served.url, ACME, session)
                continue
            acme_digests[session], decision_id = _acknowledged(answer)
            acme_decisions.append(decision_id)
        _check_there(served.url, OTHER, other_digests, other_decisions)
        _check_there(served.url, ACME, acme_digests, acme_decisions)
        _check_chains([served], [ACME, OTHER], postgres_conninfo)


@pytest.mark.slow
def test_a_held_tenant_answers_its_own_writers_503_with_nothing_written(
    postgres_conninfo: str, opa_bin: str, tmp_path: Path
) -> None:
    with _served(postgres_conninfo, opa_bin, tmp_path) as served:
        _both_tenants_written(served.url)
        with _rows_held(postgres_conninfo, ACME):
            refused = _put(served.url, ACME, "held", "acme-held")
            assert refused.status_code == 503, refused.text
            assert refused.headers["Content-Type"].startswith(PROBLEM)
            assert refused.json()["reason"] == "store_unavailable"
            _acknowledged(_put(served.url, OTHER, "beside", "other-beside"))
        _check_nothing_written(served.url, ACME, "held")
        digest, decision_id = _acknowledged(_put(served.url, ACME, "after", "acme-after"))
        _check_there(served.url, ACME, {"after": digest}, [decision_id])
        _check_chains([served], [ACME, OTHER], postgres_conninfo)
