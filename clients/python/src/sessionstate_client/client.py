"""`SessionStateClient`: every endpoint of the v1 contract over one `httpx.Client`.

One method per endpoint; answers are the wire models of `sessionstate_client.models`,
errors the typed exceptions of `sessionstate_client.errors`, retries as
`sessionstate_client.retries` describes. Every attempt of one call carries the
same `X-Request-Id`, so the service's log lines of a retried call can be matched.
`AsyncSessionStateClient` (`sessionstate_client.aio`) has the same methods, awaited.
"""

from __future__ import annotations

import copy
import secrets
import time
from collections.abc import Callable, Iterator
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
TokenSource = str | Callable[[], str] | None
"""A bearer token, or a function that returns a current one (called once per attempt)."""


class SessionStateClient:
    """A typed client of one sessionstate service, for one bearer token.

    Use it as a context manager, or call `close()`. `timeout` is in seconds,
    for each of connect, read and write of every attempt; `retries` is how
    many times a failed call may be tried again (see `sessionstate_client.retries`);
    `transport` replaces httpx's network transport (tests, proxies).
    """

    def __init__(
        self,
        base_url: str,
        token: TokenSource,
        *,
        timeout: float = 5.0,
        retries: int = 2,
        backoff: float = 0.2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.retry_policy = RetryPolicy(retries=retries, backoff=backoff)
        self._token = token
        self._sleep: Callable[[float], None] = time.sleep
        self._owns_http = True
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            timeout=timeout,
            transport=transport,
            headers={"Accept": "application/json"},
        )

    def __repr__(self) -> str:  # never the token
        return f"SessionStateClient({str(self._http.base_url)!r})"

    def __enter__(self) -> SessionStateClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections (a client made by `with_token` leaves them to its parent)."""
        if self._owns_http:
            self._http.close()

    def with_token(self, token: TokenSource) -> SessionStateClient:
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

    def preview_state(self, scope: TenantScope, state: StateBody) -> SessionStateResponse:
        """`POST S/state/preview`: the sanitized record and what a write would do. Never writes."""
        return self._run(calls.preview_state(scope, state))

    def put_state(
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
        return self._run(calls.put_state(scope, state, if_match, if_none_match))

    def get_state(self, scope: TenantScope) -> SessionStateReadResponse:
        """`GET S/state`: the record (its `state_digest` is the ETag), or a corrupt read report.

        Raises `NotFound` when nothing is stored.
        """
        return self._run(calls.get_state(scope))

    def versions(
        self, scope: TenantScope, *, limit: int | None = None, cursor: str | None = None
    ) -> SessionVersionsResponse:
        """`GET S/state/versions`: one page of the session's versions, newest first; pass
        its `next_cursor` as `cursor` for the next. Raises `NotFound` when nothing is stored."""
        return self._run(calls.versions(scope, limit, cursor))

    def read_version(self, scope: TenantScope, version: int) -> SessionStateReadResponse:
        """`GET S/state/versions/{version}`: a kept version, read as `get_state` reads the
        current one. Raises `NotFound` when the session keeps no such version."""
        return self._run(calls.read_version(scope, version))

    def rewind(self, scope: TenantScope, to_version: int, *, if_match: str) -> SessionStateResponse:
        """`POST S/state/rewind`: write version `to_version`'s record as the next version.

        `if_match` is the current record's state digest (its ETag): a rewind replaces only
        the version it names (`PreconditionFailed` otherwise). It is a write: durable
        writes, an approval in force and the policy must allow it.
        """
        return self._run(calls.rewind(scope, to_version, if_match))

    def fork(
        self, scope: TenantScope, to_session_id: str, from_version: int | None = None
    ) -> SessionStateResponse:
        """`POST S/fork`: create session `to_session_id` of the same workspace from version
        `from_version` of `scope` (None: its current one), with its `lineage`.

        A write to the target: durable writes, an approval covering the target and the
        policy must allow it (by default a token of the whole workspace, or the tenant's
        operator; not a session's token). A target that holds a record raises `Conflict`.
        """
        return self._run(calls.fork(scope, to_session_id, from_version))

    def replay_preview(
        self, scope: TenantScope, max_inputs: int | None = None
    ) -> ReplayPreviewResponse:
        """`POST S/replay-preview`: replay inputs from digests (default 16 per list)."""
        return self._run(calls.replay_preview(scope, max_inputs))

    # --- session tokens, for a model service serving many sessions ---------------------

    def exchange_token(self, subject_token: str, scope: TenantScope) -> TokenExchangeResponse:
        """`POST /v1/token`: a token for the session `scope`, for a token of its workspace.

        OAuth 2.0 Token Exchange; the subject token goes in the form, never in a header,
        and this client's own token is not sent. `SessionTokens` calls it for a session.
        """
        return self._run(calls.exchange_token(subject_token, scope))

    # --- a workspace's sessions, and erasure --------------------------------------------

    def list_sessions(
        self,
        tenant_id: str,
        workspace_id: str,
        *,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> SessionListResponse:
        """`GET .../sessions`: a page of the workspace's stored sessions (a workspace's token,
        or an operator's); `cursor` is the previous page's `next_cursor`."""
        return self._run(calls.list_sessions(tenant_id, workspace_id, limit, cursor))

    def erase(self, scope: TenantScope, *, if_match: str | None = None) -> str:
        """`DELETE S/state` (204): the session erased, with all its versions (also
        when nothing is stored). `if_match`: only that state digest. Returns the decision
        id, whose entry is the erasure's receipt."""
        return self._run(calls.erase(scope, if_match))

    def erase_workspace(self, tenant_id: str, workspace_id: str) -> WorkspaceErasureResponse:
        """`DELETE .../sessions` (an operator's): every session of the workspace erased, each
        with its own receipt; repeat it to finish one that was cut off."""
        return self._run(calls.erase_workspace(tenant_id, workspace_id))

    # --- approvals, for operators --------------------------------------------------------

    def grant_approval(
        self, tenant_id: str, workspace_id: str, grant: GrantBody
    ) -> ApprovalResponse:
        """`POST .../approvals` (201). Not retried on a connection failure or a 503 (only on a
        429): it may have landed (`StoreOutcomeUnknown` says how to find out)."""
        return self._run(calls.grant_approval(tenant_id, workspace_id, grant))

    def list_approvals(self, tenant_id: str, workspace_id: str) -> ApprovalListResponse:
        """`GET .../approvals`: the approvals in force."""
        return self._run(calls.list_approvals(tenant_id, workspace_id))

    def revoke_approval(self, tenant_id: str, workspace_id: str, approval_id: str) -> str:
        """`DELETE .../approvals/{id}` (204): revoked at once. Returns the decision id."""
        return self._run(calls.revoke_approval(tenant_id, workspace_id, approval_id))

    # --- the decision log, for auditors --------------------------------------------------

    def list_decisions(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        **filters: Unpack[DecisionFilters],
    ) -> DecisionListResponse:
        """`GET /v1/decisions`: one page; pass its `next_cursor` as `cursor` for the next."""
        return self._run(calls.list_decisions(limit, cursor, filters))

    def iter_decisions(
        self, *, page_size: int | None = None, **filters: Unpack[DecisionFilters]
    ) -> Iterator[DecisionLogEntry]:
        """Every matching entry recorded before the iteration began, in the order asked.

        Reading the log is itself logged: the entry of the first page's own read
        marks where the iteration began, so that it never chases its own reads.
        """
        cursor: str | None = None
        began: str | None = None
        while True:
            page = self.list_decisions(limit=page_size, cursor=cursor, **filters)
            began = began or page.decision.decision_id
            for entry in page.decisions:
                if entry.decision.decision_id == began:
                    return
                yield entry
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def get_decision(self, decision_id: str) -> DecisionEntryResponse:
        """`GET /v1/decisions/{decision_id}`: one entry of the log."""
        return self._run(calls.get_decision(decision_id))

    def verify_decisions(self, *, full: bool = False) -> DecisionVerifyResponse:
        """`GET /v1/decisions/verify`: the chain's state and a signed checkpoint to keep.

        `full`: walk the whole chain, not only the entries after the last signed head.
        """
        return self._run(calls.verify_decisions(full))

    def policy_revisions(self, tenant_id: str | None = None) -> PolicyRevisionsResponse:
        """`GET /v1/decisions/policy-revisions`: which policy revisions decided, and when."""
        return self._run(calls.policy_revisions(tenant_id))

    def export_decisions(self, **filters: Unpack[DecisionFilters]) -> Iterator[dict[str, Any]]:
        """`GET /v1/decisions/export`: one OPA-style event a line, streamed.

        The request goes out when iteration starts; errors are raised from there.
        """
        call = calls.export_decisions(filters)
        response = self._send(call, stream=True)
        try:
            for line in response.iter_lines():
                event = calls.export_event(response, line)
                if event is not None:
                    yield event
        except httpx.TransportError as error:
            raise calls.failed(error, None, 1) from error
        except httpx.DecodingError:
            raise calls.unexpected(response) from None
        finally:
            response.close()

    # --- operations, for anyone ----------------------------------------------------------

    def healthz(self) -> Health:
        return self._run(calls.healthz())

    def readyz(self) -> Readiness:
        """Readiness as reported: `ready` is False on a 503 answer, which is not retried."""
        return self._run(calls.readyz())

    def metrics(self) -> str:
        """The Prometheus text exposition."""
        return self._run(calls.metrics())

    def openapi(self) -> dict[str, Any]:
        """The OpenAPI 3.1 document."""
        return self._run(calls.openapi())

    # --- one call, with its retries ------------------------------------------------------

    def _run(self, call: calls.Call[T]) -> T:
        return call.parse(self._send(call))

    def _send(self, call: calls.Call[Any], *, stream: bool = False) -> httpx.Response:
        """The answer with an `ok` status, after retrying what `RetryPolicy` allows."""
        request_id = secrets.token_hex(8)
        attempt = 0
        while True:
            attempt += 1
            token = resolve_token(self._token)
            request = self._http.build_request(
                call.method,
                call.path,
                content=call.content,
                params=call.params,
                headers=calls.headers(call, request_id, token),
            )
            try:
                response = self._http.send(request, stream=True)
                try:  # the body, decoded, unless it is streamed to the caller
                    if not (stream and response.status_code in call.ok):
                        response.read()
                except BaseException:
                    response.close()
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
            self._sleep(wait)


def resolve_token(source: TokenSource) -> str | None:
    """The token `source` gives now: itself, or what calling it returns."""
    return source() if callable(source) else source
