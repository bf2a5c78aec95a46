"""`AsyncSessionStateClient`: `SessionStateClient`'s methods, awaited, over `httpx.AsyncClient`.

The same calls (`sessionstate_client._calls`), answers, exceptions and retries
as the sync client; waits between attempts are `asyncio.sleep`. The token may
be a string, or a function returning one or an awaitable of one (asked once
per attempt), so that a token source can itself call out without blocking.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, Unpack

import httpx

from sessionstate_client import _calls as calls
from sessionstate_client._calls import DecisionFilters, GrantBody, StateBody
from sessionstate_client.models import (
    ApprovalListResponse,
    ApprovalResponse,
    DecisionEntryResponse,
    DecisionListResponse,
    DecisionLogEntry,
    DecisionVerifyResponse,
    Health,
    PolicyRevisionsResponse,
    Readiness,
    ReplayPreviewResponse,
    SessionListResponse,
    SessionStateReadResponse,
    SessionStateResponse,
    SessionVersionsResponse,
    TenantScope,
    TokenExchangeResponse,
    WorkspaceErasureResponse,
)
from sessionstate_client.retries import RetryPolicy

T = TypeVar("T")
AsyncTokenSource = str | Callable[[], str | Awaitable[str]] | None
"""A bearer token, or a function that returns a current one or an awaitable of one
(called once per attempt)."""


class AsyncSessionStateClient:
    """A typed asyncio client of one sessionstate service, for one bearer token.

    Use it as an async context manager, or await `aclose()`. `timeout` is in seconds,
    for each of connect, read and write of every attempt; `retries` is how
    many times a failed call may be tried again (see `sessionstate_client.retries`);
    `transport` replaces httpx's network transport (tests, proxies).
    """

    def __init__(
        self,
        base_url: str,
        token: AsyncTokenSource,
        *,
        timeout: float = 5.0,
        retries: int = 2,
        backoff: float = 0.2,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.retry_policy = RetryPolicy(retries=retries, backoff=backoff)
        self._token = token
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self._owns_http = True
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            timeout=timeout,
            transport=transport,
            headers={"Accept": "application/json"},
        )

    def __repr__(self) -> str:  # never the token
        return f"AsyncSessionStateClient({str(self._http.base_url)!r})"

    async def __aenter__(self) -> AsyncSessionStateClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections (a client made by `with_token` leaves them to its parent)."""
        if self._owns_http:
            await self._http.aclose()

    def with_token(self, token: AsyncTokenSource) -> AsyncSessionStateClient:
        """The same client with another token, sharing this one's connections.

        For one process that acts for several identities (an operator and its
        model service; a bot's per-session tokens). Closing it closes nothing;
        closing this client closes both.
        """
        other = copy.copy(self)
        other._token = token
        other._owns_http = False
        return other

    # --- session state, for model services -----------------------------------------------

    async def preview_state(self, scope: TenantScope, state: StateBody) -> SessionStateResponse:
        """`POST S/state/preview`: the sanitized record and what a write would do. Never writes."""
        return await self._run(calls.preview_state(scope, state))

    async def put_state(
        self,
        scope: TenantScope,
        state: StateBody,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> SessionStateResponse:
        """`PUT S/state`: write the record. `if_match` is a state digest (the ETag, unquoted).

        With `if_match`, only that stored version is replaced; with `if_none_match`, only an
        absent record is created; otherwise the last writer wins (and the call is not
        retried on a connection failure or a 503, since it is not safe to repeat).
        """
        return await self._run(calls.put_state(scope, state, if_match, if_none_match))

    async def get_state(self, scope: TenantScope) -> SessionStateReadResponse:
        """`GET S/state`: the record (its `state_digest` is the ETag), or a corrupt read report.

        Raises `NotFound` when nothing is stored.
        """
        return await self._run(calls.get_state(scope))

    async def versions(
        self, scope: TenantScope, *, limit: int | None = None, cursor: str | None = None
    ) -> SessionVersionsResponse:
        """`GET S/state/versions`: one page of the session's versions, newest first."""
        return await self._run(calls.versions(scope, limit, cursor))

    async def read_version(self, scope: TenantScope, version: int) -> SessionStateReadResponse:
        """`GET S/state/versions/{version}`: a kept version, read as the current one is."""
        return await self._run(calls.read_version(scope, version))

    async def rewind(
        self, scope: TenantScope, to_version: int, *, if_match: str
    ) -> SessionStateResponse:
        """`POST S/state/rewind`: version `to_version`'s record as the next version, if the
        current one is still `if_match` (its state digest)."""
        return await self._run(calls.rewind(scope, to_version, if_match))

    async def fork(
        self, scope: TenantScope, to_session_id: str, from_version: int | None = None
    ) -> SessionStateResponse:
        """`POST S/fork`: create session `to_session_id` of the same workspace from version
        `from_version` of `scope` (None: its current one), with its `lineage`.

        A write to the target: durable writes, an approval covering the target and the
        policy must allow it (by default a token of the whole workspace, or the tenant's
        operator; not a session's token). A target that holds a record raises `Conflict`.
        """
        return await self._run(calls.fork(scope, to_session_id, from_version))

    async def replay_preview(
        self, scope: TenantScope, max_inputs: int | None = None
    ) -> ReplayPreviewResponse:
        """`POST S/replay-preview`: replay inputs from digests (default 16 per list)."""
        return await self._run(calls.replay_preview(scope, max_inputs))

    # --- session tokens, for a model service serving many sessions ---------------------

    async def exchange_token(self, subject_token: str, scope: TenantScope) -> TokenExchangeResponse:
        """`POST /v1/token`: a token for the session `scope`, for a token of its workspace.

        OAuth 2.0 Token Exchange; the subject token goes in the form, never in a header,
        and this client's own token is not sent. `SessionTokens` calls it for a session.
        """
        return await self._run(calls.exchange_token(subject_token, scope))

    # --- a workspace's sessions, and erasure --------------------------------------------

    async def list_sessions(
        self,
        tenant_id: str,
        workspace_id: str,
        *,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> SessionListResponse:
        """`GET .../sessions`: a page of the workspace's stored sessions (a workspace's token,
        or an operator's); `cursor` is the previous page's `next_cursor`."""
        return await self._run(calls.list_sessions(tenant_id, workspace_id, limit, cursor))

    async def erase(self, scope: TenantScope, *, if_match: str | None = None) -> str:
        """`DELETE S/state` (204): the session erased, with all its versions (also
        when nothing is stored). `if_match`: only that state digest. Returns the decision
        id, whose entry is the erasure's receipt."""
        return await self._run(calls.erase(scope, if_match))

    async def erase_workspace(self, tenant_id: str, workspace_id: str) -> WorkspaceErasureResponse:
        """`DELETE .../sessions` (an operator's): every session of the workspace erased, each
        with its own receipt; repeat it to finish one that was cut off."""
        return await self._run(calls.erase_workspace(tenant_id, workspace_id))

    # --- approvals, for operators --------------------------------------------------------

    async def grant_approval(
        self, tenant_id: str, workspace_id: str, grant: GrantBody
    ) -> ApprovalResponse:
        """`POST .../approvals` (201). Not retried on a connection failure or a 503 (only on a
        429): it may have landed (`StoreOutcomeUnknown` says how to find out)."""
        return await self._run(calls.grant_approval(tenant_id, workspace_id, grant))

    async def list_approvals(self, tenant_id: str, workspace_id: str) -> ApprovalListResponse:
        """`GET .../approvals`: the approvals in force."""
        return await self._run(calls.list_approvals(tenant_id, workspace_id))

    async def revoke_approval(self, tenant_id: str, workspace_id: str, approval_id: str) -> str:
        """`DELETE .../approvals/{id}` (204): revoked at once. Returns the decision id."""
        return await self._run(calls.revoke_approval(tenant_id, workspace_id, approval_id))

    # --- the decision log, for auditors --------------------------------------------------

    async def list_decisions(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        **filters: Unpack[DecisionFilters],
    ) -> DecisionListResponse:
        """`GET /v1/decisions`: one page; pass its `next_cursor` as `cursor` for the next."""
        return await self._run(calls.list_decisions(limit, cursor, filters))

    async def iter_decisions(
        self, *, page_size: int | None = None, **filters: Unpack[DecisionFilters]
    ) -> AsyncIterator[DecisionLogEntry]:
        """Every matching entry recorded before the iteration began, in the order asked.

        Reading the log is itself logged: the entry of the first page's own read
        marks where the iteration began, so that it never chases its own reads.
        """
        cursor: str | None = None
        began: str | None = None
        while True:
            page = await self.list_decisions(limit=page_size, cursor=cursor, **filters)
            began = began or page.decision.decision_id
            for entry in page.decisions:
                if entry.decision.decision_id == began:
                    return
                yield entry
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def get_decision(self, decision_id: str) -> DecisionEntryResponse:
        """`GET /v1/decisions/{decision_id}`: one entry of the log."""
        return await self._run(calls.get_decision(decision_id))

    async def verify_decisions(self, *, full: bool = False) -> DecisionVerifyResponse:
        """`GET /v1/decisions/verify`: the chain's state and a signed checkpoint to keep.

        `full`: walk the whole chain, not only the entries after the last signed head.
        """
        return await self._run(calls.verify_decisions(full))

    async def policy_revisions(self, tenant_id: str | None = None) -> PolicyRevisionsResponse:
        """`GET /v1/decisions/policy-revisions`: which policy revisions decided, and when."""
        return await self._run(calls.policy_revisions(tenant_id))

    async def export_decisions(
        self, **filters: Unpack[DecisionFilters]
    ) -> AsyncIterator[dict[str, Any]]:
        """`GET /v1/decisions/export`: one OPA-style event a line, streamed.

        The request goes out when iteration starts; errors are raised from there.
        """
        call = calls.export_decisions(filters)
        response = await self._send(call, stream=True)
        try:
            async for line in response.aiter_lines():
                event = calls.export_event(response, line)
                if event is not None:
                    yield event
        except httpx.TransportError as error:
            raise calls.failed(error, None, 1) from error
        except httpx.DecodingError:
            raise calls.unexpected(response) from None
        finally:
            await response.aclose()

    # --- operations, for anyone ----------------------------------------------------------

    async def healthz(self) -> Health:
        return await self._run(calls.healthz())

    async def readyz(self) -> Readiness:
        """Readiness as reported: `ready` is False on a 503 answer, which is not retried."""
        return await self._run(calls.readyz())

    async def metrics(self) -> str:
        """The Prometheus text exposition."""
        return await self._run(calls.metrics())

    async def openapi(self) -> dict[str, Any]:
        """The OpenAPI 3.1 document."""
        return await self._run(calls.openapi())

    # --- one call, with its retries ------------------------------------------------------

    async def _run(self, call: calls.Call[T]) -> T:
        return call.parse(await self._send(call))

    async def _send(self, call: calls.Call[Any], *, stream: bool = False) -> httpx.Response:
        """The answer with an `ok` status, after retrying what `RetryPolicy` allows."""
        request_id = secrets.token_hex(8)
        attempt = 0
        while True:
            attempt += 1
            token = await resolve_token(self._token)
            request = self._http.build_request(
                call.method,
                call.path,
                content=call.content,
                params=call.params,
                headers=calls.headers(call, request_id, token),
            )
            try:
                response = await self._http.send(request, stream=True)
                try:  # the body, decoded, unless it is streamed to the caller
                    if not (stream and response.status_code in call.ok):
                        await response.aread()
                except BaseException:
                    await response.aclose()
                    raise
            except httpx.TransportError as error:
                wait = calls.wait_after_failure(call, attempt, self.retry_policy)
                if wait is None:
                    raise calls.failed(error, request_id, attempt) from error
            except httpx.DecodingError:  # a body its Content-Encoding does not describe
                raise calls.unexpected(response) from None
            else:
                if response.status_code in call.ok:
                    return response
                wait = calls.wait_after_answer(call, response, attempt, self.retry_policy)
                if wait is None:
                    raise calls.refused(response, attempt)
            await self._sleep(wait)


async def resolve_token(source: AsyncTokenSource) -> str | None:
    """The token `source` gives now: itself, or what calling it returns (awaited if need be)."""
    if not callable(source):
        return source
    token = source()
    return await token if inspect.isawaitable(token) else token
