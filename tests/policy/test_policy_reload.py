"""Policy edits reach OPA only when meant to: a snapshot at start, replaced by a reload.

Real OPA sidecars over copies of the policies, and real `sessionstate serve`
processes: an edit is not served until SIGHUP or `sessionstate policy reload`,
a reload that does not compile keeps the last good policies and says so, and
`--watch-policies` serves edits by itself.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from service.auth.tokens import mint_token
from service.policy.bundle import load_bundle
from service.policy.bundle_server import BUNDLE_PATH
from service.policy.client import PolicyClient
from service.policy.reload import STATUS_FILE, PolicyStatus, read_status
from service.policy.sidecar import OpaSidecar
from service.policy.source import PolicySourceError
from tests.support.live import JWT_SECRET
from tests.support.paths import POLICY_DIR
from tests.support.policy_inputs import allowed_input
from tests.support.served import ROOT, Served, start

READ_RULE = 'reasons contains "action_not_supported" if input.action != "read"'
# Reads of workspace ws-1 (the tests' here, none of the Rego tests'), frozen, with a test:
# an edit that passes the tests and covers its rule, as a reload requires.
FROZEN_RULE = (
    READ_RULE
    + '\n\nreasons contains "reads_frozen_for_audit" if input.target.workspace_id == "ws-1"'
)
FROZEN_TEST = """
test_reads_of_ws_1_frozen_for_audit if {
	frozen := {"actor": {"workspace_id": "ws-1"}, "target": {"workspace_id": "ws-1"}}
	decision := read.decision with input as object.union(valid_input, frozen)
	decision == denied(["reads_frozen_for_audit"])
}
"""
SESSION = "/v1/tenants/tenant-a/workspaces/ws-1/sessions/chat-1"


def _copy_policies(tmp_path: Path) -> Path:
    policies = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, policies)
    return policies


def _edit(policies: Path, old: str, new: str) -> None:
    path = policies / "sessionstate" / "read" / "read.rego"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def _freeze_reads(policies: Path) -> None:
    _edit(policies, READ_RULE, FROZEN_RULE)
    tests = policies / "sessionstate" / "read" / "read_test.rego"
    tests.write_text(tests.read_text() + FROZEN_TEST)


def _break(policies: Path) -> None:
    _edit(policies, "decision :=", "decision :=:= {")


def _bundle_answer(opa_work_dir: Path, revision: str) -> int:
    """What OPA's next poll gets from the bundle server, holding `revision` (304: nothing new)."""
    config = json.loads((opa_work_dir / "opa-config.json").read_text())
    url = config["services"]["policies"]["url"] + BUNDLE_PATH
    return requests.get(url, headers={"If-None-Match": f'"{revision}"'}, timeout=5).status_code


def _eventually(check: Callable[[], bool], what: str) -> None:
    """Wait for an event (a poll of OPA's, a watcher tick), not for an amount of time."""
    deadline = time.monotonic() + 20
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


# --- the sidecar ---------------------------------------------------------------------------


@pytest.fixture
def own_sidecar(opa_bin: str, tmp_path: Path) -> Iterator[tuple[OpaSidecar, Path]]:
    policies = _copy_policies(tmp_path)
    running = OpaSidecar(opa_bin, policies, tmp_path / "opa")
    running.start()
    yield running, policies
    running.stop()


def test_an_edit_is_not_served_until_a_reload(own_sidecar: tuple[OpaSidecar, Path]) -> None:
    sidecar, policies = own_sidecar
    client = PolicyClient(sidecar.url, sidecar.token, timeout=1.0)
    before = client.decide(allowed_input("read"))
    assert before.allow
    _freeze_reads(policies)
    # What OPA can fetch is the start snapshot, however often it polls.
    assert _bundle_answer(sidecar.work_dir, before.policy_revision) == 304
    still = client.decide(allowed_input("read"))
    assert still.allow and still.policy_revision == before.policy_revision

    status = sidecar.reload_policies()
    assert status.outcome == "loaded" and status.deciding and status.source_valid
    assert status.revision == load_bundle(policies).revision != before.policy_revision
    after = client.decide(allowed_input("read"))
    assert after.allow is False
    assert after.reasons == ["reads_frozen_for_audit"]
    assert after.policy_revision == status.revision
    assert read_status(sidecar.status_path) == status


