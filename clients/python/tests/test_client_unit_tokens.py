"""`SessionTokens`: a session's token, exchanged from a service token when first needed and
again shortly before it expires.

The clock is the one `SessionTokens` is given, so expiry is tested by moving
a number rather than by waiting. A session built by `for_service` sends with
the exchanged token; the exchange itself sends the service token in its form.
"""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs

import httpx
import pytest
from conftest import SCOPE, FakeService, decision, refusal, template
from sessionstate_client import (
    AsyncModelServiceSession,
    AsyncSessionTokens,
    AuthenticationFailed,
    ModelServiceSession,
    SessionTokens,
)


class Issuer(FakeService):
    """Issues `session-token-<n>` at `POST /v1/token`, living `expires_in` seconds;
    answers anything else 404, as a session with nothing stored. With a clock, each
    exchange's answer takes `latency` seconds of it to come back."""

    def __init__(self, expires_in: int = 600, clock: Clock | None = None, latency: float = 0):
        super().__init__()
        self.expires_in = expires_in
        self.clock = clock
        self.latency = latency
        self.refuse = False
        self.issued = 0

    def answer(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/token":
            return refusal(404, "session_state_not_found")
        if self.refuse:
            return refusal(401, "token_expired")
        if self.clock is not None:
            self.clock.now += self.latency
        self.issued += 1
        body = {
            "access_token": f"session-token-{self.issued}",
            "expires_in": self.expires_in,
            "decision": decision("token.exchange"),
        }
        return httpx.Response(200, json=body)

    def exchanges(self) -> list[dict[str, list[str]]]:
        return [parse_qs(r.content.decode()) for r in self.requests if r.url.path == "/v1/token"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_token_is_exchanged_once_and_kept_until_renewal_is_due() -> None:
    issuer, clock = Issuer(expires_in=600), Clock()
    tokens = SessionTokens(issuer.sync_client(None), "service-token", SCOPE, clock=clock)
    assert tokens.exchanges == 0 and issuer.requests == []  # nothing until first asked
    assert tokens() == "session-token-1"
    clock.now += 539.9  # renewal is due 60 s before expiry
    assert tokens() == "session-token-1"
    clock.now += 0.1
    assert tokens() == "session-token-2"
    assert tokens.exchanges == 2
    (first, _) = issuer.exchanges()
    assert first["subject_token"] == ["service-token"]
    assert first["resource"] == ["/v1/tenants/tenant-a/workspaces/ws-1/sessions/chat-1"]


def test_a_short_lived_token_is_renewed_halfway() -> None:
    issuer, clock = Issuer(expires_in=100), Clock()
    tokens = SessionTokens(issuer.sync_client(None), "service-token", SCOPE, clock=clock)
    tokens()
    clock.now += 49.9
    assert tokens() == "session-token-1"
    clock.now += 0.1
    assert tokens() == "session-token-2"


def test_renewal_is_measured_from_when_the_exchange_was_asked() -> None:
    clock = Clock()
    issuer = Issuer(expires_in=600, clock=clock, latency=100.0)
    tokens = SessionTokens(issuer.sync_client(None), "service-token", SCOPE, clock=clock)
    tokens()  # asked at 1000, answered at 1100: renewal is due at 1000 + 600 - 60
    clock.now = 1539.9
    assert tokens() == "session-token-1"
    clock.now = 1540.0
    assert tokens() == "session-token-2"


def test_the_service_token_source_is_asked_at_each_exchange_only() -> None:
    issuer, clock = Issuer(expires_in=100), Clock()
    asked: list[int] = []

    def service_token() -> str:
        asked.append(1)
        return f"service-token-{len(asked)}"

    tokens = SessionTokens(issuer.sync_client(None), service_token, SCOPE, clock=clock)
    tokens(), tokens()
    clock.now += 60
    tokens()
    assert len(asked) == 2
    assert [e["subject_token"] for e in issuer.exchanges()] == [
        ["service-token-1"],
        ["service-token-2"],
    ]


def test_without_a_service_token_nothing_is_exchanged() -> None:
    issuer = Issuer()
    tokens = SessionTokens(issuer.sync_client(None), None, SCOPE)
    with pytest.raises(ValueError, match="service token is needed"):
        tokens()
    assert issuer.requests == []


def test_a_refused_exchange_is_raised_and_not_kept() -> None:
    issuer = Issuer()
    issuer.refuse = True
    tokens = SessionTokens(issuer.sync_client(None), "service-token", SCOPE)
    with pytest.raises(AuthenticationFailed):
        tokens()
    issuer.refuse = False
    assert tokens() == "session-token-1" and tokens.exchanges == 1


def test_renew_before_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        SessionTokens(Issuer().sync_client(None), "t", SCOPE, renew_before=-1)


def test_token_sources_never_show_a_token() -> None:
    issuer = Issuer()
    tokens = SessionTokens(issuer.sync_client(None), "service-token", SCOPE)
    tokens()
    assert repr(tokens) == "SessionTokens(tenant-a/ws-1/chat-1)"
    assert "token-" not in repr(AsyncSessionTokens(issuer.async_client(None), "x", SCOPE))


def test_a_session_for_a_service_sends_with_its_exchanged_token() -> None:
    issuer = Issuer()
    client = issuer.sync_client("client-own-token")
    session = ModelServiceSession.for_service(client, "service-token", SCOPE, template())
    session.load()
    session.load()
    exchange, first, second = issuer.requests
    assert "Authorization" not in exchange.headers
    assert parse_qs(exchange.content.decode())["subject_token"] == ["service-token"]
    assert first.headers["Authorization"] == second.headers["Authorization"]
    assert first.headers["Authorization"] == "Bearer session-token-1"
    assert session.scope == SCOPE


def test_the_async_session_for_a_service_exchanges_once_for_its_calls() -> None:
    issuer = Issuer()

    async def service_token() -> str:
        return "async-service-token"

    async def run() -> None:
        client = issuer.async_client(None)
        session = AsyncModelServiceSession.for_service(client, service_token, SCOPE, template())
        await session.load()
        await session.load()
        await client.aclose()

    asyncio.run(run())
    paths = [r.url.path for r in issuer.requests]
    assert paths[0] == "/v1/token" and paths.count("/v1/token") == 1 and len(paths) == 3
    assert issuer.exchanges()[0]["subject_token"] == ["async-service-token"]
    assert issuer.requests[-1].headers["Authorization"] == "Bearer session-token-1"


def test_async_tokens_renew_on_their_clock_and_exchange_one_at_a_time() -> None:
    issuer, clock = Issuer(expires_in=600), Clock()

    async def run() -> list[str]:
        tokens = AsyncSessionTokens(issuer.async_client(None), "service-token", SCOPE, clock=clock)
        together = await asyncio.gather(tokens(), tokens(), tokens())
        clock.now += 540
        return [*together, await tokens()]

    assert asyncio.run(run()) == ["session-token-1"] * 3 + ["session-token-2"]
    assert len(issuer.exchanges()) == 2
