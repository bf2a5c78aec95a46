"""Shadow mode (issue 15): a candidate policy set decides beside the live one, over real HTTP.

The served process runs two real OPA sidecars: the live one over `policies/`
and a shadow one over a copy whose read policy refuses every read. Reads, and
a version list (decided as a read), disagree (allow lost); nothing else does;
no status code changes; a killed shadow changes nothing the clients see.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from service.auth.tokens import mint_token
from tests.support.factories import state_input
from tests.support.hash_recipe import hashes_as_the_recipe_says
from tests.support.live import JWT_SECRET
from tests.support.paths import POLICY_DIR
from tests.support.served import Served, processes_using, start

TENANT, WORKSPACE, SESSION = "tenant-a", "ws-1", "chat-1"
SESSION_PATH = f"/v1/tenants/{TENANT}/workspaces/{WORKSPACE}/sessions/{SESSION}"
REFUSE_READS = """
# METADATA
# title: Shadow candidate
# description: Refuses every read (what the test's candidate changes).
reasons contains "role_not_permitted" if input.action == "read"
"""


def _token(role: str, **scope: str | None) -> str:
    return mint_token(
        JWT_SECRET.encode(), sub=f"{role}-1", roles=[role], ttl_seconds=21_600, **scope
    )


MODEL = _token("model-service", tenant=TENANT, workspace=WORKSPACE, session=SESSION)
WORKSPACE_MODEL = _token("model-service", tenant=TENANT, workspace=WORKSPACE)
OPERATOR = _token("operator", tenant=TENANT)
AUDITOR = _token("auditor", tenant=TENANT)
READS = ("read", "history")


def served_with_read_refusing_shadow(
    opa_bin: str, tmp_path: Path, timeout_ms: int
) -> Iterator[Served]:
    """`sessionstate serve` over `policies/`, its shadow a copy whose read policy refuses
    every read, answering within timeout_ms; killed on the way out."""
    candidate = tmp_path / "candidate"
    shutil.copytree(POLICY_DIR, candidate)
    read_policy = candidate / "sessionstate" / "read" / "read.rego"
    read_policy.write_text(read_policy.read_text() + REFUSE_READS)
    running = start(
        opa_bin,
        tmp_path / "var",
        tmp_path,
        {
            "SESSIONSTATE_SHADOW_POLICIES": str(candidate),
            "SESSIONSTATE_SHADOW_TIMEOUT_MS": str(timeout_ms),
        },
    )
    yield running
    if running.process.poll() is None:
        os.killpg(running.process.pid, signal.SIGKILL)
        running.process.wait()


@pytest.fixture
def shadowed(opa_bin: str, tmp_path: Path) -> Iterator[Served]:
    yield from served_with_read_refusing_shadow(opa_bin, tmp_path, 500)


def _call(served: Served, method: str, path: str, token: str, **kwargs: Any) -> requests.Response:
    return requests.request(
        method,
        served.url + path,
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
        **kwargs,
    )


def _traffic(served: Served) -> list[tuple[str, int]]:
    """One request of each kind a model service and an operator make: (decision id, status)."""
    answers = [
        _call(
            served,
            "POST",
            f"/v1/tenants/{TENANT}/workspaces/{WORKSPACE}/approvals",
            OPERATOR,
            json={"ttl_seconds": 600, "reason": "shadow test"},
        ),
        _call(served, "PUT", SESSION_PATH + "/state", MODEL, json=state_input()),
        _call(served, "GET", SESSION_PATH + "/state", MODEL),
        _call(served, "POST", SESSION_PATH + "/state/preview", MODEL, json=state_input()),
        _call(served, "POST", SESSION_PATH + "/replay-preview", MODEL, json={"max_inputs": 4}),
        _call(served, "GET", SESSION_PATH + "/state", MODEL),
        _call(served, "GET", SESSION_PATH + "/state/versions", MODEL),
        _call(served, "GET", SESSION_PATH.rsplit("/", 1)[0], WORKSPACE_MODEL),
    ]
    seen = []
    for answer in answers:
        assert answer.status_code in (200, 201), answer.text
        seen.append((answer.json()["decision"]["decision_id"], answer.status_code))
    return seen


def _entries(served: Served, query: str = "") -> list[dict[str, Any]]:
    answer = _call(served, "GET", "/v1/decisions" + query, AUDITOR)
    assert answer.status_code == 200, answer.text
    entries: list[dict[str, Any]] = answer.json()["decisions"]
    assert all(map(hashes_as_the_recipe_says, entries))  # shadow and all, as stored
    return entries


def _shadow_pids(served: Served) -> list[int]:
    marker = served.data_dir / "opa-shadow"
    return [pid for pid in processes_using(marker) if pid != served.process.pid]


def test_a_disagreeing_shadow_is_recorded_on_exactly_its_entries_and_changes_no_status(
    shadowed: Served,
) -> None:
    sent = _traffic(shadowed)
    by_id = {entry["decision"]["decision_id"]: entry for entry in _entries(shadowed)}
    for decision_id, _status in sent:
        entry = by_id[decision_id]
        shadow = entry["shadow"]
        if entry["decision"]["action"] in READS:  # a version list is decided as a read
            assert entry["decision"]["allow"] is True  # the live decision decided
            assert shadow["outcome"] == "allow_lost"
            assert shadow["agrees"] is False
            assert shadow["allow"] is False
            assert shadow["reasons"] == ["role_not_permitted"]
        else:
            assert shadow["outcome"] == "agree", entry["decision"]["action"]
            assert shadow["agrees"] is True
        assert shadow["policy_revision"].startswith("sha256:")
        assert shadow["policy_revision"] != entry["decision"]["policy_revision"]

    reads = {
        decision_id for decision_id, _ in sent if by_id[decision_id]["decision"]["action"] in READS
    }
    assert len(reads) == 3
    disagreeing = _entries(shadowed, "?shadow=disagree")
    assert {entry["decision"]["decision_id"] for entry in disagreeing} == reads
    agreeing = {entry["decision"]["decision_id"] for entry in _entries(shadowed, "?shadow=agree")}
    # The auditor's own listings are decisions too, and agree.
    assert agreeing >= {decision_id for decision_id, _ in sent} - reads
    assert not agreeing & reads

    exported = _call(shadowed, "GET", "/v1/decisions/export?shadow=disagree", AUDITOR)
    assert exported.status_code == 200
    lines = [json.loads(line) for line in exported.text.splitlines()]
    assert {line["decision_id"] for line in lines} == reads

    browser = requests.Session()
    signed_in = browser.post(
        shadowed.url + "/ui/login", data={"token": AUDITOR}, allow_redirects=False, timeout=10
    )
    assert signed_in.status_code == 303
    page = browser.get(shadowed.url + "/ui/decisions", params={"shadow": "disagree"}, timeout=10)
    assert page.status_code == 200
    assert set(re.findall(r'href="/ui/decisions/([^"?]+)"', page.text)) == reads
    assert "shadow: allow lost" in page.text
    one = browser.get(shadowed.url + f"/ui/decisions/{sorted(reads)[0]}", timeout=10)
    assert "Shadow policy" in one.text and "allow_lost" in one.text

    metrics = requests.get(shadowed.url + "/metrics", timeout=10).text
    assert 'sessionstate_shadow_decisions_total{action="read",outcome="allow_lost"} 2.0' in metrics
    assert (
        'sessionstate_shadow_decisions_total{action="history",outcome="allow_lost"} 1.0' in metrics
    )
    assert 'sessionstate_shadow_decisions_total{action="write",outcome="agree"} 1.0' in metrics
    assert 'sessionstate_shadow_decisions_total{action="list",outcome="agree"} 1.0' in metrics

    assert _call(shadowed, "GET", "/v1/decisions/verify", AUDITOR).json()["ok"] is True

    refused = _call(shadowed, "GET", "/v1/decisions?shadow=maybe", AUDITOR)
    assert refused.status_code == 422
    assert "maybe" not in refused.text


def test_a_killed_shadow_changes_nothing_the_clients_see(shadowed: Served) -> None:
    pids = _shadow_pids(shadowed)
    assert pids, "no shadow sidecar found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    sent = _traffic(shadowed)
    by_id = {entry["decision"]["decision_id"]: entry for entry in _entries(shadowed)}
    outcomes = {by_id[decision_id]["shadow"]["outcome"] for decision_id, _ in sent}
    # Each entry says the shadow made no decision, or (once restarted) what it decided.
    assert outcomes <= {"unavailable", "timeout", "agree", "allow_lost"}
    assert "unavailable" in outcomes or "timeout" in outcomes
    assert shadowed.process.poll() is None
    assert requests.get(shadowed.url + "/readyz", timeout=10).status_code == 200


def test_a_shadow_set_that_does_not_compile_stops_the_start_naming_its_setting(
    opa_bin: str, tmp_path: Path
) -> None:
    candidate = tmp_path / "candidate"
    shutil.copytree(POLICY_DIR, candidate)
    write_rego = candidate / "sessionstate" / "write" / "write.rego"
    write_rego.write_text(write_rego.read_text() + "\nthis is not rego\n")
    env = {
        **os.environ,
        "SESSIONSTATE_DATA_DIR": str(tmp_path / "var"),
        "SESSIONSTATE_OPA_BIN": opa_bin,
        "SESSIONSTATE_JWT_SECRET": JWT_SECRET,
        "SESSIONSTATE_SHADOW_POLICIES": str(candidate),
        "SESSIONSTATE_PORT": "0",  # refused before it serves: never 8080, which may be taken
    }
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "(SESSIONSTATE_SHADOW_POLICIES)" in done.stderr
    assert "SESSIONSTATE_POLICY_DIR" not in done.stderr and "Traceback" not in done.stderr
