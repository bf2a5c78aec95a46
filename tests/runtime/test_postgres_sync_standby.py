"""Issue 31: a COMMIT that waits for a synchronous standby is bounded, and `/readyz` says why.

PostgreSQL's `statement_timeout` does not bound a COMMIT waiting for a synchronous
standby. Two served instances on real servers, over real HTTP:

1. A primary whose synchronous standby is stopped: `/readyz` answers 503
   `store_sync_standby_missing` on both instances, a PUT answers 503 (the first
   `store_outcome_unknown`: its COMMIT was cut off after the store's timeout and may
   have committed locally; later ones `store_unavailable`, nothing stored) rather
   than hang, and nothing is acknowledged meanwhile. Once the standby is back, both
   instances are ready and write again, every acknowledged write and decision is
   there, and every chain verifies.
2. The operator's case: a standby made with `pg_basebackup -R` that kept the copied
   `synchronous_standby_names`, promoted after the primary is killed: the same, until
   the operator clears the setting on the new primary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import requests

from store.backends.postgres_schema import upgrade
from tests.runtime.test_postgres_replicas import (
    _approve,
    _bearer,
    _body,
    _check_chains,
    _state,
    _two_instances,
    _until,
)
from tests.support import postgres as pg
from tests.support.served import Served

TENANT = "tenant-a"
SESSIONS = ("s0", "s1", "s2")
PROBLEM = "application/problem+json"
DECISION_HEADER = "Sessionstate-Decision-Id"
MISSING = "store_sync_standby_missing"
CLIENT_SECONDS = 30  # a PUT still unanswered by then hung: the test fails


@dataclass
class Ledger:
    acknowledged: dict[str, str] = field(default_factory=dict)  # newest digest per session
    unsure: set[str] = field(default_factory=set)  # a 503 since the newest acknowledgement
    decisions: list[str] = field(default_factory=list)  # acknowledged decision ids
    unknown: list[str] = field(default_factory=list)  # decision ids of store_outcome_unknown
    turns: int = 0

    def put(self, url: str, session: str) -> requests.Response:
        """One PUT of the session, conditional on its newest known digest."""
        self.turns += 1
        known = self.acknowledged.get(session)
        headers = _bearer(TENANT, "model-service", session) | (
            {"If-Match": f'"{known}"'} if known else {"If-None-Match": "*"}
        )
        answer = requests.put(
            _state(url, TENANT, session),
            json=_body(f"{session}-{self.turns}"),
            headers=headers,
            timeout=CLIENT_SECONDS,
        )
        if answer.status_code in (200, 201):
            self.acknowledged[session] = answer.json()["record"]["state_digest"]
            self.decisions.append(answer.json()["decision"]["decision_id"])
            self.unsure.discard(session)
            return answer
        assert answer.headers["Content-Type"].startswith(PROBLEM), answer.text
        if answer.status_code == 503:
            self.unsure.add(session)
            if answer.json()["reason"] == "store_outcome_unknown":
                self.unknown.append(answer.headers[DECISION_HEADER])
        return answer

    def written(self, url: str, session: str) -> None:
        """Write session until acknowledged (after a 412, from the digest read back)."""
        for _ in range(5):
            answer = self.put(url, session)
            if answer.ok:
                return
            assert answer.status_code == 412, answer.text  # an unknown outcome that landed
            read = requests.get(
                _state(url, TENANT, session),
                headers=_bearer(TENANT, "model-service", session),
                timeout=CLIENT_SECONDS,
            )
            assert read.status_code == 200, read.text
            self.acknowledged[session] = read.json()["read_report"]["record"]["state_digest"]
        raise AssertionError(f"{session} was never written")


def _readiness(url: str) -> tuple[int, dict[str, object]]:
    answer = requests.get(url + "/readyz", timeout=CLIENT_SECONDS)
    return answer.status_code, answer.json()


def _reports(reason: str, url: str) -> bool:
    status, body = _readiness(url)
    reasons = body["reasons"]
    return status == 503 and isinstance(reasons, list) and reason in reasons


def _ready(url: str) -> bool:
    return _readiness(url)[0] == 200


def _refused_while_commits_wait(instances: list[Served], ledger: Ledger) -> None:
    """Not ready, with the reason; every PUT answers 503 (it does not hang), none acked."""
    for instance in instances:
        _until(partial(_reports, MISSING, instance.url), MISSING)
        _status, body = _readiness(instance.url)
        assert body["store"] == body["store"] | {"reachable": True, "takes_writes": False}, body
    reasons = []
    for n in range(4):
        answer = ledger.put(instances[n % 2].url, SESSIONS[n % len(SESSIONS)])
        assert answer.status_code == 503, answer.text
        reasons.append(answer.json()["reason"])
    assert set(reasons) <= {"store_outcome_unknown", "store_unavailable"}, reasons
    for instance in instances:  # still not ready: nothing changed
        assert _reports(MISSING, instance.url)


def _everything_there(instances: list[Served], ledger: Ledger, conninfo: str) -> None:
    for session in SESSIONS:
        ledger.written(instances[0].url, session)  # writes succeed again
    for session, digest in ledger.acknowledged.items():
        read = requests.get(
            _state(instances[1].url, TENANT, session),
            headers=_bearer(TENANT, "model-service", session),
            timeout=CLIENT_SECONDS,
        )
        assert read.status_code == 200, read.text
        assert read.json()["read_report"]["record"]["state_digest"] == digest
    for decision_id in ledger.decisions:
        found = requests.get(
            f"{instances[0].url}/v1/decisions/{decision_id}",
            headers=_bearer(TENANT, "auditor"),
            timeout=CLIENT_SECONDS,
        )
        assert found.status_code == 200, decision_id
        assert found.json()["entry"]["outcome"]["applied"] is True
    for decision_id in ledger.unknown:  # landed or not: either is an honest answer
        looked_up = requests.get(
            f"{instances[0].url}/v1/decisions/{decision_id}",
            headers=_bearer(TENANT, "auditor"),
            timeout=CLIENT_SECONDS,
        )
        assert looked_up.status_code in (200, 404), looked_up.text
    _check_chains(instances, [TENANT], conninfo)


def _written_before(instances: list[Served], ledger: Ledger) -> None:
    _approve(instances[0].url, TENANT)
    for n, session in enumerate(SESSIONS):
        ledger.written(instances[n % 2].url, session)
    for instance in instances:
        assert _ready(instance.url)


@pytest.mark.slow
def test_a_stopped_synchronous_standby_fails_readiness_and_bounds_every_commit(
    postgres_pair: pg.PostgresPair, opa_bin: str, tmp_path: Path
) -> None:
    conninfo = postgres_pair.conninfo() + " connect_timeout=2"
    upgrade(conninfo)
    ledger = Ledger()
    with _two_instances(conninfo, opa_bin, tmp_path) as instances:
        _written_before(instances, ledger)
        acknowledged = len(ledger.decisions)

        postgres_pair.standby.stop()
        postgres_pair.wait_standby_gone()
        _refused_while_commits_wait(instances, ledger)
        assert len(ledger.decisions) == acknowledged, "a write was acknowledged meanwhile"

        postgres_pair.standby.start()
        postgres_pair.wait_synchronous()
        for instance in instances:
            _until(partial(_ready, instance.url), "ready again", seconds=120)
        _everything_there(instances, ledger, conninfo)
    print(f"unknown outcomes: {len(ledger.unknown)}")


@pytest.mark.slow
def test_a_promoted_standby_that_kept_the_copied_synchronous_names_is_not_ready(
    opa_bin: str, tmp_path: Path
) -> None:
    reason = pg.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with pg.primary_and_standby(copied_sync_names=True) as pair:
        conninfo = pair.conninfo() + " connect_timeout=2"
        upgrade(conninfo)
        ledger = Ledger()
        with _two_instances(conninfo, opa_bin, tmp_path) as instances:
            _written_before(instances, ledger)
            acknowledged = len(ledger.decisions)

            pair.kill_primary()
            pair.promote()
            with pair.standby.connect() as promoted:  # the operator's case, as they saw it
                names = promoted.execute("SHOW synchronous_standby_names").fetchone()
                assert names == (pg.STANDBY_NAME,), names
            _refused_while_commits_wait(instances, ledger)
            assert len(ledger.decisions) == acknowledged, "a write was acknowledged meanwhile"

            with pair.standby.connect() as promoted:  # the fix: it has no standby to wait for
                promoted.execute("ALTER SYSTEM SET synchronous_standby_names = ''")
                promoted.execute("SELECT pg_reload_conf()")
            for instance in instances:
                _until(partial(_ready, instance.url), "ready again", seconds=120)
            _everything_there(instances, ledger, conninfo)
