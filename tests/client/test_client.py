"""The Python client against the live service: every endpoint, every error, retries, sessions."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sessionstate_client import (
    AsyncModelServiceSession,
    AsyncSessionStateClient,
    AuthenticationFailed,
    CorruptState,
    DecisionLogUnavailable,
    DigestKey,
    InvalidRequest,
    ModelServiceSession,
    NotFound,
    PolicyDenied,
    PolicyEngineUnavailable,
    PreconditionFailed,
    RateLimited,
    ServiceUnavailable,
    SessionStateClient,
    SessionStateError,
    SessionStateInput,
    StoreOutcomeUnknown,
    StoreUnavailable,
)
from sessionstate_client.models import SessionStateResponse
from sessionstate_client.retries import RetryPolicy, parse_retry_after

from service.auth.tokens import mint_token
from service.policy.sidecar import OpaSidecar, send_signal
from store.key_codec import LaneKey, TenantResourceLane
from tests.support.factories import scope, state_input
from tests.support.live import JWT_SECRET, LiveService, live_service, service_settings
from tests.support.processes import pause

CANARY = "CLIENT-CANARY-5f0c"
SCOPE = scope()


def model_client(service: LiveService, **options: Any) -> SessionStateClient:
    return SessionStateClient(service.url, service.token(), **options)


def auditor(service: LiveService) -> SessionStateClient:
    token = service.token("auditor", sub="au", tenant="tenant-a", workspace=None, session=None)
    return SessionStateClient(service.url, token)


def operator(service: LiveService) -> SessionStateClient:
    return SessionStateClient(service.url, service.operator())


def template() -> SessionStateInput:
    return SessionStateInput.model_validate(state_input(turns=[]))


def assert_clean(error: Exception, *secrets: str) -> None:
    for secret in (CANARY, *secrets):
        assert secret not in str(error)
        assert secret not in repr(error)


# --- session state -------------------------------------------------------------------------


def test_state_calls_return_the_wire_models(service: LiveService) -> None:
    service.approve()
    with model_client(service) as client:
        previewed = client.preview_state(SCOPE, SessionStateInput.model_validate(state_input()))
        assert isinstance(previewed, SessionStateResponse)
        assert previewed.write_report.applied is False
        assert previewed.decision.action == "preview"
        created = client.put_state(SCOPE, state_input(), if_none_match=True)
        assert created.write_report.applied is True
        assert created.record == previewed.record  # same input, same sanitized record
        read = client.get_state(SCOPE)
        assert read.read_report.record == created.record
        assert read.decision.action == "read"
        replaced = client.put_state(
            SCOPE, state_input(source_trace_ids=[]), if_match=created.record.state_digest
        )
        assert replaced.record.state_digest != created.record.state_digest
        replay = client.replay_preview(SCOPE, max_inputs=1)
        assert replay.preview.allowed is True
        assert len(replay.preview.retrieval_inputs) == 1
        assert replay.decision.action == "replay"
        unconditional = client.put_state(SCOPE, state_input())
        assert unconditional.record.state_digest == created.record.state_digest


def test_a_stale_or_create_only_write_is_precondition_failed(service: LiveService) -> None:
    service.approve()
    with model_client(service) as client:
        first = client.put_state(SCOPE, state_input())
        client.put_state(SCOPE, state_input(source_trace_ids=[]))
        with pytest.raises(PreconditionFailed) as stale:
            client.put_state(SCOPE, state_input(), if_match=first.record.state_digest)
        assert stale.value.status == 412
        assert stale.value.decision is not None and stale.value.decision.allow is True
        assert stale.value.write_report is not None
        assert stale.value.write_report.blocked_reasons == ["precondition_failed"]
        with pytest.raises(PreconditionFailed):
            client.put_state(SCOPE, state_input(), if_none_match=True)
        with pytest.raises(ValueError, match="not both"):
            client.put_state(SCOPE, state_input(), if_match="x", if_none_match=True)


def test_a_denied_write_is_policy_denied_with_its_decision(default_service: LiveService) -> None:
    body = state_input(turns=[{"turn_id": "t1", "role": "user", "payload": CANARY}])
    with model_client(default_service) as client, pytest.raises(PolicyDenied) as denied:
        client.put_state(SCOPE, body)
    error = denied.value
    assert error.status == 403
    assert error.reason == "session_state_durable_writes_disabled"
    assert error.decision.allow is False
    assert error.decision.action == "write"
    assert error.write_report is not None and error.write_report.applied is False
    assert "session_state_operator_approval_missing" in error.reasons
    assert "session_state_durable_writes_disabled" in str(error)
    assert_clean(error, default_service.token())


def test_access_refusals_are_policy_denied(service: LiveService) -> None:
    other_session = SessionStateClient(service.url, service.token(session="chat-2"))
    with other_session, pytest.raises(PolicyDenied) as denied:
        other_session.get_state(SCOPE)
    assert denied.value.reason == "cross_session_scope_rejected"
    with operator(service) as client, pytest.raises(PolicyDenied) as role:
        client.preview_state(SCOPE, state_input())
    assert role.value.reason == "role_not_permitted"


def test_missing_things_are_not_found(service: LiveService) -> None:
    with model_client(service) as client:
        with pytest.raises(NotFound) as state:
            client.get_state(SCOPE)
        assert state.value.reason == "session_state_not_found"
        assert state.value.decision is not None and state.value.decision.allow is True
        with pytest.raises(NotFound):
            client.replay_preview(SCOPE)
    with operator(service) as client, pytest.raises(NotFound) as approval:
        client.revoke_approval("tenant-a", "ws-1", "appr_" + "0" * 24)
    assert approval.value.reason == "approval_not_found"
    with auditor(service) as client, pytest.raises(NotFound) as decision:
        client.get_decision("no-such-decision")
    assert decision.value.reason == "decision_not_found"


def test_an_invalid_body_is_invalid_request_with_paths_and_rules_only(
    service: LiveService,
) -> None:
    body = state_input(turns=[{"turn_id": "t1", "role": "user", "payload": CANARY}])
    body["runtime_profile"] = {**body["runtime_profile"], "context_window": "8192"}
    with model_client(service) as client, pytest.raises(InvalidRequest) as invalid:
        client.preview_state(SCOPE, body)
    error = invalid.value
    assert (error.status, error.reason) == (422, "validation_failed")
    assert [(e.loc, e.rule) for e in error.errors] == [
        (["runtime_profile", "context_window"], "int_type")
    ]
    assert "runtime_profile.context_window: int_type" in str(error)
    assert_clean(error, "8192")


def test_malformed_requests_are_invalid_request_or_refused_locally(service: LiveService) -> None:
    with model_client(service) as client:
        with pytest.raises(InvalidRequest) as precondition:
            client.put_state(SCOPE, state_input(), if_match="not-a-digest")
        assert (precondition.value.status, precondition.value.reason) == (
            400,
            "invalid_precondition",
        )
        with pytest.raises(InvalidRequest) as too_large:
            client.preview_state(SCOPE, state_input(source_trace_ids=["x" * (1024 * 1024)]))
        assert too_large.value.status == 413
        with pytest.raises(ValueError, match="not JSON compliant"):
            client.preview_state(SCOPE, {"runtime_profile": {"context_window": float("nan")}})
        with pytest.raises(ValueError, match="not a scope id"):
            client.list_approvals("..", "ws-1")


@pytest.mark.parametrize(
    ("token", "reason"),
    [(None, "token_missing"), ("not-a-jwt", "token_invalid"), ("expired", "token_expired")],
)
def test_authentication_failures(service: LiveService, token: str | None, reason: str) -> None:
    if token == "expired":
        token = _expired()
    client = SessionStateClient(service.url, token)
    with client, pytest.raises(AuthenticationFailed) as failed:
        client.get_state(SCOPE)
    assert (failed.value.status, failed.value.reason) == (401, reason)
    assert failed.value.decision is None
    if token is not None:
        assert_clean(failed.value, token)


def _expired() -> str:
    issued = int((datetime.now(UTC) - timedelta(hours=1)).timestamp())
    return mint_token(
        JWT_SECRET.encode(),
        sub="svc-1",
        roles=["model-service"],
        tenant="tenant-a",
        workspace="ws-1",
        session="chat-1",
        ttl_seconds=60,
        now=issued,
    )


def test_a_token_function_is_asked_on_every_call(service: LiveService) -> None:
    asked: list[int] = []

    def token() -> str:
        asked.append(1)
        return service.token()

    with SessionStateClient(service.url, token) as client:
        for _ in range(2):
            with pytest.raises(NotFound):
                client.get_state(SCOPE)
    assert len(asked) == 2
    assert service.token() not in repr(client)


# --- approvals, decisions, operations -------------------------------------------------------


def test_approvals_grant_list_and_revoke(service: LiveService) -> None:
    with operator(service) as client:
        session_wide = client.grant_approval(
            "tenant-a", "ws-1", {"session_id": "chat-1", "ttl_seconds": 60, "reason": "tests"}
        )
        assert session_wide.approval.session_id == "chat-1"
        assert session_wide.decision.action == "approval.grant"
        listed = client.list_approvals("tenant-a", "ws-1")
        assert [a.approval_id for a in listed.approvals] == [session_wide.approval.approval_id]
        decision_id = client.revoke_approval("tenant-a", "ws-1", session_wide.approval.approval_id)
        assert decision_id
        assert client.list_approvals("tenant-a", "ws-1").approvals == []
        with pytest.raises(InvalidRequest) as invalid:
            client.grant_approval("tenant-a", "ws-1", {"ttl_seconds": 0, "reason": "x"})
        assert invalid.value.errors[0].loc == ["ttl_seconds"]
    other_tenant = SessionStateClient(service.url, service.operator(tenant="tenant-b"))
    with other_tenant, pytest.raises(PolicyDenied) as denied:
        other_tenant.list_approvals("tenant-a", "ws-1")
    assert denied.value.reason == "cross_tenant_scope_rejected"


def test_decision_log_list_pages_entry_verify_and_export(service: LiveService) -> None:
    service.approve()
    with model_client(service) as client:
        client.put_state(SCOPE, state_input())
        client.get_state(SCOPE)
        client.replay_preview(SCOPE)
    with auditor(service) as client:
        writes = client.list_decisions(action="write", allow=True)
        assert [entry.decision.action for entry in writes.decisions] == ["write"]
        assert writes.next_cursor is None
        first = client.list_decisions(limit=1)
        assert len(first.decisions) == 1 and first.next_cursor is not None
        everything = list(client.iter_decisions(page_size=1))
        assert [e.seq for e in everything] == sorted(e.seq for e in everything)
        assert len(everything) >= 4  # grant, write, read, replay
        since = datetime.now(UTC) + timedelta(minutes=1)
        assert client.list_decisions(since=since).decisions == []
        one = client.get_decision(writes.decisions[0].decision.decision_id)
        assert one.entry == writes.decisions[0]
        verified = client.verify_decisions()
        assert verified.ok is True and verified.entries >= len(everything)
        exported = list(client.export_decisions(action="write"))
        assert [event["decision_id"] for event in exported] == [
            writes.decisions[0].decision.decision_id
        ]
        with pytest.raises(InvalidRequest):
            client.list_decisions(cursor="!")


def test_operations_endpoints(service: LiveService) -> None:
    with SessionStateClient(service.url, None) as client:
        assert client.healthz().status == "ok"
        ready = client.readyz()
        assert ready.ready is True and ready.policy_revision is not None
        assert "sessionstate_http_requests_total" in client.metrics()
        assert client.openapi()["openapi"] == "3.1.0"


# --- retries -------------------------------------------------------------------------------


def read_outcomes(service: LiveService) -> list[int]:
    with auditor(service) as client:
        return [e.outcome.status for e in client.iter_decisions(action="read")]


def test_an_unavailable_policy_engine_is_retried_then_raised(
    fragile: tuple[LiveService, OpaSidecar],
) -> None:
    service, sidecar = fragile
    client = model_client(service, retries=2, backoff=0.01)
    pause(sidecar.pid)
    try:
        with client, pytest.raises(PolicyEngineUnavailable) as unavailable:
            client.get_state(SCOPE)
    finally:
        send_signal(sidecar, signal.SIGCONT)
    assert unavailable.value.attempts == 3
    assert unavailable.value.status == 503
    assert unavailable.value.decision is not None
    assert unavailable.value.decision.reasons == ["policy_engine_unavailable"]
    assert read_outcomes(service) == [503, 503, 503]


def test_a_503_that_recovers_within_the_retry_budget_succeeds(
    fragile: tuple[LiveService, OpaSidecar],
) -> None:
    service, sidecar = fragile
    service.approve()
    with model_client(service, retries=5, backoff=0.05) as client:
        written = client.put_state(SCOPE, state_input())
        pause(sidecar.pid)
        resume = threading.Timer(0.5, send_signal, (sidecar, signal.SIGCONT))
        resume.start()
        try:
            read = client.get_state(SCOPE)
        finally:
            resume.join()
            send_signal(sidecar, signal.SIGCONT)
    assert read.read_report.record == written.record
    outcomes = read_outcomes(service)
    assert outcomes[0] == 503 and outcomes[-1] == 200


def test_a_refused_connection_is_retried_then_service_unavailable() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    client = SessionStateClient(url, "t", retries=2, backoff=0.01)
    with client, pytest.raises(ServiceUnavailable) as unavailable:
        client.get_state(SCOPE)
    assert (unavailable.value.status, unavailable.value.reason) == (None, "connection_failed")
    assert unavailable.value.attempts == 3


class FlakyTransport(httpx.BaseTransport):
    """Fails the first `failures` requests as a dropped connection would; then answers."""

    def __init__(self, failures: int, answer: Callable[[httpx.Request], httpx.Response]) -> None:
        self.failures = failures
        self.answer = answer
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if len(self.requests) <= self.failures:
            raise httpx.ReadError("connection reset", request=request)
        return self.answer(request)


def _problem(status: int, reason: str) -> dict[str, Any]:
    return {"type": "t", "title": "t", "status": status, "detail": "d", "reason": reason}


def _not_found(request: httpx.Request) -> httpx.Response:
    return httpx.Response(404, json=_problem(404, "not_found"))


@pytest.mark.parametrize(
    ("call", "retried"),
    [
        pytest.param(lambda c: c.get_state(SCOPE), True, id="get"),
        pytest.param(lambda c: c.preview_state(SCOPE, state_input()), True, id="preview"),
        pytest.param(lambda c: c.replay_preview(SCOPE), True, id="replay-preview"),
        pytest.param(
            lambda c: c.put_state(SCOPE, state_input(), if_match="sha256:" + "0" * 64),
            True,
            id="put-if-match",
        ),
        pytest.param(
            lambda c: c.put_state(SCOPE, state_input(), if_none_match=True),
            True,
            id="put-if-none-match",
        ),
        pytest.param(lambda c: c.revoke_approval("t", "w", "appr_" + "0" * 24), True, id="revoke"),
        pytest.param(lambda c: c.put_state(SCOPE, state_input()), False, id="put-unconditional"),
        pytest.param(
            lambda c: c.grant_approval("t", "w", {"ttl_seconds": 1, "reason": "r"}),
            False,
            id="grant",
        ),
    ],
)
def test_connection_failures_are_retried_only_where_repeating_is_safe(
    call: Callable[[SessionStateClient], object], retried: bool
) -> None:
    transport = FlakyTransport(1, _not_found)
    client = SessionStateClient("http://sessionstate.test", "t", backoff=0, transport=transport)
    with client, pytest.raises(NotFound if retried else ServiceUnavailable) as raised:
        call(client)
    assert len(transport.requests) == (2 if retried else 1)
    assert raised.value.attempts == len(transport.requests)
    ids = {request.headers["X-Request-Id"] for request in transport.requests}
    assert len(ids) == 1  # one call, one request id, however many attempts


class UnavailableOnce(httpx.BaseTransport):
    """Answers the first request 503 with `reason` (and `headers`), every later one 404."""

    def __init__(self, reason: str, headers: dict[str, str] | None = None) -> None:
        self.reason = reason
        self.headers = {"Retry-After": "0", **(headers or {})}
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if len(self.requests) == 1:
            problem = _problem(503, self.reason)
            return httpx.Response(503, json=problem, headers=self.headers)
        return _not_found(request)


SAFE_CALLS = [
    pytest.param(lambda c: c.get_state(SCOPE), id="get"),
    pytest.param(lambda c: c.preview_state(SCOPE, state_input()), id="preview"),
    pytest.param(lambda c: c.replay_preview(SCOPE), id="replay-preview"),
    pytest.param(
        lambda c: c.put_state(SCOPE, state_input(), if_match="sha256:" + "0" * 64),
        id="put-if-match",
    ),
    pytest.param(lambda c: c.put_state(SCOPE, state_input(), if_none_match=True), id="put-if-none"),
    pytest.param(lambda c: c.revoke_approval("t", "w", "appr_" + "0" * 24), id="revoke"),
]
UNSAFE_CALLS = [
    pytest.param(lambda c: c.put_state(SCOPE, state_input()), id="put-unconditional"),
    pytest.param(
        lambda c: c.grant_approval("t", "w", {"ttl_seconds": 1, "reason": "r"}), id="grant"
    ),
]


@pytest.mark.parametrize("reason", ["decision_log_unavailable", "store_outcome_unknown"])
@pytest.mark.parametrize("call", SAFE_CALLS)
def test_a_503_is_retried_for_a_call_safe_to_repeat(
    call: Callable[[SessionStateClient], object], reason: str
) -> None:
    transport = UnavailableOnce(reason)
    client = SessionStateClient("http://sessionstate.test", "t", backoff=0, transport=transport)
    with client, pytest.raises(NotFound) as second_answer:
        call(client)
    assert second_answer.value.attempts == len(transport.requests) == 2


@pytest.mark.parametrize(
    ("reason", "raised"),
    [
        ("decision_log_unavailable", DecisionLogUnavailable),
        ("store_unavailable", StoreUnavailable),
        ("store_outcome_unknown", StoreOutcomeUnknown),
    ],
)
@pytest.mark.parametrize("call", UNSAFE_CALLS)
def test_a_503_is_never_retried_for_a_grant_or_an_unconditional_put(
    call: Callable[[SessionStateClient], object], reason: str, raised: type[Exception]
) -> None:
    transport = UnavailableOnce(reason)
    client = SessionStateClient("http://sessionstate.test", "t", backoff=0, transport=transport)
    with client, pytest.raises(raised) as unavailable:
        call(client)
    assert len(transport.requests) == 1
    assert isinstance(unavailable.value, SessionStateError) and unavailable.value.attempts == 1


def test_an_unknown_outcome_names_its_decision() -> None:
    named = {"Retry-After": "5", "Sessionstate-Decision-Id": "d-1"}
    transport = UnavailableOnce("store_outcome_unknown", named)
    client = SessionStateClient("http://sessionstate.test", "t", transport=transport)
    with client, pytest.raises(StoreOutcomeUnknown) as raised:
        client.grant_approval("t", "w", {"ttl_seconds": 1, "reason": "r"})
    assert raised.value.decision_id == "d-1" and "decision d-1" in str(raised.value)


def test_a_retry_after_beyond_the_longest_wait_is_not_waited_for() -> None:
    def busy(request: httpx.Request) -> httpx.Response:
        problem = _problem(503, "policy_engine_unavailable")
        return httpx.Response(503, json=problem, headers={"Retry-After": "120"})

    transport = FlakyTransport(0, busy)
    client = SessionStateClient("http://sessionstate.test", "t", transport=transport)
    with client, pytest.raises(PolicyEngineUnavailable):
        client.get_state(SCOPE)
    assert len(transport.requests) == 1


def test_a_429_is_retried_after_its_retry_after_even_for_a_grant() -> None:
    def limited_once(request: httpx.Request) -> httpx.Response:
        if len(transport.requests) == 1:
            return httpx.Response(
                429, json=_problem(429, "rate_limited"), headers={"Retry-After": "2"}
            )
        return _not_found(request)

    transport = FlakyTransport(0, limited_once)
    client = SessionStateClient("http://sessionstate.test", "t", backoff=0, transport=transport)
    waits: list[float] = []
    client._sleep = waits.append
    with client, pytest.raises(NotFound) as second_answer:
        client.grant_approval("t", "w", {"ttl_seconds": 1, "reason": "r"})
    assert second_answer.value.attempts == len(transport.requests) == 2
    assert waits == [2.0]  # nothing was done, so even a grant may be sent again


def test_a_429_with_a_long_retry_after_is_rate_limited_at_once() -> None:
    def limited(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            429, json=_problem(429, "rate_limited"), headers={"Retry-After": "60"}
        )

    transport = FlakyTransport(0, limited)
    client = SessionStateClient("http://sessionstate.test", "t", transport=transport)
    with client, pytest.raises(RateLimited) as raised:
        client.get_state(SCOPE)
    assert len(transport.requests) == 1
    assert (raised.value.status, raised.value.reason) == (429, "rate_limited")
    assert raised.value.retry_after == 60.0
    assert "retry after 60 s" in str(raised.value)


def test_an_actor_over_its_budget_gets_rate_limited(sidecar: OpaSidecar, tmp_path: Path) -> None:
    settings = service_settings(tmp_path / "var", denial_rate_limit="1/hour")
    with live_service(sidecar, settings) as live:
        other = scope(tenant="tenant-b")
        with model_client(live) as client:
            with pytest.raises(PolicyDenied):
                client.get_state(other)
            with pytest.raises(RateLimited) as limited:
                client.get_state(SCOPE)  # its own session too: the actor is over its budget
    assert limited.value.attempts == 1  # an hour is past the longest wait
    assert limited.value.retry_after is not None and limited.value.retry_after > 30
    assert limited.value.decision is None  # refused before any policy call


def test_retry_waits_grow_and_honour_retry_after() -> None:
    policy = RetryPolicy(retries=3, backoff=0.2)
    assert 0.1 <= (policy.wait(1) or 0) <= 0.2
    assert 0.4 <= (policy.wait(3) or 0) <= 0.8
    assert policy.wait(4) is None
    assert policy.wait(1, retry_after=1.0) == 1.0
    assert policy.wait(1, retry_after=31.0) is None
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("Thu, 01 Jan 2026 00:00:05 GMT", now) == 5.0
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("soon") is None


def test_an_answer_outside_the_contract_is_unexpected_and_not_echoed() -> None:
    def odd(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"record": CANARY})

    client = SessionStateClient("http://sessionstate.test", "t", transport=FlakyTransport(0, odd))
    with client, pytest.raises(SessionStateError) as unexpected:
        client.get_state(SCOPE)
    assert unexpected.value.reason == "response_not_in_contract"
    assert_clean(unexpected.value)
    assert unexpected.value.__cause__ is None
    assert unexpected.value.__suppress_context__  # pydantic's message would quote the body


# --- the five steps: ModelServiceSession ----------------------------------------------------


def test_the_five_steps_write_turn_after_turn(service: LiveService) -> None:
    service.approve()
    with model_client(service) as client:
        session = ModelServiceSession(client, SCOPE, template())
        assert session.load().turns == []
        digests = []
        for number in range(2):
            preview = session.replay(max_inputs=8)
            assert preview.allowed is True
            request = session.runtime_request(f"{CANARY} {number}", preview)
            assert request.prompt == f"{CANARY} {number}"
            assert CANARY not in repr(request)
            assert request.routing_inputs[0].kind == "runtime_profile"
            assert request.history_turns == 2 * number
            user = session.turn("user", request.prompt)
            result = session.commit_turns([user, session.turn("assistant", "echo")])
            assert result.applied is True and result.attempts == 1
            assert session.version == result.state_digest
            digests.append(result.state_digest)
        stored = client.get_state(SCOPE).read_report.record
    assert stored is not None and len(stored.turns) == 4
    assert stored.state_digest == digests[-1] != digests[0]
    assert all(turn.payload is None for turn in session.state.turns)


def test_without_durable_writes_the_session_falls_back_to_preview_only(
    default_service: LiveService,
) -> None:
    with model_client(default_service) as client:
        session = ModelServiceSession(client, SCOPE, template())
        session.load()
        for turns_held in (2, 4):
            assert session.replay().allowed is True
            result = session.commit_turns(
                [session.turn("user", CANARY), session.turn("assistant", "ok")]
            )
            assert result.applied is False
            assert {
                "session_state_durable_writes_disabled",
                "session_state_operator_approval_missing",
            } <= set(result.blocked_reasons)
            assert result.decision.allow is False
            assert len(result.record.turns) == turns_held
            assert [turn.payload for turn in session.state.turns] == [None] * turns_held
        with pytest.raises(NotFound):
            client.get_state(SCOPE)


def test_turns_held_in_preview_only_are_written_once_allowed(service: LiveService) -> None:
    with model_client(service) as client:
        session = ModelServiceSession(client, SCOPE, template())
        first = session.commit_turns([session.turn("user", "a"), session.turn("assistant", "b")])
        assert first.applied is False
        assert first.blocked_reasons == ["session_state_operator_approval_missing"]
        service.approve()
        second = session.commit_turns([session.turn("user", "c")])
        assert second.applied is True
        assert [t.turn_id for t in second.record.turns] == [
            t.turn_id for t in first.record.turns
        ] + [second.record.turns[-1].turn_id]


def test_a_conflicting_writer_is_re_read_and_merged(service: LiveService) -> None:
    service.approve()
    with model_client(service) as one, model_client(service) as two:
        first = ModelServiceSession(one, SCOPE, template())
        second = ModelServiceSession(two, SCOPE, template())
        first.load()
        second.load()
        mine = first.commit_turns([first.turn("user", "from one")])
        theirs = second.commit_turns([second.turn("user", "from two")])
    assert (mine.attempts, theirs.attempts) == (1, 2)
    assert [t.turn_id for t in theirs.record.turns] == [
        mine.record.turns[0].turn_id,
        theirs.record.turns[1].turn_id,
    ]


def test_concurrent_sessions_lose_no_turn(service: LiveService) -> None:
    service.approve()
    writers = 4
    loaded = threading.Barrier(writers)
    results: list[tuple[list[str], list[int]]] = []
    errors: list[BaseException] = []

    def chat(name: str) -> None:
        try:
            with model_client(service) as client:
                session = ModelServiceSession(client, SCOPE, template(), max_attempts=20)
                session.load()
                loaded.wait()  # all hold "nothing stored": only one If-None-Match can win
                committed, attempts = [], []
                for number in range(3):
                    turn = session.turn("user", f"{name} {number}")
                    result = session.commit_turns([turn])
                    assert result.applied is True
                    committed.append(turn.turn_id)
                    attempts.append(result.attempts)
                results.append((committed, attempts))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=chat, args=(f"writer-{n}",)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sum(attempts[0] for _, attempts in results) >= writers + writers - 1
    with model_client(service) as client:
        stored = client.get_state(SCOPE).read_report.record
    assert stored is not None
    stored_ids = [turn.turn_id for turn in stored.turns]
    assert sorted(stored_ids) == sorted(turn for mine, _ in results for turn in mine)
    for mine, _ in results:  # each writer's turns in its own order
        assert [turn for turn in stored_ids if turn in mine] == mine


def test_conflicts_past_the_attempt_budget_raise(service: LiveService) -> None:
    service.approve()
    with model_client(service) as client:
        stale = ModelServiceSession(client, SCOPE, template(), max_attempts=1)
        stale.load()
        ModelServiceSession(client, SCOPE, template()).commit_turns([])
        with pytest.raises(PreconditionFailed):
            stale.commit_turns([stale.turn("user", "late")])


def test_a_digest_key_keeps_turn_text_in_the_model_service(service: LiveService) -> None:
    service.approve()
    key = DigestKey(b"model-service-own-key-0123456789", key_id="svc")
    with model_client(service) as client:
        session = ModelServiceSession(client, SCOPE, template(), digest_key=key)
        turn = session.turn("user", CANARY)
        assert turn.payload is None
        result = session.commit_turns([turn])
    assert result.record.turns[0].payload_digest == key.digest_text(CANARY)
    assert result.record.turns[0].token_estimate == 5


def test_a_corrupt_record_is_raised_or_replaced_on_request(service: LiveService) -> None:
    service.approve()
    stored = b'{"schema":"sessionstate.record.v1","note":"' + CANARY.encode() + b'"}'
    key = LaneKey(TenantResourceLane.SESSION_STATE, "tenant-a", "ws-1", "chat-1")
    service.context.lanes.put(key, stored)
    with model_client(service) as client:
        with pytest.raises(CorruptState) as corrupt:
            ModelServiceSession(client, SCOPE, template()).load()
        assert corrupt.value.reason == "session_state_schema_mismatch"
        assert_clean(corrupt.value)
        session = ModelServiceSession(client, SCOPE, template(), replace_corrupt=True)
        session.load()
        assert session.version == corrupt.value.read_report.error_digest
        assert session.replay().allowed is True  # planned from the state held
        result = session.commit_turns([session.turn("user", "fresh start")])
    assert result.applied is True and len(result.record.turns) == 1


def test_a_record_gone_under_a_replay_starts_over_as_a_load_does(service: LiveService) -> None:
    service.approve()
    key = LaneKey(TenantResourceLane.SESSION_STATE, "tenant-a", "ws-1", "chat-1")
    with model_client(service) as client:
        session = ModelServiceSession(client, SCOPE, template())
        session.commit_turns([session.turn("user", "before the reset")])
        service.context.lanes.delete(key)  # the store is reset under the session
        assert session.replay().allowed is True  # planned from the template: nothing stored
        assert session.version is None
        result = session.commit_turns([session.turn("user", "after")])
    assert result.applied is True and result.attempts == 1  # If-None-Match: no 412 first
    assert len(result.record.turns) == 1


def test_an_access_refusal_is_raised_not_previewed(service: LiveService) -> None:
    with SessionStateClient(service.url, service.token(session="chat-2")) as client:
        session = ModelServiceSession(client, SCOPE, template())
        with pytest.raises(PolicyDenied) as denied:
            session.commit_turns([session.turn("user", CANARY)])
    assert denied.value.reason == "session_state_cross_session_write_rejected"
    assert denied.value.decision.action == "preview"


class SpyTransport(httpx.HTTPTransport):
    """The real transport, keeping every request body it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[bytes] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request.read())
        return super().handle_request(request)


