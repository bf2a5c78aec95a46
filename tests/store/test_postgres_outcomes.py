"""Issue 27: on PostgreSQL a COMMIT cut off is `503 store_outcome_unknown`, never retried blindly
by the client; `/readyz` proves the store takes writes.

The served process (tests/support/served.py) reaches PostgreSQL through a proxy of the
test's (tests/support/commit_cutter.py) that forwards a grant's COMMIT and then drops
the service's side of that connection: the server commits, the service cannot
know it. Readiness is asked while another session holds the lanes table in
ACCESS EXCLUSIVE mode, as `LOCK TABLE` from psql does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import requests
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sessionstate_client import NotFound, SessionStateClient, StoreOutcomeUnknown

from store.backends.postgres_schema import LANES_TABLE
from store.key_codec import TenantResourceLane, lane_prefix
from tests.runtime.test_postgres_service import TENANT, WORKSPACE, stop, token
from tests.support.commit_cutter import CommitCutter
from tests.support.served import Served, start


@pytest.fixture
def cutter(postgres_conninfo: str) -> Iterator[tuple[CommitCutter, str]]:
    """The proxy, and a connection string through it (no TLS: the proxy reads the messages)."""
    params = conninfo_to_dict(postgres_conninfo)
    proxy = CommitCutter(int(str(params["port"])))
    try:
        yield proxy, make_conninfo(**{**params, "port": str(proxy.port), "sslmode": "disable"})
    finally:
        proxy.close()


@pytest.fixture
def served(cutter: tuple[CommitCutter, str], opa_bin: str, tmp_path: Path) -> Iterator[Served]:
    running = start(opa_bin, tmp_path / "var", tmp_path, {"SESSIONSTATE_STORE": cutter[1]})
    try:
        yield running
    finally:
        stop(running)


def _client(served: Served, role: str) -> SessionStateClient:
    return SessionStateClient(served.url, token(role), retries=3, backoff=0.05)


def test_a_cut_commit_is_an_unknown_outcome_and_a_grant_is_not_sent_twice(
    served: Served, cutter: tuple[CommitCutter, str]
) -> None:
    proxy, _ = cutter
    grant = {"ttl_seconds": 3600, "reason": "cut commit"}
    with _client(served, "operator") as operator, _client(served, "auditor") as auditor:
        # The grant's transaction; its COMMIT reaches the server after the service knows it
        # is cut off, and the 503 waits for the server to finish it.
        proxy.arm(lane_prefix(TenantResourceLane.APPROVAL_PACKET), late=0.5)
        with pytest.raises(StoreOutcomeUnknown) as unknown:
            operator.grant_approval(TENANT, WORKSPACE, grant)
        assert proxy.cut.is_set()
        assert (unknown.value.status, unknown.value.reason) == (503, "store_outcome_unknown")
        assert unknown.value.attempts == 1  # a grant is never sent again after a 503
        assert unknown.value.decision_id is not None
        # The recipe: look the decision up. The server did commit it, with its approval.
        found = auditor.get_decision(unknown.value.decision_id)
        approvals = operator.list_approvals(TENANT, WORKSPACE).approvals
        grants = list(auditor.iter_decisions(action="approval.grant"))
    assert found.entry.outcome.applied is True and found.entry.outcome.status == 201
    assert [a.approval_id for a in approvals] == [found.entry.outcome.approval_id]
    assert len(grants) == 1  # granted once, not twice


def test_the_answer_of_an_unknown_outcome_is_a_problem_naming_its_decision(
    served: Served, cutter: tuple[CommitCutter, str]
) -> None:
    proxy, _ = cutter
    proxy.arm(lane_prefix(TenantResourceLane.APPROVAL_PACKET))
    answer = requests.post(
        f"{served.url}/v1/tenants/{TENANT}/workspaces/{WORKSPACE}/approvals",
        json={"ttl_seconds": 3600, "reason": "cut commit"},
        headers={"Authorization": f"Bearer {token('operator')}"},
        timeout=30,
    )
    assert answer.status_code == 503
    assert answer.headers["Content-Type"].startswith("application/problem+json")
    assert answer.headers["Retry-After"] == "5"
    assert answer.json()["reason"] == "store_outcome_unknown"
    decision_id = answer.headers["Sessionstate-Decision-Id"]
    with _client(served, "auditor") as auditor:
        assert auditor.get_decision(decision_id).entry.decision.decision_id == decision_id
        with pytest.raises(NotFound):
            auditor.get_decision("dec_" + "0" * 24)


def test_readyz_is_503_while_the_lanes_table_is_locked_and_200_after(
    served: Served, postgres_conninfo: str
) -> None:
    assert requests.get(served.url + "/readyz", timeout=30).status_code == 200
    with psycopg.connect(postgres_conninfo) as holder:  # a transaction, as psql's BEGIN
        holder.execute(f"LOCK TABLE {LANES_TABLE} IN ACCESS EXCLUSIVE MODE")
        locked = requests.get(served.url + "/readyz", timeout=30)
        holder.rollback()
    assert locked.status_code == 503
    body = locked.json()
    assert body["reasons"] == ["store_write_probe_failed"], body
    assert body["store"]["reachable"] is True and body["store"]["takes_writes"] is False
    released = requests.get(served.url + "/readyz", timeout=30)
    assert released.status_code == 200, released.json()
    assert released.json()["store"]["takes_writes"] is True
