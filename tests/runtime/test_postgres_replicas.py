"""Issue 13, tests 1 and 2: two served instances, each with its own OPA sidecar, on one PostgreSQL.

1. Eight clients spread over both instances write one session with `If-Match`
   and re-read on 412: the applied writes form one line (no update lost), each
   has its entry, every tenant's chain verifies, no `seq` repeated or skipped.
2. The primary is killed (-9) while both instances write, and the synchronous
   standby promoted: every acknowledged write is there, the chains verify,
   requests in between get `503 store_unavailable` (or `store_outcome_unknown`
   for a COMMIT the kill cut off), and both instances serve
   again without a restart (a multi-host connection string).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import requests

from service.auth.tokens import mint_token
from store.backends.postgres_schema import upgrade
from tests.runtime.test_postgres_service import stop
from tests.support import postgres as pg
from tests.support.factories import state_input
from tests.support.live import JWT_SECRET
from tests.support.served import ROOT, Served, start

WORKSPACE = "ws-1"
PROBLEM = "application/problem+json"


def _token(tenant: str, role: str, session: str | None = None) -> str:
    scope: dict[str, str] = {"tenant": tenant}
    if role == "model-service":
        scope |= {"workspace": WORKSPACE, "session": session or "s"}
    return mint_token(JWT_SECRET.encode(), sub="replica", roles=[role], ttl_seconds=3600, **scope)


def _bearer(tenant: str, role: str, session: str | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {_token(tenant, role, session)}"}


def _state(url: str, tenant: str, session: str) -> str:
    return f"{url}/v1/tenants/{tenant}/workspaces/{WORKSPACE}/sessions/{session}/state"


def _approve(url: str, tenant: str) -> None:
    requests.post(
        f"{url}/v1/tenants/{tenant}/workspaces/{WORKSPACE}/approvals",
        json={"ttl_seconds": 86400, "reason": "replica test"},
        headers=_bearer(tenant, "operator"),
        timeout=30,
    ).raise_for_status()


def _body(label: str) -> dict[str, object]:
    """A state input of its own: each applied write has a digest no other has."""
    return state_input(turns=[{"turn_id": label, "role": "user", "payload": f"turn {label}"}])


@contextmanager
def _two_instances(conninfo: str, opa_bin: str, tmp_path: Path) -> Iterator[list[Served]]:
    instances: list[Served] = []
    env = {
        "SESSIONSTATE_STORE": conninfo,
        "SESSIONSTATE_RATE_LIMIT": "off",
        "SESSIONSTATE_DENIAL_RATE_LIMIT": "off",
    }
    try:
        for name in ("a", "b"):
            instances.append(start(opa_bin, tmp_path / f"var-{name}", tmp_path, env))
        yield instances
    except Exception as failure:  # with what the instances logged
        logs = "".join(
            f"\n--- instance {n}\n" + instance.log.read_text()[-4000:]
            for n, instance in enumerate(instances)
        )
        raise AssertionError(f"{type(failure).__name__}: {failure}{logs}") from failure
    finally:
        for instance in instances:
            stop(instance)


def _list_decisions(url: str, tenant: str) -> list[dict[str, Any]]:
    """Every entry of the tenant's chain, page by page."""
    http = requests.Session()
    entries: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, str | int] = {"limit": 1000} | ({"cursor": cursor} if cursor else {})
        page = http.get(
            f"{url}/v1/decisions",
            params=params,
            headers=_bearer(tenant, "auditor"),
            timeout=60,
        )
        assert page.status_code == 200, page.text
        entries += page.json()["decisions"]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return entries