def test_a_turn_text_is_sent_once_then_only_its_digest(default_service: LiveService) -> None:
    spy = SpyTransport()
    with SessionStateClient(default_service.url, default_service.token(), transport=spy) as client:
        session = ModelServiceSession(client, SCOPE, template())
        session.commit_turns([session.turn("user", CANARY)])
        assert sum(CANARY.encode() in body for body in spy.sent) == 2  # the write, its preview
        spy.sent.clear()
        session.commit_turns([session.turn("user", "second")])
        session.replay()
    assert len(spy.sent) == 3
    assert all(CANARY.encode() not in body for body in spy.sent)
    held = json.loads(spy.sent[0])["turns"][0]
    assert held["payload_digest"].startswith("hmac-sha256:") and "payload" not in held


# --- the asyncio flavour: AsyncSessionStateClient and AsyncModelServiceSession ---------------


def async_client(service: LiveService, **options: Any) -> AsyncSessionStateClient:
    return AsyncSessionStateClient(service.url, service.token(), **options)


def test_the_async_client_answers_and_refuses_as_the_sync_one(
    default_service: LiveService,
) -> None:
    body = state_input(turns=[{"turn_id": "t1", "role": "user", "payload": CANARY}])

    async def calls() -> tuple[Any, PolicyDenied, list[Any]]:
        async with async_client(default_service) as client:
            previewed = await client.preview_state(SCOPE, body)
            with pytest.raises(PolicyDenied) as denied:
                await client.put_state(SCOPE, body)
        async with AsyncSessionStateClient(default_service.url, None) as anonymous:
            ready = await anonymous.readyz()
        token = default_service.token("auditor", sub="au", workspace=None, session=None)

        async def fresh_token() -> str:  # an async token source is awaited on every attempt
            return token

        async with AsyncSessionStateClient(default_service.url, fresh_token) as auditor:
            entries = [entry async for entry in auditor.iter_decisions(page_size=1)]
            exported = [event async for event in auditor.export_decisions(action="write")]
            assert (await auditor.verify_decisions(full=True)).ok is True
            revisions = await auditor.policy_revisions()
            assert revisions.revisions and revisions.tenant_id == "tenant-a"
        assert ready.ready is True and len(exported) == 1
        return previewed, denied.value, entries

    previewed, denied, entries = asyncio.run(calls())
    assert isinstance(previewed, SessionStateResponse)
    assert previewed.decision.action == "preview"
    assert denied.reason == "session_state_durable_writes_disabled"
    assert denied.decision.allow is False and denied.decision.action == "write"
    assert_clean(denied, default_service.token())
    assert [entry.decision.action for entry in entries] == ["preview", "write"]


