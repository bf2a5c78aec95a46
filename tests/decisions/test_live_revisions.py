"""Which policy was live when: each revision's live intervals on the deployment, kept in the
store at start, at every reload and at stop, closed by the next start after a crash; and the
decisions that failed (OPA gave no answer) counted under the revision live then.

End to end over real `sessionstate serve` processes with their OPA sidecar; the store-level
rules on LevelDB and PostgreSQL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from service.api.reasons import Reason
from service.auth.tokens import mint_token
from service.cli import main
from service.decisions import live as live_revisions
from service.decisions import revisions
from service.decisions.journal import DecisionJournal
from service.decisions.live import LiveRevisions
from service.policy.reload import PolicyStatus
from store.backends.contract import Lanes
from tests.support.factories import decision_entry_body
from tests.support.live import JWT_SECRET
from tests.support.paths import POLICY_DIR
from tests.support.served import ROOT, Served, opa_pid, start

SESSION_STATE = "/v1/tenants/tenant-a/workspaces/ws-1/sessions/chat-1/state"
REVISIONS = "/v1/decisions/policy-revisions"
READ_REGO = Path("sessionstate") / "read" / "read.rego"


def _token(role: str, **scope: str | None) -> str:
    claims: dict[str, Any] = {"tenant": "tenant-a", "workspace": "ws-1", "session": "chat-1"}
    claims |= scope
    return mint_token(JWT_SECRET.encode(), sub="t-1", roles=[role], ttl_seconds=600, **claims)


def _read(served: Served) -> requests.Response:
    """A read of a session nothing was written to: a decision on tenant-a's chain."""
    headers = {"Authorization": f"Bearer {_token('model-service')}"}
    return requests.get(served.url + SESSION_STATE, headers=headers, timeout=10)


