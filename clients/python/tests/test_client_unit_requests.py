"""What the client puts on the wire: methods, paths, queries, bodies and headers.

The bearer token goes in `Authorization` on every call but the operational
ones and the token exchange (whose credential is the form's subject token).
Preconditions are `If-Match` with a quoted digest or `If-None-Match: *`.
Scope ids are checked before anything is sent, and bodies are strict JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
from conftest import SCOPE, SESSION_PATH, URL, Scripted, refusal, template
from sessionstate_client import (
    ApprovalGrantInput,
    NotFound,
    SessionStateClient,
    SessionStateError,
    SessionStateInput,
    TenantScope,
)

NOT_FOUND = refusal(404, "not_found")
DIGEST = "sha256:" + "a" * 64


Call = Callable[[SessionStateClient], Any]


def sent(call: Call, *, token: str | None = "token-1") -> httpx.Request:
    """The one request a call sends (the fake answers 404)."""
    service = Scripted(NOT_FOUND)
    with service.sync_client(token) as client, pytest.raises(SessionStateError):
        list(call(client))  # only the export is an iterator; the others raised already
    (request,) = service.requests
    return request


def test_a_session_call_goes_to_the_sessions_path_with_the_bearer_token() -> None:
    request = sent(lambda c: c.get_state(SCOPE))
    assert (request.method, request.url.path) == ("GET", SESSION_PATH + "/state")
    assert request.headers["Authorization"] == "Bearer token-1"
    assert request.headers["Accept"] == "application/json"
    assert "Content-Type" not in request.headers and request.content == b""


@pytest.mark.parametrize(
    ("call", "method", "path"),
    [
        (lambda c: c.preview_state(SCOPE, template()), "POST", SESSION_PATH + "/state/preview"),
        (lambda c: c.put_state(SCOPE, template()), "PUT", SESSION_PATH + "/state"),
        (lambda c: c.replay_preview(SCOPE), "POST", SESSION_PATH + "/replay-preview"),
        (
            lambda c: c.grant_approval("tenant-a", "ws-1", {"ttl_seconds": 1, "reason": "r"}),
            "POST",
            "/v1/tenants/tenant-a/workspaces/ws-1/approvals",
        ),
        (
            lambda c: c.list_approvals("tenant-a", "ws-1"),
            "GET",
            "/v1/tenants/tenant-a/workspaces/ws-1/approvals",
        ),
        (
            lambda c: c.revoke_approval("tenant-a", "ws-1", "appr_1"),
            "DELETE",
            "/v1/tenants/tenant-a/workspaces/ws-1/approvals/appr_1",
        ),
        (lambda c: c.list_decisions(), "GET", "/v1/decisions"),
        (lambda c: c.get_decision("dec 1/2"), "GET", "/v1/decisions/dec%201%2F2"),
        (lambda c: c.verify_decisions(), "GET", "/v1/decisions/verify"),
        (lambda c: c.policy_revisions(), "GET", "/v1/decisions/policy-revisions"),
        (lambda c: c.export_decisions(), "GET", "/v1/decisions/export"),
    ],
)
def test_each_call_has_its_method_and_path(call: Call, method: str, path: str) -> None:
    request = sent(call)
    assert (request.method, request.url.raw_path.decode().split("?")[0]) == (method, path)
    assert request.headers["Authorization"] == "Bearer token-1"


@pytest.mark.parametrize(
    ("call", "path"),
    [
        (lambda c: c.healthz(), "/healthz"),
        (lambda c: c.readyz(), "/readyz"),
        (lambda c: c.metrics(), "/metrics"),
        (lambda c: c.openapi(), "/openapi.json"),
    ],
)
def test_operational_calls_never_send_the_token(call: Call, path: str) -> None:
    request = sent(call)
    assert request.url.path == path and "Authorization" not in request.headers


def test_without_a_token_no_authorization_is_sent() -> None:
    assert "Authorization" not in sent(lambda c: c.get_state(SCOPE), token=None).headers


def test_a_token_function_is_asked_on_every_attempt() -> None:
    issued = iter(["first", "second"])
    service = Scripted(refusal(503, "store_unavailable"), NOT_FOUND)
    with service.sync_client(lambda: next(issued), backoff=0.0) as client, pytest.raises(NotFound):
        client.get_state(SCOPE)
    assert [r.headers["Authorization"] for r in service.requests] == [
        "Bearer first",
        "Bearer second",
    ]


def test_the_token_exchange_sends_its_credential_in_the_form_only() -> None:
    request = sent(lambda c: c.exchange_token("service-token", SCOPE))
    assert (request.method, request.url.path) == ("POST", "/v1/token")
    assert "Authorization" not in request.headers  # the client's own token stays home
    assert request.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert parse_qs(request.content.decode(), strict_parsing=True) == {
        "grant_type": ["urn:ietf:params:oauth:grant-type:token-exchange"],
        "subject_token": ["service-token"],
        "subject_token_type": ["urn:ietf:params:oauth:token-type:jwt"],
        "resource": [SESSION_PATH],
    }


@pytest.mark.parametrize(
    ("call", "header", "value"),
    [
        (lambda c: c.put_state(SCOPE, template(), if_match=DIGEST), "If-Match", f'"{DIGEST}"'),
        (
            lambda c: c.put_state(SCOPE, template(), if_match=f'"{DIGEST}"'),
            "If-Match",
            f'"{DIGEST}"',
        ),
        (lambda c: c.put_state(SCOPE, template(), if_none_match=True), "If-None-Match", "*"),
    ],
)
def test_a_precondition_is_sent_as_its_header(call: Call, header: str, value: str) -> None:
    request = sent(call)
    assert request.headers[header] == value
    other = "If-None-Match" if header == "If-Match" else "If-Match"
    assert other not in request.headers


def test_an_unconditional_write_names_no_version() -> None:
    request = sent(lambda c: c.put_state(SCOPE, template()))
    assert "If-Match" not in request.headers and "If-None-Match" not in request.headers


def test_both_preconditions_at_once_are_refused_before_sending() -> None:
    service = Scripted(NOT_FOUND)
    with service.sync_client() as client, pytest.raises(ValueError, match="not both"):
        client.put_state(SCOPE, template(), if_match=DIGEST, if_none_match=True)
    assert service.requests == []


@pytest.mark.parametrize("bad", ["..", ".", "a/b", "", "x" * 129, "tenant a"])
def test_a_scope_id_that_is_no_scope_id_is_refused_before_sending(bad: str) -> None:
    service = Scripted(NOT_FOUND)
    scope = TenantScope.model_construct(tenant_id="tenant-a", workspace_id="ws-1", session_id=bad)
    with service.sync_client() as client:
        with pytest.raises(ValueError, match="not a scope id"):
            client.get_state(scope)
        with pytest.raises(ValueError, match="not a scope id"):
            client.list_approvals(bad, "ws-1")
    assert service.requests == []


def test_a_state_body_is_the_mapping_as_given_or_the_models_json_without_nulls() -> None:
    as_given = sent(lambda c: c.preview_state(SCOPE, template()))
    assert json.loads(as_given.content) == template()
    assert as_given.headers["Content-Type"] == "application/json"
    model = SessionStateInput.model_validate(template())
    from_model = json.loads(sent(lambda c: c.preview_state(SCOPE, model)).content)
    assert "state_id" not in from_model  # None members are left out
    assert from_model["runtime_profile"] == template()["runtime_profile"]
    assert from_model["memory_anchors"] == template()["memory_anchors"]


def test_a_body_that_is_not_strict_json_is_refused_before_sending() -> None:
    service = Scripted(NOT_FOUND)
    with service.sync_client() as client, pytest.raises(ValueError, match="JSON compliant"):
        client.preview_state(SCOPE, {"runtime_profile": {"context_window": float("nan")}})
    assert service.requests == []


def test_non_ascii_text_is_sent_as_utf8() -> None:
    service = Scripted(NOT_FOUND)
    with service.sync_client() as client, pytest.raises(NotFound):
        client.preview_state(SCOPE, {"note": "Grüße"})
    assert service.requests[0].content == '{"note": "Grüße"}'.encode()


def test_a_grant_sends_the_grant() -> None:
    service = Scripted(NOT_FOUND)
    grant = ApprovalGrantInput(ttl_seconds=600, reason="incident 7")
    with service.sync_client() as client, pytest.raises(NotFound):
        client.grant_approval("tenant-a", "ws-1", grant)
    assert json.loads(service.requests[0].content) == {"ttl_seconds": 600, "reason": "incident 7"}


@pytest.mark.parametrize(("max_inputs", "body"), [(None, {}), (4, {"max_inputs": 4})])
def test_a_replay_preview_sends_its_cap_only_when_given(
    max_inputs: int | None, body: dict[str, int]
) -> None:
    request = sent(lambda c: c.replay_preview(SCOPE, max_inputs))
    assert json.loads(request.content) == body


def test_decision_filters_are_sent_as_query_text() -> None:
    service = Scripted(NOT_FOUND)
    since = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    with service.sync_client() as client, pytest.raises(NotFound):
        client.list_decisions(
            limit=10, cursor="c-1", allow=False, since=since, until="2026-02-01", action="write"
        )
    assert dict(service.requests[0].url.params) == {
        "limit": "10",
        "cursor": "c-1",
        "allow": "false",
        "since": "2026-01-02T03:04:05+00:00",
        "until": "2026-02-01",
        "action": "write",
    }


@pytest.mark.parametrize(
    ("call", "query"),
    [
        (lambda c: c.list_decisions(), {}),
        (lambda c: c.verify_decisions(), {}),
        (lambda c: c.verify_decisions(full=True), {"full": "true"}),
        (lambda c: c.policy_revisions(), {}),
        (lambda c: c.policy_revisions("tenant-b"), {"tenant_id": "tenant-b"}),
        (
            lambda c: c.export_decisions(shadow="disagree", allow=True),
            {"shadow": "disagree", "allow": "true"},
        ),
    ],
)
def test_optional_query_parameters_are_sent_only_when_given(
    call: Call, query: dict[str, str]
) -> None:
    assert dict(sent(call).url.params) == query


def test_a_base_url_with_a_trailing_slash_is_the_same_service() -> None:
    service = Scripted(NOT_FOUND)
    client = SessionStateClient(URL + "/", "t", transport=httpx.MockTransport(service))
    with client, pytest.raises(NotFound):
        client.healthz()
    assert str(service.requests[0].url) == URL + "/healthz"


def test_the_client_never_shows_its_token() -> None:
    with Scripted(NOT_FOUND).sync_client("secret-token-value") as client:
        assert repr(client) == f"SessionStateClient({URL!r})"
        assert "secret-token-value" not in repr(client.with_token("other"))


def test_with_token_changes_only_the_token_and_shares_the_connections() -> None:
    service = Scripted(NOT_FOUND)
    client = service.sync_client("model-token")
    operator = client.with_token("operator-token")
    for caller in (operator, client):
        with pytest.raises(NotFound):
            caller.list_approvals("tenant-a", "ws-1")
    operator.close()  # closes nothing: the connections are the parent's
    with pytest.raises(NotFound):
        client.healthz()
    assert [r.headers.get("Authorization") for r in service.requests] == [
        "Bearer operator-token",
        "Bearer model-token",
        None,
    ]
    client.close()
    with pytest.raises(RuntimeError):
        operator.healthz()  # closing the parent closed both
