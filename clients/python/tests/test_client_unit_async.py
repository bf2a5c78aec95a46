"""The asyncio client is the sync client's twin: the same requests, answers, errors and retries.

Each call is made with both clients against the same fake service; the
requests they send (but for the random request id) and what they return or
raise must be equal. Async code runs under `asyncio.run` inside plain test
functions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from conftest import SCOPE, Endpoints, FakeService, Scripted, refusal, template
from sessionstate_client import (
    AsyncSessionStateClient,
    NotFound,
    SessionStateClient,
    SessionStateError,
    StoreOutcomeUnknown,
    UnexpectedResponse,
)

GRANT = {"ttl_seconds": 60, "reason": "unit"}
CALLS: dict[str, Callable[[Any], Any]] = {
    "get_state": lambda c: c.get_state(SCOPE),
    "preview_state": lambda c: c.preview_state(SCOPE, template()),
    "put_state": lambda c: c.put_state(SCOPE, template(), if_match="sha256:" + "0" * 64),
    "replay_preview": lambda c: c.replay_preview(SCOPE, 3),
    "versions": lambda c: c.versions(SCOPE, limit=2, cursor="c-1"),
    "read_version": lambda c: c.read_version(SCOPE, 1),
    "rewind": lambda c: c.rewind(SCOPE, 1, if_match="sha256:" + "0" * 64),
    "erase": lambda c: c.erase(SCOPE, if_match="sha256:" + "0" * 64),
    "list_sessions": lambda c: c.list_sessions("tenant-a", "ws-1", limit=1),
    "erase_workspace": lambda c: c.erase_workspace("tenant-a", "ws-1"),
    "fork": lambda c: c.fork(SCOPE, "chat-2", 3),
    "exchange_token": lambda c: c.exchange_token("service-token", SCOPE),
    "grant_approval": lambda c: c.grant_approval("tenant-a", "ws-1", GRANT),
    "list_approvals": lambda c: c.list_approvals("tenant-a", "ws-1"),
    "revoke_approval": lambda c: c.revoke_approval("tenant-a", "ws-1", "appr_1"),
    "list_decisions": lambda c: c.list_decisions(limit=1, allow=True),
    "iter_decisions": lambda c: c.iter_decisions(page_size=1),
    "get_decision": lambda c: c.get_decision("d-1"),
    "verify_decisions": lambda c: c.verify_decisions(full=True),
    "policy_revisions": lambda c: c.policy_revisions("tenant-a"),
    "export_decisions": lambda c: c.export_decisions(action="write"),
    "healthz": lambda c: c.healthz(),
    "readyz": lambda c: c.readyz(),
    "metrics": lambda c: c.metrics(),
    "openapi": lambda c: c.openapi(),
}


def public_methods(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if callable(value) and name[0] != "_"}


def test_the_twins_have_the_same_methods_and_each_is_called_here() -> None:
    sync = public_methods(SessionStateClient) - {"close", "with_token"}
    assert sync == public_methods(AsyncSessionStateClient) - {"aclose", "with_token"}
    assert sync == set(CALLS)


def seen(service: FakeService) -> list[tuple[str, str, bytes, list[tuple[str, str]]]]:
    """Each request as method, URL, body and headers, without its random request id."""
    return [
        (
            request.method,
            str(request.url),
            request.content,
            sorted((k, v) for k, v in request.headers.items() if k != "x-request-id"),
        )
        for request in service.requests
    ]


def sync_outcome(service: FakeService, name: str, **options: Any) -> Any:
    with service.sync_client(**options) as client:
        try:
            result = CALLS[name](client)
            return list(result) if hasattr(result, "__next__") else result
        except SessionStateError as error:
            return error


def async_outcome(service: FakeService, name: str, **options: Any) -> Any:
    async def run() -> Any:
        async with service.async_client(**options) as client:
            try:
                result = CALLS[name](client)
                if hasattr(result, "__aiter__"):
                    return [item async for item in result]
                return await result
            except SessionStateError as error:
                return error

    return asyncio.run(run())


@pytest.mark.parametrize("name", CALLS)
def test_both_send_the_same_request_and_return_the_same_answer(name: str) -> None:
    sync_service, async_service = Endpoints(), Endpoints()
    sync_answer = sync_outcome(sync_service, name)
    async_answer = async_outcome(async_service, name)
    assert not isinstance(sync_answer, SessionStateError), sync_answer
    assert async_answer == sync_answer
    assert seen(async_service) == seen(sync_service)


FAILURES = [
    pytest.param((refusal(404, "session_state_not_found"),), id="404"),
    pytest.param((refusal(503, "store_outcome_unknown"),), id="503-every-time"),
    pytest.param((httpx.ConnectError("refused"),), id="no-connection"),
    pytest.param((httpx.Response(200, content=b"{"),), id="truncated"),
    pytest.param((refusal(429, "rate_limited", {"Retry-After": "3"}), refusal(404, "x")), id="429"),
]


@pytest.mark.parametrize("script", FAILURES)
@pytest.mark.parametrize("name", ["get_state", "grant_approval", "export_decisions"])
def test_both_fail_alike_after_the_same_attempts_and_waits(
    script: tuple[Any, ...], name: str
) -> None:
    sync_service, async_service = Scripted(*script), Scripted(*script)
    sync_error = sync_outcome(sync_service, name, backoff=0.0)
    async_error = async_outcome(async_service, name, backoff=0.0)
    assert isinstance(sync_error, SessionStateError)
    assert type(async_error) is type(sync_error)
    assert (async_error.status, async_error.reason, async_error.attempts) == (
        sync_error.status,
        sync_error.reason,
        sync_error.attempts,
    )
    assert async_service.waits == sync_service.waits
    assert seen(async_service) == seen(sync_service)


def test_an_async_token_source_is_awaited_on_every_attempt() -> None:
    issued = iter(["first", "second"])
    service = Scripted(refusal(503, "store_unavailable"), refusal(404, "not_found"))

    async def token() -> str:
        return next(issued)

    error = async_outcome(service, "get_state", token=token, backoff=0.0)
    assert isinstance(error, NotFound) and error.attempts == 2
    assert [r.headers["Authorization"] for r in service.requests] == [
        "Bearer first",
        "Bearer second",
    ]


def test_a_plain_function_is_a_token_source_for_the_async_client_too() -> None:
    service = Scripted(refusal(404, "not_found"))
    async_outcome(service, "get_state", token=lambda: "plain")
    assert service.requests[0].headers["Authorization"] == "Bearer plain"


def test_an_unsafe_async_call_is_not_sent_again_after_a_503() -> None:
    service = Scripted(refusal(503, "store_outcome_unknown"), refusal(404, "not_found"))
    error = async_outcome(service, "grant_approval", backoff=0.0)
    assert isinstance(error, StoreOutcomeUnknown) and len(service.requests) == 1


def test_the_async_client_never_shows_its_token_and_with_token_shares_connections() -> None:
    service = Scripted(refusal(404, "not_found"))

    async def run() -> list[str | None]:
        client = service.async_client("model-token")
        assert "model-token" not in repr(client)
        other = client.with_token("operator-token")
        for caller in (other, client):
            with pytest.raises(NotFound):
                await caller.list_approvals("tenant-a", "ws-1")
        await other.aclose()  # closes nothing
        with pytest.raises(NotFound):
            await client.healthz()
        await client.aclose()
        with pytest.raises(RuntimeError):
            await other.healthz()
        return [r.headers.get("Authorization") for r in service.requests]

    assert asyncio.run(run()) == ["Bearer operator-token", "Bearer model-token", None]


@pytest.mark.parametrize("name", ["get_state", "export_decisions"])
def test_both_refuse_a_body_its_content_encoding_does_not_describe(name: str) -> None:
    answer = httpx.Response(
        200, headers={"Content-Encoding": "gzip"}, stream=httpx.ByteStream(b"not gzip")
    )
    sync_error = sync_outcome(Scripted(answer), name)
    async_error = async_outcome(Scripted(answer), name)
    assert type(sync_error) is type(async_error) is UnexpectedResponse
    assert (async_error.status, async_error.reason) == (200, "response_not_in_contract")
