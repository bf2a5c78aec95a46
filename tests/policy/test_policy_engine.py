"""Decisions through the real, locked-down OPA sidecar and the policy client.

The service's own sidecar listens on a Unix socket in a private directory
(tests/policy/test_sidecar_socket.py tries another user's connect); an OPA of
the operator's on TCP is locked with its token and `system.authz` (`tcp_sidecar`).
The fail-closed tests run on both.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from service.policy.bundle import load_bundle
from service.policy.client import PolicyClient
from service.policy.input import PolicyInput, render_schema
from service.policy.sidecar import OpaSidecar, send_signal
from store.canonical import canonical_digest
from tests.support.paths import POLICY_DIR
from tests.support.policy_inputs import APPROVAL, NOW, RECORD, SCOPE, allowed_input
from tests.support.processes import pause


@pytest.fixture(scope="module")
def client(sidecar: OpaSidecar) -> Iterator[PolicyClient]:
    opa = PolicyClient(sidecar.url, sidecar.token, timeout=1.0, transport="keep-alive")
    yield opa
    opa.close()


def other(**ids: str) -> dict[str, str]:
    return {**SCOPE, **ids}


def record_with(**changes: Any) -> dict[str, Any]:
    merged = json.loads(json.dumps(RECORD))
    for key, value in changes.items():
        if isinstance(value, dict):
            merged[key].update(value)
        else:
            merged[key] = value
    return merged


# Each reason code, produced end to end: (action, changes to the allowed input, expected reasons).
REASON_CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "write",
        {"deployment": {"durable_writes_enabled": False}},
        ["session_state_durable_writes_disabled"],
    ),
    ("write", {"approval": None}, ["session_state_operator_approval_missing"]),
    (
        "write",
        {"approval": APPROVAL | {"expires_at": NOW}},
        ["session_state_operator_approval_missing"],
    ),
    (
        "write",
        {"approval": APPROVAL | {"revoked": True}},
        ["session_state_operator_approval_missing"],
    ),
    (
        "write",
        {"approval": APPROVAL | {"session_id": "chat-2"}},
        ["session_state_operator_approval_missing"],
    ),
    (
        "write",
        {"actor": {"sub": "s", "roles": ["model-service"], **other(tenant_id="tenant-b")}},
        ["session_state_cross_tenant_write_rejected"],
    ),
    (
        "write",
        {"actor": {"sub": "s", "roles": ["model-service"], **other(session_id="chat-2")}},
        ["session_state_cross_session_write_rejected"],
    ),
    ("write", {"actor": {"sub": "s", "roles": ["operator"], **SCOPE}}, ["role_not_permitted"]),
    ("write", {"record": None}, ["session_state_record_missing"]),
    (
        "write",
        {"record": record_with(counts={"memory_anchors": 0})},
        ["session_state_memory_anchor_missing"],
    ),
    (
        "write",
        {"record": record_with(counts={"gene_anchors": 0})},
        ["session_state_gene_anchor_missing"],
    ),
    (
        "write",
        {"record": record_with(flags={"raw_messages_stored": True})},
        ["session_state_raw_messages_forbidden"],
    ),
    (
        "write",
        {"record": record_with(flags={"write_allowed": True})},
        ["session_state_preview_flags_invalid"],
    ),
    ("write", {"record": record_with(digest_valid=False)}, ["session_state_digest_mismatch"]),
    (
        "write",
        {"record": record_with(schema="sessionstate.record.v0")},
        ["session_state_schema_mismatch"],
    ),
    (
        "read",
        {"actor": {"sub": "s", "roles": ["model-service"], **other(tenant_id="tenant-b")}},
        ["cross_tenant_scope_rejected"],
    ),
    (
        "read",
        {"actor": {"sub": "s", "roles": ["model-service"], **other(workspace_id="ws-2")}},
        ["cross_session_scope_rejected"],
    ),
    ("read", {"actor": {"sub": "s", "roles": ["auditor"], **SCOPE}}, ["role_not_permitted"]),
    (
        "replay",
        {"actor": {"sub": "s", "roles": ["model-service"], **other(tenant_id="tenant-b")}},
        ["session_replay_cross_tenant_rejected"],
    ),
    (
        "replay",
        {"actor": {"sub": "s", "roles": ["model-service"], **other(session_id="chat-2")}},
        ["session_replay_cross_session_rejected"],
    ),
    (
        "approval.grant",
        {"actor": {"sub": "op", "roles": ["operator"], "tenant_id": "tenant-b"}},
        ["cross_tenant_scope_rejected"],
    ),
    (
        "approval.revoke",
        {"actor": {"sub": "op", "roles": ["model-service"], **SCOPE}},
        ["role_not_permitted"],
    ),
    (
        "decisions.read",
        {"actor": {"sub": "au", "roles": ["auditor"], "tenant_id": "tenant-b"}},
        ["cross_tenant_scope_rejected"],
    ),
    (
        "decisions.read",
        {"actor": {"sub": "au", "roles": ["operator"], "tenant_id": "tenant-a"}},
        ["role_not_permitted"],
    ),
]


@pytest.mark.parametrize(("action", "changes", "reasons"), REASON_CASES)
def test_each_reason_code_comes_from_the_policy(
    client: PolicyClient, action: str, changes: dict[str, Any], reasons: list[str]
) -> None:
    trace = client.decide(allowed_input(action, **changes))
    assert trace.allow is False
    assert trace.reasons == reasons


@pytest.mark.parametrize(
    "action",
    ["write", "preview", "read", "replay", "approval.grant", "approval.list", "decisions.read"],
)
def test_allowed_inputs_are_allowed(client: PolicyClient, action: str) -> None:
    trace = client.decide(allowed_input(action))
    assert trace.allow is True
    assert trace.reasons == []


def test_a_denial_lists_every_failing_gate(client: PolicyClient) -> None:
    trace = client.decide(
        allowed_input(
            "write",
            deployment={"durable_writes_enabled": False},
            approval=None,
            record=record_with(counts={"memory_anchors": 0, "gene_anchors": 0}),
        )
    )
    assert trace.reasons == [
        "session_state_durable_writes_disabled",
        "session_state_gene_anchor_missing",
        "session_state_memory_anchor_missing",
        "session_state_operator_approval_missing",
    ]


def test_preview_is_a_dry_run_that_reports_write_blockers(client: PolicyClient) -> None:
    trace = client.decide(
        allowed_input("preview", deployment={"durable_writes_enabled": False}, approval=None)
    )
    assert trace.allow is True
    assert trace.reasons == [
        "session_state_durable_writes_disabled",
        "session_state_operator_approval_missing",
    ]
    assert trace.policy == "sessionstate/write"


def test_the_trace_carries_the_contract_fields(client: PolicyClient, sidecar: OpaSidecar) -> None:
    policy_input = allowed_input("read")
    trace = client.decide(policy_input)
    assert trace.action == "read"
    assert trace.policy == "sessionstate/read"
    assert trace.policy_revision == load_bundle(POLICY_DIR).revision
    assert trace.input_digest == canonical_digest(
        policy_input.model_dump(mode="json", by_alias=True)
    )
    assert trace.engine.name == "opa"
    assert trace.engine.version == "1.22.3"
    assert isinstance(trace.latency_ms, float)
    assert trace.evaluated_at.endswith("Z")
    # OPA's own decision id, as its console decision log records it.
    deadline = time.monotonic() + 5
    while trace.decision_id not in sidecar.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f'"decision_id":"{trace.decision_id}"' in sidecar.log_path.read_text()


def test_the_revision_is_the_same_until_a_policy_changes(client: PolicyClient) -> None:
    revisions = {
        client.decide(allowed_input(action)).policy_revision
        for action in ("read", "write", "replay")
    }
    assert revisions == {load_bundle(POLICY_DIR).revision}


def test_the_committed_input_schema_is_current() -> None:
    committed = (POLICY_DIR / "schemas" / "policy_input.json").read_text()
    assert committed == render_schema(), "run `make schema` and commit the result"


# --- the sidecar's lock-down -------------------------------------------------------------


def test_unauthenticated_reads_of_opa_data_are_refused_on_tcp(tcp_sidecar: OpaSidecar) -> None:
    assert requests.get(f"{tcp_sidecar.url}/v1/data", timeout=2).status_code == 401
    assert (
        requests.post(
            f"{tcp_sidecar.url}/v1/data/sessionstate/write/decision", json={}, timeout=2
        ).status_code
        == 401
    )


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/v1/policies/evil"),
        ("DELETE", "/v1/policies/sessionstate/write/write.rego"),
        ("PUT", "/v1/data/sessionstate"),
        ("PATCH", "/v1/data"),
        ("GET", "/v1/data"),
        ("GET", "/v1/policies"),
        ("POST", "/v1/query"),
    ],
)
def test_runtime_changes_are_refused_on_tcp_even_with_the_token(
    tcp_sidecar: OpaSidecar, method: str, path: str
) -> None:
    response = requests.request(
        method,
        tcp_sidecar.url + path,
        json={"query": "data"} if path == "/v1/query" else {"allow": True},
        headers={"Authorization": f"Bearer {tcp_sidecar.token}"},
        timeout=2,
    )
    assert response.status_code == 401


# --- failing closed ----------------------------------------------------------------------


# Both ways a decision reaches OPA fail closed the same way (service.policy.transport).
TRANSPORTS = pytest.mark.parametrize("transport", ["keep-alive", "opa-python-client"])
# Where the sidecar listens, and how it is asked: on its Unix socket (the service's own: one
# transport, the kept-alive socket), or on TCP (an operator's OPA: both transports).
LISTENING = pytest.mark.parametrize(
    ("private_sidecar", "transport"),
    [("unix", "keep-alive"), ("tcp", "keep-alive"), ("tcp", "opa-python-client")],
    indirect=["private_sidecar"],
)


def assert_unavailable(client: PolicyClient) -> None:
    trace = client.decide(allowed_input("read"))
    assert trace.allow is False
    assert trace.reasons == ["policy_engine_unavailable"]
    assert trace.decision_id.startswith("local-")


@TRANSPORTS
def test_fails_closed_when_nothing_listens(transport: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert_unavailable(
        PolicyClient(f"http://127.0.0.1:{port}", "token", timeout=0.25, transport=transport)
    )


@TRANSPORTS
def test_a_wrong_token_fails_closed_as_a_refusal(tcp_sidecar: OpaSidecar, transport: str) -> None:
    for token in ("not-the-token", None):
        trace = PolicyClient(tcp_sidecar.url, token, timeout=0.5, transport=transport).decide(
            allowed_input("read")
        )
        assert trace.allow is False
        assert trace.reasons == ["policy_engine_refused"]  # not "did not answer in time"
        assert trace.engine_refused and trace.engine_unavailable
        assert trace.decision_id.startswith("local-")


@pytest.fixture
def private_sidecar(
    opa_bin: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[OpaSidecar, Path]]:
    """A sidecar of this test's own over a copy of the policies it may edit or break, on a
    Unix socket unless the test asks for TCP."""
    policies = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, policies)
    listen = getattr(request, "param", "unix")
    running = OpaSidecar(
        opa_bin, policies, tmp_path / "opa", max_backoff_seconds=0.5, listen=listen
    )
    running.start()
    yield running, policies
    running.stop()


@LISTENING
def test_fails_closed_when_opa_is_killed_and_recovers_by_itself(
    private_sidecar: tuple[OpaSidecar, Path], transport: str
) -> None:
    sidecar, _ = private_sidecar
    client = PolicyClient(sidecar.url, sidecar.token, timeout=0.25, transport=transport)
    assert client.decide(allowed_input("read")).allow
    pid = sidecar.pid
    send_signal(sidecar, signal.SIGKILL)
    deadline = time.monotonic() + 2
    while sidecar.pid == pid and time.monotonic() < deadline:
        assert_unavailable(client)
        time.sleep(0.02)
    assert sidecar.wait_ready(15)
    assert sidecar.restarts >= 1
    assert client.decide(allowed_input("read")).allow


@LISTENING
def test_fails_closed_when_opa_is_paused(
    private_sidecar: tuple[OpaSidecar, Path], transport: str
) -> None:
    sidecar, _ = private_sidecar
    client = PolicyClient(sidecar.url, sidecar.token, timeout=0.25, transport=transport)
    pause(sidecar.pid)
    try:
        assert_unavailable(client)  # the client's timeout answers, not a hang
    finally:
        send_signal(sidecar, signal.SIGCONT)
    assert client.decide(allowed_input("read")).allow


def _rewrite(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def _reload(sidecar: OpaSidecar, policies: Path) -> None:
    """Serve the edited directory: OPA decides with it once the reload returns."""
    status = sidecar.reload_policies()
    assert status.outcome == "loaded"
    assert status.deciding
    assert status.revision == load_bundle(policies).revision


UNSEEN = "tenant-unseen"  # no policy file names it: the admission checks do not ask for it
_DECISION = 'decision := {"allow": allow, "reasons": sort(reasons)}'


def _unseen_read() -> PolicyInput:
    scope = {"tenant_id": UNSEEN, "workspace_id": "ws-1", "session_id": "chat-1"}
    return allowed_input(
        "read", target=scope, actor={"sub": "svc-1", "roles": ["model-service"], **scope}
    )


def assert_undefined(client: PolicyClient, revision: str) -> None:
    """OPA answered, without a decision: the policies' fault, named as such, under the
    revision OPA names; never "did not answer"."""
    trace = client.decide(_unseen_read())
    assert trace.allow is False
    assert trace.reasons == ["policy_decision_undefined"]
    assert trace.decision_undefined and trace.engine_unavailable
    assert not trace.decision_id.startswith("local-")
    assert trace.policy_revision == revision
    assert client.decide(allowed_input("read")).allow  # every other tenant's reads decide


@LISTENING
def test_fails_closed_when_the_decision_is_undefined(
    private_sidecar: tuple[OpaSidecar, Path], transport: str
) -> None:
    sidecar, policies = private_sidecar
    client = PolicyClient(sidecar.url, sidecar.token, timeout=0.5, transport=transport)
    _rewrite(
        policies / "sessionstate" / "read" / "read.rego",
        _DECISION,
        f'{_DECISION} if input.target.tenant_id != "{UNSEEN}"',
    )
    _reload(sidecar, policies)
    assert_undefined(client, load_bundle(policies).revision)


@LISTENING
def test_fails_closed_on_a_malformed_result(
    private_sidecar: tuple[OpaSidecar, Path], transport: str
) -> None:
    sidecar, policies = private_sidecar
    client = PolicyClient(sidecar.url, sidecar.token, timeout=0.5, transport=transport)
    _rewrite(
        policies / "sessionstate" / "read" / "read.rego",
        _DECISION,
        f'{_DECISION} if input.target.tenant_id != "{UNSEEN}"\n\n'
        f'decision := {{"allow": "yes", "was": allow}} if input.target.tenant_id == "{UNSEEN}"',
    )
    _reload(sidecar, policies)
    assert_undefined(client, load_bundle(policies).revision)


def test_editing_a_policy_changes_the_revision_and_the_decision(
    private_sidecar: tuple[OpaSidecar, Path],
) -> None:
    sidecar, policies = private_sidecar
    client = PolicyClient(sidecar.url, sidecar.token, timeout=0.5)
    before = client.decide(allowed_input("read"))
    assert before.allow
    _rewrite(
        policies / "sessionstate" / "read" / "read.rego",
        'reasons contains "action_not_supported" if input.action != "read"',
        'reasons contains "action_not_supported" if input.action != "read"\n\n'
        'reasons contains "reads_frozen_for_audit" if input.action == "read"',
    )
    _reload(sidecar, policies)
    after = client.decide(allowed_input("read"))
    assert after.allow is False
    assert after.reasons == ["reads_frozen_for_audit"]
    assert after.policy_revision == load_bundle(policies).revision != before.policy_revision


def test_a_policy_edit_that_does_not_compile_keeps_the_last_good_bundle(
    private_sidecar: tuple[OpaSidecar, Path],
) -> None:
    sidecar, policies = private_sidecar
    client = PolicyClient(sidecar.url, sidecar.token, timeout=0.5)
    before = client.decide(allowed_input("read"))
    _rewrite(policies / "sessionstate" / "read" / "read.rego", "decision :=", "decision :=:= {")
    status = sidecar.reload_policies()
    assert status.outcome == "invalid"
    assert status.revision == before.policy_revision
    assert status.errors[0].startswith("sessionstate/read/read.rego:")
    after = client.decide(allowed_input("read"))
    assert after.allow is True
    assert after.policy_revision == before.policy_revision


def test_a_forked_child_cannot_stop_the_sidecar(sidecar: OpaSidecar) -> None:
    """A forked child inherits the sidecar object; its exit must leave OPA running."""
    import os

    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        sidecar.stop()
        os._exit(0)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sidecar.ready()
