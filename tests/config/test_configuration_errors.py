"""Configuration errors name the variable to fix, at once: settings, policies, OPA binary, token.

`sessionstate serve` as a real process for the start-up errors; an in-process
service over a real OPA that refuses its token for what requests and
`/readyz` then say.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from sessionstate_client import PolicyEngineRefused, PolicyEngineUnavailable, SessionStateClient

from service.api.openapi import openapi_document
from service.context import ServiceContext
from service.policy.sidecar import OpaSidecar
from tests.support.factories import scope
from tests.support.live import DIGEST_KEY, JWT_SECRET, LiveService, live_service, service_settings
from tests.support.paths import POLICY_DIR
from tests.support.served import ROOT, free_port

SECRET_LOOKING = "do-not-print-this-value-7f3a"


def _run(
    command: list[str], env_changes: dict[str, str], data_dir: Path, opa_bin: str
) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SESSIONSTATE_")}
    env |= {
        "SESSIONSTATE_DATA_DIR": str(data_dir),
        "SESSIONSTATE_PORT": str(free_port()),
        "SESSIONSTATE_JWT_SECRET": JWT_SECRET,
        "SESSIONSTATE_DIGEST_KEY": DIGEST_KEY,
        "SESSIONSTATE_OPA_BIN": opa_bin,
        **env_changes,
    }
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *command],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _serve(
    env_changes: dict[str, str], data_dir: Path, opa_bin: str
) -> subprocess.CompletedProcess[str]:
    return _run(["serve"], env_changes, data_dir, opa_bin)


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize(
    ("variable", "value", "accepted"),
    [
        ("SESSIONSTATE_DURABLE_WRITES", "maybe", "true or false"),
        ("SESSIONSTATE_PORT", "70000", "a whole number from 0 to 65535"),
        ("SESSIONSTATE_OPA_TIMEOUT_MS", "fast", "a whole number from 10 to 10000"),
        ("SESSIONSTATE_WATCH_POLICIES", "sometimes", "true or false"),
        ("SESSIONSTATE_DECISION_RETENTION_DAYS", "-5", "a whole number from 1 to 36500, or unset"),
        ("SESSIONSTATE_DECISION_SCRUB_SECONDS", "-1", "a whole number from 0 to 31536000"),
        ("SESSIONSTATE_LOG_ORIGIN", "has space", "printable ASCII without space or `+`, 1 to 200"),
        ("SESSIONSTATE_LOG_ORIGIN", "a+b", "printable ASCII without space or `+`, 1 to 200"),
    ],
)
def test_an_invalid_setting_is_one_line_naming_the_variable_and_what_it_accepts(
    opa_bin: str, tmp_path: Path, variable: str, value: str, accepted: str
) -> None:
    refused = _serve({variable: value}, tmp_path / "var", opa_bin)
    assert refused.returncode == 2
    line = _one_line(refused.stderr)
    assert line.startswith(f"sessionstate: invalid setting: {variable} (")
    assert f"accepts {accepted}" in line
    assert value not in line
    assert variable.removeprefix("SESSIONSTATE_").lower() not in line  # pydantic's field name
    assert not (tmp_path / "var").exists()


def test_a_bad_witness_list_stops_the_start_naming_the_variable(
    opa_bin: str, tmp_path: Path
) -> None:
    value = f'[{{"vkey": "{SECRET_LOOKING}", "url": "http://127.0.0.1:1"}}]'
    refused = _serve({"SESSIONSTATE_LOG_WITNESSES": value}, tmp_path / "var", opa_bin)
    assert refused.returncode == 2
    line = _one_line(refused.stderr)
    assert line.startswith("sessionstate: SESSIONSTATE_LOG_WITNESSES witness 1: its vkey must be")
    assert SECRET_LOOKING not in refused.stderr


def test_unknown_variables_are_warned_about_with_the_closest_setting(
    opa_bin: str, tmp_path: Path
) -> None:
    minted = _run(
        ["token", "--sub", "alice", "--role", "operator", "--tenant", "acme"],
        {
            "SESSIONSTATE_DURABLE_WRITE": SECRET_LOOKING,
            "SESSIONSTATE_FROBNICATE": SECRET_LOOKING,
            "SESSIONSTATE_TOKEN": SECRET_LOOKING,  # the example client's: not a mistake
        },
        tmp_path / "var",
        opa_bin,
    )
    assert minted.returncode == 0
    assert minted.stdout.count(".") == 2  # only the token on stdout
    warnings = minted.stderr.strip().splitlines()
    assert warnings == [
        "sessionstate: warning: SESSIONSTATE_DURABLE_WRITE is not a setting and is ignored; "
        "did you mean SESSIONSTATE_DURABLE_WRITES?",
        "sessionstate: warning: SESSIONSTATE_FROBNICATE is not a setting and is ignored",
    ]
    assert SECRET_LOOKING not in minted.stderr + minted.stdout


def test_a_misspelled_setting_is_warned_about_when_serve_starts(
    opa_bin: str, tmp_path: Path
) -> None:
    refused = _serve(
        {"SESSIONSTATE_DURABLE_WRITE": "true", "SESSIONSTATE_POLICY_DIR": str(tmp_path / "no")},
        tmp_path / "var",
        opa_bin,
    )
    assert refused.returncode == 2
    assert "did you mean SESSIONSTATE_DURABLE_WRITES?" in refused.stderr.splitlines()[0]


def test_a_missing_policy_directory_stops_the_start_at_once(opa_bin: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-policies"
    refused = _serve({"SESSIONSTATE_POLICY_DIR": str(missing)}, tmp_path / "var", opa_bin)
    assert refused.returncode == 2
    line = _one_line(refused.stderr)
    assert line == f"sessionstate: SESSIONSTATE_POLICY_DIR is not a directory: {missing}"
    assert "did not become ready" not in refused.stderr
    assert not (tmp_path / "var" / "opa").exists()  # no OPA was started


def test_policies_that_do_not_compile_stop_the_start_at_once(opa_bin: str, tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, policies)
    read_rego = policies / "sessionstate" / "read" / "read.rego"
    read_rego.write_text(read_rego.read_text().replace("decision :=", "decision :=:= {"))
    refused = _serve({"SESSIONSTATE_POLICY_DIR": str(policies)}, tmp_path / "var", opa_bin)
    assert refused.returncode == 2
    line = _one_line(refused.stderr)
    assert "(SESSIONSTATE_POLICY_DIR) cannot be served" in line
    assert "sessionstate/read/read.rego:" in line and "rego_parse_error" in line
    assert not (tmp_path / "var" / "opa").exists()


@pytest.mark.parametrize("opa", ["/nonexistent/bin/opa", "no-such-opa-on-path"])
def test_a_missing_opa_binary_stops_the_start_at_once(tmp_path: Path, opa: str) -> None:
    refused = _serve({}, tmp_path / "var", opa)
    assert refused.returncode == 2
    line = _one_line(refused.stderr)
    assert line == f"sessionstate: SESSIONSTATE_OPA_BIN names no executable OPA binary: {opa}"
    assert not (tmp_path / "var" / "opa").exists()


# --- an external OPA that refuses the service's token ---------------------------------------


@pytest.mark.parametrize("token", ["a-token-this-opa-was-not-started-with-0123456789", None])
def test_an_external_opa_that_refuses_the_token_stops_the_start(
    tcp_sidecar: OpaSidecar, opa_bin: str, tmp_path: Path, token: str | None
) -> None:
    # A real OPA on TCP locked to a token of its own.
    changes = {"SESSIONSTATE_OPA_URL": tcp_sidecar.url}
    if token is not None:
        changes["SESSIONSTATE_OPA_TOKEN"] = token
    refused = _serve(changes, tmp_path / "var", opa_bin)
    assert refused.returncode == 2
    line = _one_line(refused.stderr)
    sent = "the service's token" if token else "requests without a token"
    assert line.startswith(
        f"sessionstate: the OPA at SESSIONSTATE_OPA_URL refuses {sent} (401/403): "
        "set SESSIONSTATE_OPA_TOKEN"
    )
    assert "did not answer" not in line
    if token is not None:
        assert token not in refused.stderr


@pytest.fixture
def refused_service(tcp_sidecar: OpaSidecar, tmp_path: Path) -> Iterator[LiveService]:
    """A service whose OPA refuses its token (OPA restarted with another one, say)."""
    wrong = SimpleNamespace(url=tcp_sidecar.url, token="a-token-this-opa-was-not-started-with-0123")
    with live_service(cast(OpaSidecar, wrong), service_settings(tmp_path / "var")) as live:
        yield live


def test_requests_answer_policy_engine_refused_and_readyz_says_why(
    refused_service: LiveService,
) -> None:
    service = refused_service
    answer = service.call("GET", service.session_path() + "/state", service.token())
    assert answer.status_code == 503
    body = answer.json()
    assert body["reason"] == "policy_engine_refused"
    assert body["decision"]["reasons"] == ["policy_engine_refused"]
    assert body["decision"]["allow"] is False
    assert answer.headers["Retry-After"] == "60"

    ready = service.call("GET", "/readyz")
    assert ready.status_code == 503
    readiness = ready.json()
    assert readiness["reasons"] == ["opa_refused_token"]
    assert readiness["opa_reachable"] is True
    assert readiness["policy_revision"] is None
    assert readiness["policy_source_valid"] is None  # no policy directory of its own

    metrics = service.call("GET", "/metrics").text
    assert 'sessionstate_decisions_total{action="read",outcome="refused"} 1.0' in metrics


def test_the_client_raises_policy_engine_refused_without_retrying(
    refused_service: LiveService,
) -> None:
    client = SessionStateClient(refused_service.url, refused_service.token())
    with client, pytest.raises(PolicyEngineRefused) as refused:
        client.get_state(scope())
    assert isinstance(refused.value, PolicyEngineUnavailable)  # existing handlers still catch it
    assert refused.value.status == 503 and refused.value.reason == "policy_engine_refused"
    assert refused.value.attempts == 1  # Retry-After 60 is over the client's longest wait


def test_the_context_needs_no_policy_source_with_an_external_opa(
    tcp_sidecar: OpaSidecar, tmp_path: Path
) -> None:
    context = ServiceContext.open(
        service_settings(tmp_path / "var"), opa_url=tcp_sidecar.url, opa_token=tcp_sidecar.token
    )
    try:
        assert context.policy_source is None
        assert "sessionstate_policy_source_valid" not in context.metrics.render().decode()
    finally:
        context.close()


def test_the_refusal_is_documented_where_reasons_are_listed() -> None:
    document = openapi_document()
    state = document["paths"][
        "/v1/tenants/{tenant_id}/workspaces/{workspace_id}/sessions/{session_id}/state"
    ]
    assert "`policy_engine_refused`" in state["get"]["responses"]["503"]["description"]
    readiness = document["components"]["schemas"]["Readiness"]["properties"]
    assert "opa_refused_token" in readiness["reasons"]["description"]
    assert "policy_source_invalid" in readiness["warnings"]["description"]
    for doc in ("model-service.md", "operators.md", "policies.md"):
        assert "policy_engine_refused" in (ROOT / "docs" / doc).read_text(), doc