def _check_chains(instances: list[Served], tenants: list[str], conninfo: str) -> None:
    """Each tenant's chain verifies through each instance, gapless; and every chain offline."""
    for tenant in tenants:
        for instance in instances:
            verify = requests.get(
                f"{instance.url}/v1/decisions/verify",
                headers=_bearer(tenant, "auditor"),
                timeout=120,
            ).json()
            assert verify["ok"] is True, verify
        seqs = [entry["seq"] for entry in _list_decisions(instances[0].url, tenant)]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a seq repeated or skipped"
    every = subprocess.run(
        [sys.executable, "-m", "service.cli", "decisions", "verify", "--all-tenants"],
        env={
            **os.environ,
            "SESSIONSTATE_STORE": conninfo,
            "SESSIONSTATE_DATA_DIR": str(instances[0].data_dir),
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert every.returncode == 0, every.stdout + every.stderr
    assert '"ok":true' in every.stdout.replace(" ", "")


# -- 1. two instances, eight clients, one session ---------------------------------


@dataclass
class Applied:
    if_match: str
    digest: str
    decision_id: str


@dataclass
class SessionLedger:
    applied: list[Applied] = field(default_factory=list)
    refused: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _contender(
    url: str, tenant: str, session: str, name: str, writes: int, ledger: SessionLedger
) -> None:
    """Write `writes` times with If-Match; on 412 read the state again and retry."""
    http = requests.Session()
    headers = _bearer(tenant, "model-service", session)
    known = _read_digest(http, url, tenant, session, headers)
    done = attempt = 0
    while done < writes:
        attempt += 1
        answer = http.put(
            _state(url, tenant, session),
            json=_body(f"{name}-{attempt}"),
            headers=headers | {"If-Match": f'"{known}"'},
            timeout=60,
        )
        if answer.status_code == 412:
            assert answer.json()["reason"] == "precondition_failed", answer.text
            with ledger.lock:
                ledger.refused += 1
            known = _read_digest(http, url, tenant, session, headers)
            continue
        assert answer.status_code == 200, answer.text
        written = answer.json()
        with ledger.lock:
            ledger.applied.append(
                Applied(
                    known, written["record"]["state_digest"], written["decision"]["decision_id"]
                )
            )
        known = written["record"]["state_digest"]
        done += 1


def _read_digest(
    http: requests.Session, url: str, tenant: str, session: str, headers: dict[str, str]
) -> str:
    read = http.get(_state(url, tenant, session), headers=headers, timeout=60)
    assert read.status_code == 200, read.text
    digest: str = read.json()["read_report"]["record"]["state_digest"]
    return digest


def _run_all(targets: list[Callable[[], None]]) -> None:
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    if errors:
        raise errors[0]


def test_eight_clients_over_two_instances_lose_no_update(
    postgres_conninfo: str, opa_bin: str, tmp_path: Path
) -> None:
    tenants, session, writes = ["tenant-a", "tenant-b"], "shared", 6
    with _two_instances(postgres_conninfo, opa_bin, tmp_path) as instances:
        ledgers: dict[str, SessionLedger] = {}
        created: dict[str, str] = {}
        for tenant in tenants:
            _approve(instances[0].url, tenant)
            first = requests.put(
                _state(instances[1].url, tenant, session),
                json=_body("created"),
                headers=_bearer(tenant, "model-service", session),
                timeout=60,
            )
            assert first.status_code == 201, first.text
            created[tenant] = first.json()["record"]["state_digest"]
            ledgers[tenant] = SessionLedger()
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
                for n in range(8 if tenant == "tenant-a" else 2)
            ]
        )

        for tenant in tenants:
            ledger = ledgers[tenant]
            # No update lost: every applied write replaced the one applied just before it.
            after = {write.if_match: write for write in ledger.applied}
            assert len(after) == len(ledger.applied), "two writes applied over one version"
            line, digest = [], created[tenant]
            while digest in after:
                line.append(after[digest])
                digest = after[digest].digest
            assert len(line) == len(ledger.applied)
            final = _read_digest(
                requests.Session(),
                instances[0].url,
                tenant,
                session,
                _bearer(tenant, "model-service", session),
            )
            assert final == digest
            # Every applied write has its entry, and no other write was applied.
            entries = _list_decisions(instances[1].url, tenant)
            applied_writes = {
                entry["decision"]["decision_id"]
                for entry in entries
                if entry["decision"]["action"] == "write" and entry["outcome"]["applied"]
            }
            assert applied_writes == {w.decision_id for w in ledger.applied} | {
                _decision_of_creation(entries)
            }
        assert ledgers["tenant-a"].refused > 0, "the clients never raced: the test proves nothing"
        _check_chains(instances, tenants, postgres_conninfo)


def _decision_of_creation(entries: list[dict[str, Any]]) -> str:
    created = [
        entry["decision"]["decision_id"]
        for entry in entries
        if entry["decision"]["action"] == "write" and entry["outcome"]["status"] == 201
    ]
    assert len(created) == 1
    return str(created[0])


# -- 2. the primary dies under load ------------------------------------------------


@dataclass
class FailoverLedger:
    acknowledged: dict[tuple[str, str], str] = field(default_factory=dict)  # newest per session
    unsure: set[tuple[str, str]] = field(default_factory=set)  # a 503 since the newest ack
    decisions: list[tuple[str, str]] = field(default_factory=list)  # (tenant, decision id)
    statuses: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, label: str) -> int:
        with self.lock:
            return self.statuses.get(label, 0)


