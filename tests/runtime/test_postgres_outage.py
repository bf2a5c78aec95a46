"""Issue 13, test 3: PostgreSQL stopped and started again under load, against the served process.

Writers keep writing while the database stops: requests get `503
store_unavailable` (problem+json) and `/readyz` says `store_unreachable`; once
it is back the service serves again without a restart, every acknowledged
write and its decision are there, and the chain verifies.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from store.backends.postgres_schema import upgrade
from tests.runtime.test_postgres_service import approve, state_path, stop, token
from tests.support import postgres as pg
from tests.support.factories import state_input
from tests.support.served import start

WRITERS = 4
PROBLEM = "application/problem+json"


@dataclass
class Ledger:
    digests: dict[str, str] = field(default_factory=dict)  # the newest acknowledged, per session
    unsure: set[str] = field(default_factory=set)  # sessions with a 503 since their last ack
    decisions: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, label: str) -> int:
        with self.lock:
            return self.statuses.get(label, 0)


def _writer(url: str, session: str, ledger: Ledger, stop_writing: threading.Event) -> None:
    http = requests.Session()
    headers = {"Authorization": f"Bearer {token('model-service', session)}"}
    turn = 0
    while not stop_writing.is_set():
        turn += 1
        body = state_input(turns=[{"turn_id": f"t{turn}", "role": "user", "payload": "x" * 400}])
        with ledger.lock:
            known = ledger.digests.get(session)
        sent = dict(headers, **({"If-Match": f'"{known}"'} if known else {}))
        try:
            answer = http.put(url + state_path(session), json=body, headers=sent, timeout=30)
        except requests.RequestException:
            continue
        with ledger.lock:
            if answer.status_code in (200, 201):
                ledger.digests[session] = answer.json()["record"]["state_digest"]
                ledger.decisions.append(answer.json()["decision"]["decision_id"])
                ledger.unsure.discard(session)
                label = "acknowledged"
            else:
                assert answer.headers["Content-Type"].startswith(PROBLEM), answer.text
                label = answer.json()["reason"]
                if answer.status_code == 503:
                    ledger.unsure.add(session)
                if answer.status_code == 412:  # a write of unknown outcome landed: re-read
                    ledger.digests.pop(session, None)
            ledger.statuses[label] = ledger.statuses.get(label, 0) + 1
        if label == "store_unavailable":
            time.sleep(0.05)
        if answer.status_code == 412:
            read = http.get(url + state_path(session), headers=headers, timeout=30)
            if read.status_code == 200:
                with ledger.lock:
                    ledger.digests[session] = read.json()["read_report"]["record"]["state_digest"]


def _until(condition: object, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"never: {what}")


def _readiness(url: str) -> tuple[int, dict[str, object]]:
    answer = requests.get(url + "/readyz", timeout=30)
    return answer.status_code, answer.json()


@pytest.mark.slow
def test_postgresql_stopped_and_started_under_load(
    postgres_own: pg.PostgresServer, opa_bin: str, tmp_path: Path
) -> None:
    conninfo = postgres_own.create_database()
    upgrade(conninfo)
    served = start(
        opa_bin,
        tmp_path / "var",
        tmp_path,
        {"SESSIONSTATE_STORE": conninfo.replace("host=", "connect_timeout=2 host=")},
    )
    ledger = Ledger()
    stop_writing = threading.Event()
    writers = [
        threading.Thread(target=_writer, args=(served.url, f"s{n}", ledger, stop_writing))
        for n in range(WRITERS)
    ]
    try:
        approve(served.url)
        for writer in writers:
            writer.start()
        _until(lambda: ledger.count("acknowledged") >= 20, "writes before the outage")
        postgres_own.stop()
        _until(lambda: ledger.count("store_unavailable") >= 8, "503 store_unavailable")
        status, readiness = _readiness(served.url)
        assert status == 503 and "store_unreachable" in readiness["reasons"], readiness  # type: ignore[operator]
        assert readiness["store"]["reachable"] is False  # type: ignore[index]
        auditor = {"Authorization": f"Bearer {token('auditor')}"}
        listed = requests.get(served.url + "/v1/decisions", headers=auditor, timeout=30)
        assert listed.status_code == 503 and listed.json()["reason"] == "store_unavailable"
        before = ledger.count("acknowledged")
        postgres_own.start()
        _until(lambda: _readiness(served.url)[0] == 200, "ready again", seconds=120)
        _until(lambda: ledger.count("acknowledged") >= before + 20, "writes after the outage")
    finally:
        stop_writing.set()
        for writer in writers:
            writer.join(60)
    try:
        unexpected = set(ledger.statuses) - {
            "acknowledged",
            "store_unavailable",
            "store_outcome_unknown",  # a commit the stop cut off: it may have landed (503)
            "precondition_failed",
        }
        assert not unexpected, ledger.statuses
        _check_everything_acknowledged_is_there(served.url, ledger)
    finally:
        stop(served)
    print(f"outcomes: {ledger.statuses}")


def _check_everything_acknowledged_is_there(url: str, ledger: Ledger) -> None:
    http = requests.Session()
    for session, digest in ledger.digests.items():
        headers = {"Authorization": f"Bearer {token('model-service', session)}"}
        read = http.get(url + state_path(session), headers=headers, timeout=30)
        assert read.status_code == 200, read.text
        if session not in ledger.unsure:  # its newest write was acknowledged
            assert read.json()["read_report"]["record"]["state_digest"] == digest
    auditor = {"Authorization": f"Bearer {token('auditor')}"}
    for decision_id in ledger.decisions:
        found = http.get(f"{url}/v1/decisions/{decision_id}", headers=auditor, timeout=30)
        assert found.status_code == 200, decision_id
        assert found.json()["entry"]["outcome"]["applied"] is True
    verify = http.get(f"{url}/v1/decisions/verify", headers=auditor, timeout=120).json()
    assert verify["ok"] is True, verify
