"""Approvals and operations endpoints end to end, and failing closed when OPA fails."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from service.policy.sidecar import OpaSidecar, send_signal
from tests.support.factories import state_input
from tests.support.live import LiveService
from tests.support.processes import pause

APPROVALS = "/v1/tenants/tenant-a/workspaces/ws-1/approvals"


def grant(service: LiveService, token: str, **body: Any) -> Any:
    return service.call(
        "POST", APPROVALS, token, json={"ttl_seconds": 600, "reason": "tests"} | body
    )


def test_grant_list_and_revoke(service: LiveService) -> None:
    granted = grant(service, service.operator(), session_id="chat-1")
    assert granted.status_code == 201
    approval = granted.json()["approval"]
    assert granted.headers["Location"].endswith(approval["approval_id"])
    assert approval["operator"] == "op-1"
    assert approval["session_id"] == "chat-1"
    assert approval["issued_at"].endswith("Z")
    assert granted.json()["decision"]["action"] == "approval.grant"
    listed = service.call("GET", APPROVALS, service.operator())
    assert [a["approval_id"] for a in listed.json()["approvals"]] == [approval["approval_id"]]
    assert listed.json()["decision"]["action"] == "approval.list"
    revoked = service.call("DELETE", f"{APPROVALS}/{approval['approval_id']}", service.operator())
    assert revoked.status_code == 204
    assert revoked.content == b""
    assert "Content-Type" not in revoked.headers
    assert service.call("GET", APPROVALS, service.operator()).json()["approvals"] == []


def test_revoking_an_unknown_approval_is_404_with_the_decision(service: LiveService) -> None:
    answer = service.call("DELETE", f"{APPROVALS}/appr_{'0' * 24}", service.operator())
    assert answer.status_code == 404
    assert answer.json()["reason"] == "approval_not_found"
    assert answer.json()["decision"]["allow"] is True


def test_a_malformed_approval_id_is_400(service: LiveService) -> None:
    answer = service.call("DELETE", f"{APPROVALS}/not-an-id", service.operator())
    assert answer.status_code == 400
    assert answer.json()["reason"] == "invalid_approval_id"


def test_approvals_need_an_operator_of_the_tenant(service: LiveService) -> None:
    as_model = grant(service, service.token())
    assert as_model.status_code == 403
    assert as_model.json()["reason"] == "role_not_permitted"
    other_tenant = grant(service, service.operator(tenant="tenant-b"))
    assert other_tenant.status_code == 403
    assert other_tenant.json()["reason"] == "cross_tenant_scope_rejected"
    assert service.call("GET", APPROVALS, service.operator()).json()["approvals"] == []


@pytest.mark.parametrize(
    "body",
    [
        {"ttl_seconds": 0},
        {"ttl_seconds": 86401},
        {"reason": ""},
        {"reason": "x" * 257},
        {"session_id": "bad id"},
    ],
)
def test_approval_input_is_validated(service: LiveService, body: dict[str, Any]) -> None:
    answer = grant(service, service.operator(), **body)
    assert answer.status_code == 422
    assert answer.json()["reason"] == "validation_failed"


def test_an_expired_approval_never_counts(service: LiveService) -> None:
    assert grant(service, service.operator(), ttl_seconds=1).status_code == 201
    time.sleep(1.1)
    answer = service.call(
        "PUT", service.session_path() + "/state", service.token(), json=state_input()
    )
    assert answer.json()["reason"] == "session_state_operator_approval_missing"
    assert service.call("GET", APPROVALS, service.operator()).json()["approvals"] == []


# --- operations ---------------------------------------------------------------------------


def test_health_and_readiness(service: LiveService) -> None:
    assert service.call("GET", "/healthz").json() == {"status": "ok"}
    ready = service.call("GET", "/readyz")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True
    assert ready.json()["policy_revision"].startswith("sha256:")
    assert ready.json()["store_open"] is True


def test_metrics_count_requests_decisions_and_latency(service: LiveService) -> None:
    service.call("GET", service.session_path() + "/state", service.token())
    text = service.call("GET", "/metrics").text
    assert 'sessionstate_decisions_total{action="read",outcome="allow"} 1.0' in text
    assert "sessionstate_decision_latency_seconds_bucket" in text
    route = "/v1/tenants/<tenant_id>/workspaces/<workspace_id>/sessions/<session_id>/state"
    assert (
        f'sessionstate_http_requests_total{{method="GET",route="{route}",status="404"}} 1.0' in text
    )


def test_openapi_document_and_docs(service: LiveService) -> None:
    document = service.call("GET", "/openapi.json").json()
    assert document["openapi"] == "3.1.0"
    session = "/v1/tenants/{tenant_id}/workspaces/{workspace_id}/sessions/{session_id}"
    assert set(document["paths"][session + "/state"]) == {"put", "get", "delete"}
    assert "SessionStateInput" in document["components"]["schemas"]
    turns = document["components"]["schemas"]["SessionStateInput"]["properties"]["turns"]
    assert turns["maxItems"] == 2048  # a full record of 1,024 turns plus as many new ones
    docs = service.call("GET", "/docs/")
    assert docs.status_code == 200
    assert "swagger" in docs.text.lower()


# --- failing closed when OPA fails ---------------------------------------------------------


def _assert_unavailable(answer: Any) -> None:
    assert answer.status_code == 503
    assert answer.json()["reason"] == "policy_engine_unavailable"
    assert answer.json()["decision"]["reasons"] == ["policy_engine_unavailable"]


def test_opa_paused_is_503_nothing_written_and_recovers(
    fragile: tuple[LiveService, OpaSidecar],
) -> None:
    service, sidecar = fragile
    service.approve()
    pause(sidecar.pid)
    try:
        answer = service.call(
            "PUT", service.session_path() + "/state", service.token(), json=state_input()
        )
        _assert_unavailable(answer)
        assert answer.json()["write_report"]["applied"] is False
        assert service.call("GET", "/readyz").status_code == 503
    finally:
        send_signal(sidecar, signal.SIGCONT)
    assert (
        service.call("GET", service.session_path() + "/state", service.token()).status_code == 404
    )
    assert (
        service.call(
            "PUT", service.session_path() + "/state", service.token(), json=state_input()
        ).status_code
        == 201
    )
    # The refusal is in the decision log like any other decision.
    auditor = service.token("auditor", sub="au", tenant="tenant-a", workspace=None, session=None)
    entries = service.call("GET", "/v1/decisions?action=write", auditor).json()["decisions"]
    assert [(e["decision"]["reasons"], e["outcome"]) for e in entries] == [
        (["policy_engine_unavailable"], {"status": 503, "applied": False, "approval_id": None}),
        ([], {"status": 201, "applied": True, "approval_id": None}),
    ]


def test_opa_killed_is_503_and_recovers_without_a_service_restart(
    fragile: tuple[LiveService, OpaSidecar],
) -> None:
    service, sidecar = fragile
    service.approve()
    send_signal(sidecar, signal.SIGKILL)
    _assert_unavailable(
        service.call("PUT", service.session_path() + "/state", service.token(), json=state_input())
    )
    assert sidecar.wait_ready(15)
    assert (
        service.call("GET", service.session_path() + "/state", service.token()).status_code == 404
    )
    assert (
        service.call(
            "PUT", service.session_path() + "/state", service.token(), json=state_input()
        ).status_code
        == 201
    )