def test_the_async_session_writes_re_reads_on_412_and_merges(service: LiveService) -> None:
    service.approve()

    async def conversation() -> tuple[Any, Any, Any]:
        async with async_client(service) as one, async_client(service) as two:
            first = AsyncModelServiceSession(one, SCOPE, template())
            second = AsyncModelServiceSession(two, SCOPE, template())
            await first.load()
            await second.load()
            preview = await first.replay(max_inputs=8)
            request = first.runtime_request(CANARY, preview)
            assert request.routing_inputs[0].kind == "runtime_profile"
            assert CANARY not in repr(request)
            mine = await first.commit_turns([first.turn("user", "from one")])
            theirs = await second.commit_turns([second.turn("user", "from two")])
            return mine, theirs, (await one.get_state(SCOPE)).read_report.record

    mine, theirs, stored = asyncio.run(conversation())
    assert (mine.applied, theirs.applied) == (True, True)
    assert (mine.attempts, theirs.attempts) == (1, 2)
    assert stored is not None and stored.state_digest == theirs.state_digest
    assert [t.turn_id for t in stored.turns] == [
        mine.record.turns[0].turn_id,
        theirs.record.turns[1].turn_id,
    ]


def test_the_async_session_falls_back_to_preview_only_then_writes_once_allowed(
    service: LiveService,
) -> None:
    async def conversation() -> tuple[Any, Any]:
        async with async_client(service) as client:
            session = AsyncModelServiceSession(client, SCOPE, template())
            await session.load()
            assert (await session.replay()).allowed is True  # planned here: nothing stored
            first = await session.commit_turns([session.turn("user", CANARY)])
            service.approve()
            second = await session.commit_turns([session.turn("assistant", "ok")])
            return first, second

    first, second = asyncio.run(conversation())
    assert first.applied is False
    assert first.blocked_reasons == ["session_state_operator_approval_missing"]
    assert second.applied is True and len(second.record.turns) == 2
    assert second.record.turns[0].turn_id == first.record.turns[0].turn_id


