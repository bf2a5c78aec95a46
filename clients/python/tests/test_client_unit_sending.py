"""Which failures the client sends again, for which calls, and how it counts the attempts.

A 429 is retried on any call; a 503, a dropped connection or a timeout only
on a call that is safe to repeat. Every attempt of one call carries the same
request id, the error raised counts the attempts made, and the waits between
them (recorded by the fake service instead of slept) honour `Retry-After`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from conftest import SCOPE, Scripted, refusal, template
from sessionstate_client import (
    NotFound,
    PolicyEngineUnavailable,
    RateLimited,
    ServiceUnavailable,
    SessionStateClient,
    StoreOutcomeUnknown,
)

APPROVAL = "appr_" + "0" * 24
DIGEST = "sha256:" + "0" * 64
GRANT = {"ttl_seconds": 60, "reason": "unit"}

Call = Callable[[SessionStateClient], Any]
SAFE: dict[str, Call] = {
    "get_state": lambda c: c.get_state(SCOPE),
    "preview_state": lambda c: c.preview_state(SCOPE, template()),
    "put_state if-match": lambda c: c.put_state(SCOPE, template(), if_match=DIGEST),
    "put_state if-none-match": lambda c: c.put_state(SCOPE, template(), if_none_match=True),
    "replay_preview": lambda c: c.replay_preview(SCOPE),
    "exchange_token": lambda c: c.exchange_token("service-token", SCOPE),
    "list_approvals": lambda c: c.list_approvals("tenant-a", "ws-1"),
    "revoke_approval": lambda c: c.revoke_approval("tenant-a", "ws-1", APPROVAL),
    "list_decisions": lambda c: c.list_decisions(limit=5),
    "get_decision": lambda c: c.get_decision("dec-1"),
    "verify_decisions": lambda c: c.verify_decisions(full=True),
    "policy_revisions": lambda c: c.policy_revisions(),
    "export_decisions": lambda c: list(c.export_decisions()),
    "healthz": lambda c: c.healthz(),
    "metrics": lambda c: c.metrics(),
    "openapi": lambda c: c.openapi(),
}
UNSAFE: dict[str, Call] = {
    "grant_approval": lambda c: c.grant_approval("tenant-a", "ws-1", GRANT),
    "put_state unconditional": lambda c: c.put_state(SCOPE, template()),
}
EVERY = {**SAFE, **UNSAFE}
NOT_FOUND = refusal(404, "not_found")


def attempts_until_raised(service: Scripted, call: Call, **options: Any) -> Exception:
    with service.sync_client(**options) as client, pytest.raises(Exception) as raised:
        call(client)
    return raised.value


@pytest.mark.parametrize("name", SAFE)
@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(refusal(503, "store_outcome_unknown"), id="503"),
        pytest.param(httpx.ConnectError("refused"), id="connect"),
        pytest.param(httpx.ReadError("reset"), id="read"),
        pytest.param(httpx.ReadTimeout("slow"), id="timeout"),
    ],
)
def test_a_call_safe_to_repeat_is_tried_again(name: str, failure: Any) -> None:
    service = Scripted(failure, NOT_FOUND)
    error = attempts_until_raised(service, SAFE[name])
    assert isinstance(error, NotFound) and error.attempts == 2
    assert len(service.requests) == 2


@pytest.mark.parametrize("name", UNSAFE)
@pytest.mark.parametrize(
    ("failure", "kind", "reason"),
    [
        pytest.param(
            refusal(503, "store_outcome_unknown"),
            StoreOutcomeUnknown,
            "store_outcome_unknown",
            id="503",
        ),
        pytest.param(httpx.ReadError("reset"), ServiceUnavailable, "connection_failed", id="read"),
        pytest.param(httpx.WriteTimeout("slow"), ServiceUnavailable, "timeout", id="timeout"),
    ],
)
def test_a_call_not_safe_to_repeat_is_sent_once(
    name: str, failure: Any, kind: type[Exception], reason: str
) -> None:
    service = Scripted(failure, NOT_FOUND)
    error = attempts_until_raised(service, UNSAFE[name])
    assert type(error) is kind
    assert (getattr(error, "reason", None), getattr(error, "attempts", None)) == (reason, 1)
    assert len(service.requests) == 1 and service.waits == []


@pytest.mark.parametrize("name", EVERY)
def test_a_429_is_tried_again_on_any_call_after_its_retry_after(name: str) -> None:
    service = Scripted(refusal(429, "rate_limited", {"Retry-After": "2"}), NOT_FOUND)
    error = attempts_until_raised(service, EVERY[name])
    assert isinstance(error, NotFound) and error.attempts == 2
    assert service.waits == [2.0]


@pytest.mark.parametrize("status", [400, 401, 404, 412, 422, 500, 502, 504])
def test_other_answers_are_never_tried_again(status: int) -> None:
    service = Scripted(refusal(status, "whatever"))
    attempts_until_raised(service, SAFE["get_state"])
    assert len(service.requests) == 1 and service.waits == []


def test_the_retry_budget_is_the_attempts_after_the_first() -> None:
    service = Scripted(refusal(503, "policy_engine_unavailable"))
    error = attempts_until_raised(service, SAFE["get_state"], retries=3, backoff=0.0)
    assert isinstance(error, PolicyEngineUnavailable) and error.attempts == 4
    assert len(service.requests) == 4 and service.waits == [0.0, 0.0, 0.0]


def test_a_retry_after_past_the_longest_wait_raises_at_once() -> None:
    service = Scripted(refusal(429, "rate_limited", {"Retry-After": "31"}), NOT_FOUND)
    error = attempts_until_raised(service, SAFE["get_state"])
    assert isinstance(error, RateLimited) and error.attempts == 1 and error.retry_after == 31.0
    assert service.waits == []


def test_connection_failures_past_the_budget_raise_service_unavailable() -> None:
    service = Scripted(httpx.ConnectError("refused"))
    error = attempts_until_raised(service, SAFE["healthz"], retries=2, backoff=0.0)
    assert isinstance(error, ServiceUnavailable)
    assert (error.status, error.reason, error.attempts) == (None, "connection_failed", 3)
    assert isinstance(error.__cause__, httpx.ConnectError)
    assert error.request_id == service.requests[0].headers["X-Request-Id"]


def test_every_attempt_of_one_call_has_the_same_request_id() -> None:
    service = Scripted(httpx.ReadError("reset"), refusal(503, "store_unavailable"), NOT_FOUND)
    attempts_until_raised(service, SAFE["get_state"])
    ids = [request.headers["X-Request-Id"] for request in service.requests]
    assert len(ids) == 3 and len(set(ids)) == 1
    assert len(ids[0]) == 16 and int(ids[0], 16) >= 0  # 8 random bytes, in hex


def test_each_call_has_a_request_id_of_its_own() -> None:
    service = Scripted(NOT_FOUND)
    with service.sync_client() as client:
        for _ in range(3):
            with pytest.raises(NotFound):
                client.get_state(SCOPE)
    assert len({request.headers["X-Request-Id"] for request in service.requests}) == 3


def test_readiness_is_reported_not_retried() -> None:
    not_ready = {
        "ready": False,
        "opa_reachable": False,
        "policy_revision": None,
        "store_open": True,
        "store_writable": True,
        "store": {"kind": "leveldb", "target": "var/db", "reachable": True},
        "reasons": ["opa_unreachable"],
    }
    service = Scripted(httpx.Response(503, json=not_ready))
    with service.sync_client() as client:
        readiness = client.readyz()
    assert readiness.ready is False and readiness.reasons == ["opa_unreachable"]
    assert len(service.requests) == 1


def test_readiness_is_not_retried_even_after_a_429() -> None:
    service = Scripted(refusal(429, "rate_limited", {"Retry-After": "1"}))
    error = attempts_until_raised(service, lambda c: c.readyz())
    assert isinstance(error, RateLimited) and len(service.requests) == 1


def test_the_backoff_given_to_the_client_is_its_retry_policy() -> None:
    with Scripted(NOT_FOUND).sync_client(retries=4, backoff=0.5) as client:
        assert (client.retry_policy.retries, client.retry_policy.backoff) == (4, 0.5)
        assert client.retry_policy.max_wait == 30.0
