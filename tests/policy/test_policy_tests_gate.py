"""Tests gate shipping: a policy set whose tests fail, or leave a rule uncovered, is neither
signed by `sessionstate policy build` nor served by a start, a reload, SIGHUP or the watcher;
the old revision keeps deciding, unless an operator's `policy reload --skip-tests` says so.

Real OPA (`opa test --coverage`), real `sessionstate serve` processes and the real CLI.
"""

from __future__ import annotations

import json
import os
import re
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
from service.policy.coverage_gate import CoverageGate
from service.policy.reload import (
    REQUEST_FILE,
    REQUEST_SECONDS,
    STATUS_FILE,
    PolicyStatus,
    ReloadRequest,
    read_status,
    take_request,
)
from tests.support.live import JWT_SECRET
from tests.support.paths import POLICY_DIR
from tests.support.served import ROOT, Served, start

READ = Path("sessionstate") / "read" / "read.rego"
READ_TESTS = Path("sessionstate") / "read" / "read_test.rego"
RULE = 'reasons contains "action_not_supported" if input.action != "read"'
# Every read frozen: the read tests that expect an allowed read now fail.
FROZEN = RULE + '\n\nreasons contains "reads_frozen_for_audit" if input.action == "read"'
# Only reads of ws-1 (the requests' here; no Rego test's): no test fails, none covers it.
UNCOVERED = (
    RULE + '\n\nreasons contains "reads_frozen_for_audit" if input.target.workspace_id == "ws-1"'
)
SESSION = "/v1/tenants/tenant-a/workspaces/ws-1/sessions/chat-1"


def policies_copy(tmp: Path, rule: str | None = None) -> Path:
    policies = tmp / "policies"
    shutil.copytree(POLICY_DIR, policies)
    if rule is not None:
        edit(policies, rule)
    return policies


def edit(policies: Path, rule: str) -> None:
    path = policies / READ
    text = path.read_text()
    current = next(known for known in (FROZEN, UNCOVERED, RULE) if known in text)
    path.write_text(text.replace(current, rule))


def failing_test(policies: Path) -> None:
    """A test that fails, added beside the read tests."""
    path = policies / READ_TESTS
    path.write_text(path.read_text() + "\ntest_fails_on_purpose if {\n\tfalse\n}\n")


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def eventually(check: Callable[[], bool], what: str) -> None:
    """Wait for an event (a reload's status, a watcher tick), not for an amount of time."""
    deadline = time.monotonic() + 30
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


# --- the gate ----------------------------------------------------------------------------


def test_the_default_policies_pass_their_tests_with_full_coverage(opa_bin: str) -> None:
    assert CoverageGate(opa_bin).findings(POLICY_DIR, load_bundle(POLICY_DIR)) == []


def test_the_gate_names_the_failing_test_and_the_file_short_of_coverage(
    opa_bin: str, tmp_path: Path
) -> None:
    failing = policies_copy(tmp_path / "failing")
    failing_test(failing)
    found = CoverageGate(opa_bin).findings(failing, load_bundle(failing))
    assert len(found) == 1
    assert found[0].startswith("sessionstate/read/read_test.rego:")
    assert found[0].endswith(": test failed: data.sessionstate.read_test.test_fails_on_purpose")

    # Sixteen tests fail at once: read's own and those of the packages that ask read's
    # decision (history ...); the first five are named and the rest counted.
    frozen = policies_copy(tmp_path / "frozen", FROZEN)
    found = CoverageGate(opa_bin).findings(frozen, load_bundle(frozen))
    assert len(found) == 6 and found[-1] == "and 11 more"
    named = re.compile(
        r"sessionstate/(\w+)/\1_test\.rego:\d+: test failed: data\.sessionstate\.\1_test\.test_\w+"
    )
    assert all(named.fullmatch(line) for line in found[:-1])

    uncovered = policies_copy(tmp_path / "uncovered", UNCOVERED)
    bundle = load_bundle(uncovered)
    assert CoverageGate(opa_bin).findings(uncovered, bundle) == [
        "sessionstate/read/read.rego: covered 90.0%, below the 100% "
        "SESSIONSTATE_POLICY_COVERAGE_MIN requires"
    ]
    assert CoverageGate(opa_bin, minimum=90).findings(uncovered, bundle) == []


