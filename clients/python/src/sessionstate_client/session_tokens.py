"""Token sources for one session, from one service token: exchanged when first needed,
and again shortly before each expires.

A bot holds one token for its tenant and workspace (role `model-service`, no
session: from an identity provider by client credentials, say) and serves many
sessions. `SessionTokens(client, service_token, scope)` is a token source (a
callable a client asks once per attempt) that exchanges the service token for
the session's own at `POST /v1/token` on its first use, keeps it, and exchanges
again once the token is within `renew_before` seconds of its `expires_in`
(measured on this process's monotonic clock from when the answer came, so no
clock needs to agree with the service's). `ModelServiceSession.for_service`
builds one for its session; nothing else changes for the caller.

The service token may itself be a token source: it is asked at each exchange,
so an identity provider's token can be renewed on its own schedule.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from sessionstate_client.aio import AsyncSessionStateClient, AsyncTokenSource
from sessionstate_client.aio import resolve_token as resolve_async_token
from sessionstate_client.client import SessionStateClient, TokenSource, resolve_token
from sessionstate_client.models import TenantScope, TokenExchangeResponse

DEFAULT_RENEW_BEFORE_SECONDS = 60.0


class _Held:
    """The session token held, and when to exchange again."""

    def __init__(self, renew_before: float, clock: Callable[[], float]) -> None:
        if renew_before < 0:
            raise ValueError("renew_before must not be negative")
        self.renew_before = renew_before
        self.clock = clock
        self.token: str | None = None
        self.renew_at = 0.0
        self.exchanges = 0

    def current(self) -> str | None:
        return self.token if self.token is not None and self.clock() < self.renew_at else None

    def keep(self, answer: TokenExchangeResponse, asked_at: float) -> str:
        # Renew `renew_before` ahead of expiry; a token shorter than twice that, halfway.
        lead = min(self.renew_before, answer.expires_in / 2)
        self.token = answer.access_token
        self.renew_at = asked_at + answer.expires_in - lead
        self.exchanges += 1
        return answer.access_token


class SessionTokens:
    """A token source for one session, exchanged from a service token (thread-safe)."""

    def __init__(
        self,
        client: SessionStateClient,
        service_token: TokenSource,
        scope: TenantScope,
        *,
        renew_before: float = DEFAULT_RENEW_BEFORE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scope = scope
        self._client = client
        self._service_token = service_token
        self._held = _Held(renew_before, clock)
        self._guard = threading.Lock()

    def __repr__(self) -> str:  # never a token
        return f"SessionTokens({self.scope.tenant_id}/{self.scope.workspace_id}/{self.scope.session_id})"

    @property
    def exchanges(self) -> int:
        """How many times the service token was exchanged for this session."""
        return self._held.exchanges

    def __call__(self) -> str:
        with self._guard:
            token = self._held.current()
            if token is not None:
                return token
            subject = resolve_token(self._service_token)
            if subject is None:
                raise ValueError("a service token is needed to exchange for a session's")
            asked_at = self._held.clock()
            return self._held.keep(self._client.exchange_token(subject, self.scope), asked_at)


class AsyncSessionTokens:
    """`SessionTokens` for `AsyncSessionStateClient`: exchanges are awaited, one at a time."""

    def __init__(
        self,
        client: AsyncSessionStateClient,
        service_token: AsyncTokenSource,
        scope: TenantScope,
        *,
        renew_before: float = DEFAULT_RENEW_BEFORE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scope = scope
        self._client = client
        self._service_token = service_token
        self._held = _Held(renew_before, clock)
        self._guard = asyncio.Lock()  # bound to the loop that first uses it

    def __repr__(self) -> str:  # never a token
        return f"AsyncSessionTokens({self.scope.tenant_id}/{self.scope.workspace_id}/{self.scope.session_id})"

    @property
    def exchanges(self) -> int:
        return self._held.exchanges

    async def __call__(self) -> str:
        async with self._guard:
            token = self._held.current()
            if token is not None:
                return token
            subject = await resolve_async_token(self._service_token)
            if subject is None:
                raise ValueError("a service token is needed to exchange for a session's")
            asked_at = self._held.clock()
            answer = await self._client.exchange_token(subject, self.scope)
            return self._held.keep(answer, asked_at)