def test_a_reload_that_does_not_compile_keeps_the_last_good_policies(
    own_sidecar: tuple[OpaSidecar, Path],
) -> None:
    sidecar, policies = own_sidecar
    client = PolicyClient(sidecar.url, sidecar.token, timeout=1.0)
    good = sidecar.policies.served.revision
    _break(policies)
    refused = sidecar.reload_policies()
    assert refused.outcome == "invalid"
    assert refused.source_valid is False and sidecar.policies.valid is False
    assert refused.revision == good and refused.deciding
    assert refused.errors and refused.errors[0].startswith("sessionstate/read/read.rego:")
    assert "rego_parse_error" in refused.errors[0]
    assert _bundle_answer(sidecar.work_dir, good) == 304
    kept = client.decide(allowed_input("read"))
    assert kept.allow and kept.policy_revision == good
    assert sidecar.policies.reloads("invalid") == 1

    _edit(policies, "decision :=:= {", "decision :=")  # fixed: the same files as the snapshot
    again = sidecar.reload_policies()
    assert again.outcome == "unchanged" and again.source_valid and sidecar.policies.valid
    assert again.generation == refused.generation + 1


def test_watch_policies_serves_edits_by_themselves(opa_bin: str, tmp_path: Path) -> None:
    policies = _copy_policies(tmp_path)
    sidecar = OpaSidecar(opa_bin, policies, tmp_path / "opa", watch_policies=True)
    sidecar.start()
    try:
        client = PolicyClient(sidecar.url, sidecar.token, timeout=1.0)
        before = client.decide(allowed_input("read")).policy_revision
        _freeze_reads(policies)
        edited = load_bundle(policies).revision
        _eventually(
            lambda: client.decide(allowed_input("read")).policy_revision == edited,
            "the watched edit decides",
        )
        assert client.decide(allowed_input("read")).reasons == ["reads_frozen_for_audit"]
        assert edited != before

        _break(policies)
        _eventually(lambda: not sidecar.policies.valid, "the broken edit is refused")
        assert client.decide(allowed_input("read")).policy_revision == edited
        assert sidecar.policies.served.revision == edited
    finally:
        sidecar.stop()


@pytest.mark.parametrize("damage", ["broken", "empty", "missing"])
def test_policies_that_cannot_be_served_stop_the_start_before_opa(
    opa_bin: str, tmp_path: Path, damage: str
) -> None:
    policies = _copy_policies(tmp_path)
    if damage == "broken":
        _break(policies)
    elif damage == "empty":
        shutil.rmtree(policies)
        policies.mkdir()
    else:
        shutil.rmtree(policies)
    sidecar = OpaSidecar(opa_bin, policies, tmp_path / "opa")
    with pytest.raises(PolicySourceError) as refused:
        sidecar.start()
    assert "SESSIONSTATE_POLICY_DIR" in str(refused.value)
    assert sidecar.pid is None
    assert not (tmp_path / "opa").exists()
    sidecar.stop()  # as `serve` does on the way out: it must not hang


# --- the served process --------------------------------------------------------------------


def _model_service_token() -> str:
    return mint_token(
        JWT_SECRET.encode(),
        sub="s",
        roles=["model-service"],
        ttl_seconds=600,
        tenant="tenant-a",
        workspace="ws-1",
        session="chat-1",
    )


def _read(served: Served) -> requests.Response:
    """A read of a session nothing was written to: 404 if allowed, 403 if not; a decision."""
    return requests.get(
        served.url + SESSION + "/state",
        headers={"Authorization": f"Bearer {_model_service_token()}"},
        timeout=5,
    )