def test_a_policy_set_without_tests_covers_nothing(opa_bin: str, tmp_path: Path) -> None:
    policies = policies_copy(tmp_path)
    for path in policies.rglob("*_test.rego"):
        path.unlink()
    found = CoverageGate(opa_bin).findings(policies, load_bundle(policies))
    assert found and all("covered 0.0%, below the 100%" in line for line in found[:-1])
    assert CoverageGate(opa_bin, minimum=0).findings(policies, load_bundle(policies)) == []


# --- `sessionstate policy build` ---------------------------------------------------------


@pytest.fixture
def hs256_key(tmp_path: Path) -> Path:
    key = tmp_path / "hs256.key"
    key.write_text("a-shared-secret-of-the-security-team-0123456789")
    return key


def build(
    opa_bin: str, policies: Path, key: Path, out: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    return cli(
        "policy",
        "build",
        "--signing-key",
        str(key),
        "--signing-alg",
        "HS256",
        "--serial",
        "1",
        "--out",
        str(out),
        env={"SESSIONSTATE_OPA_BIN": opa_bin, "SESSIONSTATE_POLICY_DIR": str(policies), **env},
    )


def test_policy_build_signs_nothing_when_a_test_fails(
    opa_bin: str, hs256_key: Path, tmp_path: Path
) -> None:
    policies = policies_copy(tmp_path)
    failing_test(policies)
    out = tmp_path / "bundle.tar.gz"
    done = build(opa_bin, policies, hs256_key, out)
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("sessionstate: not signed: the policies in ")
    assert "do not pass their tests: sessionstate/read/read_test.rego:" in line
    assert line.endswith("test failed: data.sessionstate.read_test.test_fails_on_purpose")
    assert not out.exists()


def test_policy_build_signs_nothing_below_the_coverage_threshold(
    opa_bin: str, hs256_key: Path, tmp_path: Path
) -> None:
    policies = policies_copy(tmp_path, UNCOVERED)
    out = tmp_path / "bundle.tar.gz"
    done = build(opa_bin, policies, hs256_key, out)
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.splitlines()
    assert line.endswith(
        "do not pass their tests: sessionstate/read/read.rego: covered 90.0%, below the 100% "
        "SESSIONSTATE_POLICY_COVERAGE_MIN requires"
    )
    assert not out.exists()

    # The deployment's own threshold: 90% lets this set be signed.
    lowered = build(opa_bin, policies, hs256_key, out, SESSIONSTATE_POLICY_COVERAGE_MIN="90")
    assert lowered.returncode == 0, lowered.stderr
    assert json.loads(lowered.stdout)["revision"] == load_bundle(policies).revision
    assert out.is_file()


@pytest.mark.parametrize("value", ["101", "-1", "ninety"])
def test_a_coverage_threshold_out_of_range_is_refused(
    opa_bin: str, hs256_key: Path, tmp_path: Path, value: str
) -> None:
    done = build(
        opa_bin,
        POLICY_DIR,
        hs256_key,
        tmp_path / "b.tar.gz",
        SESSIONSTATE_POLICY_COVERAGE_MIN=value,
    )
    assert done.returncode == 2
    assert "SESSIONSTATE_POLICY_COVERAGE_MIN" in done.stderr
    assert "a whole number from 0 to 100" in done.stderr
    assert not (tmp_path / "b.tar.gz").exists()


# --- a served directory ------------------------------------------------------------------


def read(served: Served) -> requests.Response:
    """A read of a session nothing was written to: 404 if allowed, 403 if not."""
    token = mint_token(
        JWT_SECRET.encode(),
        sub="s",
        roles=["model-service"],
        ttl_seconds=600,
        tenant="tenant-a",
        workspace="ws-1",
        session="chat-1",
    )
    return requests.get(
        served.url + SESSION + "/state", headers={"Authorization": f"Bearer {token}"}, timeout=5
    )


def reload(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    # The service's own settings: its JWT secret mints `--operator`'s token.
    env = {"SESSIONSTATE_DATA_DIR": str(served.data_dir), "SESSIONSTATE_JWT_SECRET": JWT_SECRET}
    return cli("policy", "reload", *args, env=env)


def readiness(served: Served) -> dict[str, object]:
    ready = requests.get(served.url + "/readyz", timeout=5)
    assert ready.status_code == 200  # the last good policies still decide
    body: dict[str, object] = ready.json()
    return body


def stop(served: Served) -> None:
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(20)


@pytest.fixture
def served_copy(opa_bin: str, tmp_path: Path) -> Iterator[tuple[Served, Path]]:
    policies = policies_copy(tmp_path)
    running = start(opa_bin, tmp_path / "var", tmp_path, {"SESSIONSTATE_POLICY_DIR": str(policies)})
    yield running, policies
    stop(running)


def test_a_reload_or_sighup_of_failing_tests_is_refused_until_an_operator_skips_them(
    served_copy: tuple[Served, Path],
) -> None:
    served, policies = served_copy
    good = read(served).json()["decision"]["policy_revision"]
    edit(policies, FROZEN)

    refused = reload(served)
    assert refused.returncode == 1, refused.stderr
    status = PolicyStatus.model_validate_json(refused.stdout)
    assert (status.outcome, status.reason, status.revision) == (
        "invalid",
        "policy_tests_failed",
        good,
    )
    assert status.deciding and not status.source_valid and status.tests_skipped_by is None
    # The frozen read fails its own tests and those of the packages that ask it (history).
    assert re.search(
        r"test failed: data\.sessionstate\.(read|history)_test\.test_", "\n".join(status.errors)
    )
    assert read(served).json()["decision"]["policy_revision"] == good  # still allowed: 404
    assert read(served).status_code == 404
    body = readiness(served)
    assert body["warnings"] == ["policy_source_invalid", "policy_tests_failed"]
    assert body["policy_source_valid"] is False
    rejected = [
        line for line in served.log.read_text().splitlines() if "policy_reload_rejected" in line
    ]
    assert json.loads(rejected[-1])["reason"] == "policy_tests_failed"

    # SIGHUP reloads the same directory the same way; it cannot skip the tests.
    before = read_status(served.data_dir / STATUS_FILE)
    assert before is not None
    os.kill(served.process.pid, signal.SIGHUP)
    eventually(
        lambda: (
            (read_status(served.data_dir / STATUS_FILE) or before).generation > before.generation
        ),
        "the SIGHUP reload reports",
    )
    hup = read_status(served.data_dir / STATUS_FILE)
    assert hup is not None and (hup.outcome, hup.reason) == ("invalid", "policy_tests_failed")
    assert hup.request_id is None
    assert read(served).json()["decision"]["policy_revision"] == good

    # An operator's override: served, and logged with the operator's id.
    skipped = reload(served, "--skip-tests", "--operator", "oncall-alice")
    assert skipped.returncode == 0, skipped.stderr
    status = PolicyStatus.model_validate_json(skipped.stdout)
    assert (status.outcome, status.reason, status.tests_skipped_by) == (
        "loaded",
        None,
        "oncall-alice",
    )
    assert status.revision == load_bundle(policies).revision != good
    assert status.errors  # what the tests found, for the record
    frozen = read(served)
    assert frozen.status_code == 403 and frozen.json()["reason"] == "reads_frozen_for_audit"
    assert frozen.json()["decision"]["policy_revision"] == status.revision
    body = readiness(served)
    assert body["warnings"] == ["policy_tests_skipped"] and body["policy_source_valid"] is True
    events = [
        json.loads(line) for line in served.log.read_text().splitlines() if line.startswith("{")
    ]
    [override] = [event for event in events if event["event"] == "policy_tests_skipped"]
    assert override["actor"] == "oncall-alice" and override["level"] == "warning"
    assert override["policy_revision"] == status.revision
    assert not (served.data_dir / REQUEST_FILE).exists()  # taken: no later SIGHUP finds it

    # The edit taken back: a set that passes its tests, and no warning left.
    edit(policies, RULE)
    back = reload(served)
    assert back.returncode == 0, back.stderr
    status = PolicyStatus.model_validate_json(back.stdout)
    assert (status.outcome, status.revision, status.tests_skipped_by) == ("loaded", good, None)
    assert readiness(served)["warnings"] == []


def test_a_reload_of_a_rule_no_test_covers_is_refused(served_copy: tuple[Served, Path]) -> None:
    served, policies = served_copy
    good = read(served).json()["decision"]["policy_revision"]
    edit(policies, UNCOVERED)
    refused = reload(served)
    assert refused.returncode == 1, refused.stderr
    status = PolicyStatus.model_validate_json(refused.stdout)
    assert (status.outcome, status.reason, status.revision) == (
        "invalid",
        "policy_tests_failed",
        good,
    )
    assert status.errors == [
        "sessionstate/read/read.rego: covered 90.0%, below the 100% "
        "SESSIONSTATE_POLICY_COVERAGE_MIN requires"
    ]
    assert read(served).status_code == 404  # the old revision decides: not frozen


def test_the_override_needs_an_operator_id(served_copy: tuple[Served, Path]) -> None:
    served, _ = served_copy
    # (`--operator` alone names who reloads: see tests/policy/test_policy_activations.py.)
    for args in (("--skip-tests",), ("--skip-tests", "--operator", "a b")):
        done = reload(served, *args)
        assert done.returncode == 2, args
        assert "--operator" in done.stderr and "Traceback" not in done.stderr
    assert not (served.data_dir / REQUEST_FILE).exists()


def test_a_start_whose_tests_fail_is_refused(opa_bin: str, tmp_path: Path) -> None:
    policies = policies_copy(tmp_path)
    failing_test(policies)
    done = cli(
        "serve",
        env={
            "SESSIONSTATE_OPA_BIN": opa_bin,
            "SESSIONSTATE_POLICY_DIR": str(policies),
            "SESSIONSTATE_DATA_DIR": str(tmp_path / "var"),
            "SESSIONSTATE_PORT": "0",
        },
    )
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("sessionstate: the policies in ")
    assert "(SESSIONSTATE_POLICY_DIR) do not pass their tests: " in line
    assert line.endswith("test failed: data.sessionstate.read_test.test_fails_on_purpose")


def test_the_watcher_refuses_an_edit_whose_tests_fail(opa_bin: str, tmp_path: Path) -> None:
    policies = policies_copy(tmp_path)
    served = start(
        opa_bin,
        tmp_path / "var",
        tmp_path,
        {"SESSIONSTATE_POLICY_DIR": str(policies)},
        args=("--watch-policies",),
    )
    try:
        good = read(served).json()["decision"]["policy_revision"]
        edit(policies, FROZEN)

        def refused() -> bool:
            status = read_status(served.data_dir / STATUS_FILE)
            return status is not None and status.reason == "policy_tests_failed"

        eventually(refused, "the watcher's reload is refused for its tests")
        assert read(served).status_code == 404
        assert read(served).json()["decision"]["policy_revision"] == good
    finally:
        stop(served)


# --- the reload request ------------------------------------------------------------------


def test_a_reload_request_is_taken_once_and_only_while_fresh(tmp_path: Path) -> None:
    path = tmp_path / "reload-request.json"
    now = time.time()
    request = ReloadRequest(request_id="r" * 22, asked_at=now, skip_tests_by="alice")
    path.write_text(request.model_dump_json())
    assert take_request(path, now + 1) == request
    assert take_request(path, now + 1) is None and not path.exists()

    path.write_text(request.model_dump_json())  # left by a command killed before it signalled
    assert take_request(path, now + REQUEST_SECONDS + 1) is None and not path.exists()
    path.write_text('{"request_id": "r", "skip_tests_by": "x y"}')
    assert take_request(path, now) is None and not path.exists()