def _revisions(served: Served) -> dict[str, dict[str, Any]]:
    auditor = _token("auditor", workspace=None, session=None)
    answer = requests.get(
        served.url + REVISIONS, headers={"Authorization": f"Bearer {auditor}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    return {r["policy_revision"]: r for r in answer.json()["revisions"]}


def _reload(data_dir: Path) -> PolicyStatus:
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "policy", "reload"],
        env={**os.environ, "SESSIONSTATE_DATA_DIR": str(data_dir)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    status = PolicyStatus.model_validate_json(done.stdout)
    assert status.outcome == "loaded" and status.deciding
    return status


def _ended(revision: dict[str, Any]) -> list[str | None]:
    return [interval["ended"] for interval in revision["live"]]


def _within(at: str, revision: dict[str, Any]) -> bool:
    moment = datetime.fromisoformat(at)
    return any(
        datetime.fromisoformat(i["from"]) <= moment
        and (i["to"] is None or moment <= datetime.fromisoformat(i["to"]))
        for i in revision["live"]
    )


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    copy = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, copy)
    return copy


@pytest.fixture
def serving(opa_bin: str, tmp_path: Path, policies: Path) -> Iterator[list[Served]]:
    """Starts of one data dir, in order; whichever still runs is killed at the end."""
    started: list[Served] = []
    env = {"SESSIONSTATE_POLICY_DIR": str(policies)}
    started.append(start(opa_bin, tmp_path / "var", tmp_path, env))
    yield started
    for served in started:
        if served.process.poll() is None:
            os.killpg(served.process.pid, signal.SIGKILL)
            served.process.wait()


def test_a_revision_reloaded_away_and_back_is_live_twice_and_counts_what_failed_under_it(
    serving: list[Served],
    policies: Path,
    opa_bin: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served = serving[0]
    data_dir = served.data_dir
    read_rego = policies / READ_REGO
    original = read_rego.read_text()
    decided = [_read(served).json()["decision"]]
    first = decided[0]["policy_revision"]

    read_rego.write_text(original + "\n# another policy set: an edit that changes no decision\n")
    second = _reload(data_dir).revision
    assert second != first
    decided.append(_read(served).json()["decision"])
    read_rego.write_text(original)  # the first policy set again
    assert _reload(data_dir).revision == first
    decided.append(_read(served).json()["decision"])
    assert [d["policy_revision"] for d in decided] == [first, second, first]

    opa = opa_pid(data_dir)
    os.kill(opa, signal.SIGSTOP)  # OPA gives no answer: the reads fail closed
    try:
        failed = [_read(served) for _ in range(2)]
    finally:
        os.kill(opa, signal.SIGCONT)
    for answer in failed:
        assert answer.status_code == 503
        assert answer.json()["reason"] == Reason.POLICY_ENGINE_UNAVAILABLE
        assert answer.json()["decision"]["policy_revision"] == "unknown"

    listed = _revisions(served)
    a, b = listed[first], listed[second]
    assert _ended(a) == ["replaced", None]
    assert _ended(b) == ["replaced"]
    assert a["live"][0]["to"] == b["live"][0]["from"]
    assert b["live"][0]["to"] == a["live"][1]["from"]
    assert {i["instance"] for i in a["live"] + b["live"]} == {a["live"][0]["instance"]}
    assert (a["decisions"], a["by_action"], a["failed"]) == (2, {"read": 2}, 2)
    assert (b["decisions"], b["by_action"], b["failed"]) == (1, {"read": 1}, 0)
    assert all(_within(d["evaluated_at"], listed[d["policy_revision"]]) for d in decided)
    failed_at = [answer.json()["decision"]["evaluated_at"] for answer in failed]
    assert all(_within(at, a) and not _within(at, b) for at in failed_at)
    assert "unknown" not in listed  # a failure counts under the revision that was live

    # A crash leaves the interval open; the next start closes it at its own start.
    os.killpg(served.process.pid, signal.SIGKILL)
    served.process.wait()
    env = {"SESSIONSTATE_POLICY_DIR": str(policies)}
    serving.append(again := start(opa_bin, data_dir, tmp_path, env))
    after_crash = _revisions(again)[first]
    assert _ended(after_crash) == ["replaced", "restarted", None]
    assert after_crash["live"][1]["to"] == after_crash["live"][2]["from"]
    assert _ended(_revisions(again)[second]) == ["replaced"]

    # A clean stop closes it at the stop; the offline listing shows the same intervals.
    again.process.send_signal(signal.SIGTERM)
    assert again.process.wait(20) == 0
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    assert main(["decisions", "revisions", "--tenant", "tenant-a"]) == 0
    offline = {
        r["policy_revision"]: r for r in json.loads(capsys.readouterr().out)["tenants"]["tenant-a"]
    }
    assert _ended(offline[first]) == ["replaced", "restarted", "stopped"]
    assert offline[first]["live"][:2] == after_crash["live"][:2]
    assert offline[first]["failed"] == 2
    assert offline[second]["live"] == b["live"]


# --- the store: one deployment, several instances --------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 3, 3, 8, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(minutes=1)
        return self.now


def test_instances_of_one_deployment_append_to_one_record_per_revision(
    lanes_on_both: Lanes,
) -> None:
    r1, r2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    clock = _Clock()
    one = LiveRevisions(lanes_on_both, "replica-1", clock, owns=True)
    two = LiveRevisions(lanes_on_both, "replica-2", clock, owns=True)
    one.started(r1)
    two.started(r1)
    two.activate(r2)  # a rolling deploy: replica 2 first
    one.activate(r2)
    one.activate(r2)  # a reload that loaded nothing new opens nothing
    two.stopped()
    record = live_revisions.stored(lanes_on_both)
    assert [(i.instance, i.ended) for i in record[r1]] == [
        ("replica-1", "replaced"),
        ("replica-2", "replaced"),
    ]
    assert [(i.instance, i.ended) for i in record[r2]] == [
        ("replica-2", "stopped"),
        ("replica-1", None),
    ]
    # Before the rolling deploy only r1 was live; during it both were (the newer is named).
    assert live_revisions.live_at(record, record[r1][1].from_) == r1
    assert live_revisions.live_at(record, record[r2][0].from_) == r2
    # Replica 1 crashes and starts again: its open interval closes at that start.
    LiveRevisions(lanes_on_both, "replica-1", clock, owns=True).started(r1)
    record = live_revisions.stored(lanes_on_both)
    assert record[r2][1].ended == "restarted"
    assert record[r2][1].to == record[r1][2].from_


def test_a_failure_counts_under_the_live_revision_and_a_rebuild_agrees(
    lanes_on_both: Lanes,
) -> None:
    r1 = "sha256:" + "1" * 64
    clock = _Clock()
    live = LiveRevisions(lanes_on_both, "replica-1", clock, owns=True)
    live.started(r1)
    journal = DecisionJournal(lanes_on_both, live_revision=live.current)
    body = decision_entry_body("d-1", "tenant-a")
    failure = body.decision.model_copy(
        update={
            "policy_revision": "unknown",
            "reasons": [Reason.POLICY_ENGINE_UNAVAILABLE.value],
            "evaluated_at": clock().isoformat().replace("+00:00", "Z"),
        }
    )
    try:
        journal.record(body.model_copy(update={"decision": failure}), status=503)
    finally:
        journal.close()
    (kept,) = revisions.revisions(lanes_on_both, "tenant-a")
    assert (kept.policy_revision, kept.failed, kept.decisions, kept.first_decided_at) == (
        r1,
        1,
        0,
        None,
    )
    revisions.rebuild(lanes_on_both)  # from the entry's time and the live intervals
    assert revisions.revisions(lanes_on_both, "tenant-a") == [kept]