def test_the_async_client_retries_a_429_after_its_retry_after() -> None:
    asked: list[httpx.Request] = []

    async def limited_once(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        if len(asked) == 1:
            return httpx.Response(
                429, json=_problem(429, "rate_limited"), headers={"Retry-After": "2"}
            )
        return _not_found(request)

    waits: list[float] = []

    async def wait(seconds: float) -> None:
        waits.append(seconds)

    async def call() -> NotFound:
        transport = httpx.MockTransport(limited_once)
        async with AsyncSessionStateClient(
            "http://sessionstate.test", "t", backoff=0, transport=transport
        ) as client:
            client._sleep = wait
            with pytest.raises(NotFound) as raised:
                await client.grant_approval("t", "w", {"ttl_seconds": 1, "reason": "r"})
            return raised.value

    error = asyncio.run(call())
    assert error.attempts == len(asked) == 2 and waits == [2.0]
    assert len({request.headers["X-Request-Id"] for request in asked}) == 1


def test_the_async_client_retries_a_503_only_where_repeating_is_safe() -> None:
    async def attempts(call: Callable[[AsyncSessionStateClient], Any]) -> int:
        transport = UnavailableOnce("store_outcome_unknown")
        mock = httpx.MockTransport(lambda request: transport.handle_request(request))
        async with AsyncSessionStateClient(
            "http://sessionstate.test", "t", backoff=0, transport=mock
        ) as client:
            with pytest.raises((NotFound, StoreOutcomeUnknown)):
                await call(client)
        return len(transport.requests)

    grant = asyncio.run(
        attempts(lambda c: c.grant_approval("t", "w", {"ttl_seconds": 1, "reason": "r"}))
    )
    put = asyncio.run(attempts(lambda c: c.put_state(SCOPE, state_input())))
    conditional = asyncio.run(
        attempts(lambda c: c.put_state(SCOPE, state_input(), if_none_match=True))
    )
    assert (grant, put, conditional) == (1, 1, 2)


def test_with_token_shares_the_connections_and_changes_only_the_token(
    service: LiveService,
) -> None:
    with model_client(service) as client:
        operator_client = client.with_token(service.operator())
        granted = operator_client.grant_approval(
            "tenant-a", "ws-1", {"ttl_seconds": 60, "reason": "x"}
        )
        operator_client.close()  # closes nothing: the connections are client's
        assert granted.decision.allow is True
        with pytest.raises(NotFound):
            client.get_state(SCOPE)  # still the model service's token, still open
        with pytest.raises(PolicyDenied):
            operator_client.get_state(SCOPE)  # an operator may not read state