def _policy_reload(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "policy", "reload"],
        env={**os.environ, "SESSIONSTATE_DATA_DIR": str(data_dir)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def served_copy(opa_bin: str, tmp_path: Path) -> Iterator[tuple[Served, Path]]:
    policies = _copy_policies(tmp_path)
    running = start(opa_bin, tmp_path / "var", tmp_path, {"SESSIONSTATE_POLICY_DIR": str(policies)})
    yield running, policies
    _stop(running)


def _stop(served: Served) -> None:
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(20)


def test_served_edits_decide_only_after_policy_reload(
    served_copy: tuple[Served, Path],
) -> None:
    served, policies = served_copy
    first = _read(served)
    assert first.status_code == 404
    revision = first.json()["decision"]["policy_revision"]
    _freeze_reads(policies)
    assert _bundle_answer(served.data_dir / "opa", revision) == 304
    unchanged = _read(served)
    assert unchanged.status_code == 404
    assert unchanged.json()["decision"]["policy_revision"] == revision

    reloaded = _policy_reload(served.data_dir)
    assert reloaded.returncode == 0, reloaded.stderr
    status = PolicyStatus.model_validate_json(reloaded.stdout)
    assert status.outcome == "loaded" and status.deciding
    assert status.revision == load_bundle(policies).revision != revision
    frozen = _read(served)
    assert frozen.status_code == 403
    assert frozen.json()["reason"] == "reads_frozen_for_audit"
    assert frozen.json()["decision"]["policy_revision"] == status.revision
    assert requests.get(served.url + "/readyz", timeout=5).json()["policy_revision"] == (
        status.revision
    )
    assert '"event":"policy_reloaded"' in served.log.read_text()
    _stop(served)
    assert not (served.data_dir / "sessionstate.pid").exists()


def test_a_broken_edit_and_sighup_keep_the_old_revision_and_readyz_says_so(
    served_copy: tuple[Served, Path],
) -> None:
    served, policies = served_copy
    revision = _read(served).json()["decision"]["policy_revision"]
    started = read_status(served.data_dir / STATUS_FILE)
    assert started is not None and started.outcome == "started" and started.revision == revision
    _break(policies)
    pid = int((served.data_dir / "sessionstate.pid").read_text())
    assert pid == served.process.pid
    os.kill(pid, signal.SIGHUP)

    def reloaded() -> bool:
        status = read_status(served.data_dir / STATUS_FILE)
        return status is not None and status.generation > started.generation

    _eventually(reloaded, "the SIGHUP reload reports")
    status = read_status(served.data_dir / STATUS_FILE)
    assert status is not None and status.outcome == "invalid" and status.revision == revision
    assert _read(served).json()["decision"]["policy_revision"] == revision
    ready = requests.get(served.url + "/readyz", timeout=5)
    assert ready.status_code == 200  # the last good policies still decide
    body = ready.json()
    assert body["ready"] is True and body["reasons"] == []
    assert body["policy_source_valid"] is False
    assert body["warnings"] == ["policy_source_invalid"]
    assert body["policy_revision"] == revision
    metrics = requests.get(served.url + "/metrics", timeout=5).text
    assert "sessionstate_policy_source_valid 0.0" in metrics
    assert 'sessionstate_policy_reloads_total{outcome="invalid"} 1.0' in metrics
    log = served.log.read_text()
    assert '"event":"policy_reload_rejected"' in log
    assert "sessionstate/read/read.rego:" in log

    again = _policy_reload(served.data_dir)  # the command says the same, and fails
    assert again.returncode == 1
    assert PolicyStatus.model_validate_json(again.stdout).outcome == "invalid"


def test_served_watch_policies_serves_edits_by_themselves(opa_bin: str, tmp_path: Path) -> None:
    policies = _copy_policies(tmp_path)
    served = start(
        opa_bin,
        tmp_path / "var",
        tmp_path,
        {"SESSIONSTATE_POLICY_DIR": str(policies)},
        args=("--watch-policies",),
    )
    try:
        assert _read(served).status_code == 404
        _freeze_reads(policies)
        _eventually(lambda: _read(served).status_code == 403, "the watched edit decides")
        answer = _read(served).json()
        assert answer["reason"] == "reads_frozen_for_audit"
        assert answer["decision"]["policy_revision"] == load_bundle(policies).revision
    finally:
        _stop(served)


def test_policy_reload_needs_a_running_service_with_a_policy_directory(
    tcp_sidecar: OpaSidecar, opa_bin: str, tmp_path: Path
) -> None:
    nobody = _policy_reload(tmp_path / "nothing-runs-here")
    assert nobody.returncode == 2
    assert "no sessionstate service is running" in nobody.stderr

    external = start(
        opa_bin,
        tmp_path / "var",
        tmp_path,
        {"SESSIONSTATE_OPA_URL": tcp_sidecar.url, "SESSIONSTATE_OPA_TOKEN": str(tcp_sidecar.token)},
    )
    try:
        refused = _policy_reload(external.data_dir)
        assert refused.returncode == 2
        assert "SESSIONSTATE_OPA_URL" in refused.stderr
        assert "Traceback" not in refused.stderr
        external.process.send_signal(signal.SIGHUP)  # nothing to reload: it keeps serving
        _eventually(
            lambda: "policy_reload_not_applicable" in external.log.read_text(),
            "the SIGHUP is logged",
        )
        assert requests.get(external.url + "/readyz", timeout=5).status_code == 200
        assert external.process.poll() is None
    finally:
        _stop(external)