def _failover_writer(
    url: str, tenant: str, session: str, ledger: FailoverLedger, halt: threading.Event
) -> None:
    http = requests.Session()
    headers = _bearer(tenant, "model-service", session)
    turn, known = 0, None
    while not halt.is_set():
        turn += 1
        sent = headers | ({"If-Match": f'"{known}"'} if known else {"If-None-Match": "*"})
        try:
            answer = http.put(
                _state(url, tenant, session),
                json=_body(f"{session}-{turn}"),
                headers=sent,
                timeout=60,
            )
        except requests.RequestException:
            continue
        with ledger.lock:
            if answer.status_code in (200, 201):
                label = "acknowledged"
                known = answer.json()["record"]["state_digest"]
                ledger.acknowledged[(tenant, session)] = known
                ledger.decisions.append((tenant, answer.json()["decision"]["decision_id"]))
                ledger.unsure.discard((tenant, session))
            else:
                assert answer.headers["Content-Type"].startswith(PROBLEM), answer.text
                label = answer.json()["reason"]
                if answer.status_code == 503:
                    ledger.unsure.add((tenant, session))
            ledger.statuses[label] = ledger.statuses.get(label, 0) + 1
        if answer.status_code == 503:
            time.sleep(0.05)
        elif answer.status_code == 412:  # an earlier write of unknown outcome landed
            read = http.get(_state(url, tenant, session), headers=headers, timeout=60)
            known = read.json()["read_report"]["record"]["state_digest"] if read.ok else None


def _until(condition: Callable[[], bool], what: str, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.1)


def _ready(url: str) -> bool:
    try:
        return requests.get(url + "/readyz", timeout=10).status_code == 200
    except requests.RequestException:
        return False


@pytest.mark.slow
def test_a_primary_killed_under_load_loses_no_acknowledged_write(
    postgres_pair: pg.PostgresPair, opa_bin: str, tmp_path: Path
) -> None:
    conninfo = postgres_pair.conninfo() + " connect_timeout=2"
    upgrade(conninfo)
    tenants = ["tenant-a", "tenant-b"]
    ledger, halt = FailoverLedger(), threading.Event()
    with _two_instances(conninfo, opa_bin, tmp_path) as instances:
        for tenant in tenants:
            _approve(instances[0].url, tenant)
        writers = [
            threading.Thread(
                target=_failover_writer,
                args=(instances[n % 2].url, tenants[n // 2 % 2], f"s{n}", ledger, halt),
            )
            for n in range(8)
        ]
        try:
            for writer in writers:
                writer.start()
            _until(lambda: ledger.count("acknowledged") >= 40, "writes before the failover")
            postgres_pair.kill_primary()
            _until(lambda: ledger.count("store_unavailable") >= 8, "503 store_unavailable")
            for instance in instances:
                assert not _ready(instance.url)
            before = ledger.count("acknowledged")
            postgres_pair.promote()
            for instance in instances:
                _until(partial(_ready, instance.url), "ready again", seconds=120)
            _until(lambda: ledger.count("acknowledged") >= before + 40, "writes after the failover")
        finally:
            halt.set()
            for writer in writers:
                writer.join(120)
        unexpected = set(ledger.statuses) - {
            "acknowledged",
            "store_unavailable",
            "store_outcome_unknown",  # a COMMIT the kill cut off: unsure, as any 503 here
            "precondition_failed",
        }
        assert not unexpected, ledger.statuses

        for (tenant, session), digest in ledger.acknowledged.items():
            read = requests.get(
                _state(instances[1].url, tenant, session),
                headers=_bearer(tenant, "model-service", session),
                timeout=60,
            )
            assert read.status_code == 200, read.text
            if (tenant, session) not in ledger.unsure:  # its newest write was acknowledged
                assert read.json()["read_report"]["record"]["state_digest"] == digest
        for tenant, decision_id in ledger.decisions:
            found = requests.get(
                f"{instances[0].url}/v1/decisions/{decision_id}",
                headers=_bearer(tenant, "auditor"),
                timeout=60,
            )
            assert found.status_code == 200, decision_id
            assert found.json()["entry"]["outcome"]["applied"] is True
        _check_chains(instances, tenants, conninfo)
    print(f"outcomes: {ledger.statuses}")
