"""`SessionStateClient`: every endpoint of the v1 contract, answers as the wire models.

One method per endpoint, over one `httpx.Client`. Successful answers are
validated with the response envelopes of `service.wire`; error answers become
the typed exceptions of `service.client.errors`. Retries follow
`service.client.retries`. Every attempt of one call carries the same
`X-Request-Id`, so the service's log lines of a retried call can be matched.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any, TypedDict, TypeVar, Unpack

import httpx
from pydantic import BaseModel

from service import contract
from service.approvals import ApprovalGrantInput
from service.client.errors import (
    ServiceUnavailable,
    UnexpectedResponse,
    error_from_response,
)
from service.client.retries import NOTHING_DONE, RetryPolicy, parse_retry_after
from service.decisions.log import DecisionLogEntry
from service.policy.input import PolicyAction
from service.wire import (
    ApprovalListResponse,
    ApprovalResponse,
    DecisionEntryResponse,
    DecisionListResponse,
    DecisionVerifyResponse,
    Health,
    Readiness,
    ReplayPreviewResponse,
    SessionStateReadResponse,
    SessionStateResponse,
)
from store.inputs import SessionStateInput
from store.scope import TenantScope, is_scope_id

M = TypeVar("M", bound=BaseModel)
TokenSource = str | Callable[[], str] | None
"""A bearer token, or a function that returns a current one (called once per attempt)."""
StateBody = SessionStateInput | Mapping[str, Any]
"""A `SessionStateInput`, or the same as a JSON-ready mapping (the service validates it)."""


class DecisionFilters(TypedDict, total=False):
    """Filters of the decision log listing and export."""

    tenant_id: str
    action: PolicyAction
    allow: bool
    since: datetime | str
    until: datetime | str


class SessionStateClient:
    """A typed client of one sessionstate service, for one bearer token.

    Use it as a context manager, or call `close()`. `timeout` is in seconds,
    for each of connect, read and write of every attempt; `retries` is how
    many times a failed call may be tried again (see `service.client.retries`);
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
        self._http.close()

    # --- session state, for model services -------------------------------------------------

    def preview_state(self, scope: TenantScope, state: StateBody) -> SessionStateResponse:
        """`POST S/state/preview`: the sanitized record and what a write would do. Never writes."""
        response = self._call(
            "POST", _session(contract.STATE_PREVIEW, scope), safe=True, body=state
        )
        return _model(response, SessionStateResponse)

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
        retried on a connection failure, since it is not safe to repeat).
        """
        if if_match is not None and if_none_match:
            raise ValueError("send If-Match or If-None-Match, not both")
        headers = {}
        if if_match is not None:
            headers[contract.IF_MATCH] = if_match if if_match.startswith('"') else f'"{if_match}"'
        if if_none_match:
            headers[contract.IF_NONE_MATCH] = "*"
        response = self._call(
            "PUT", _session(contract.STATE, scope), safe=bool(headers), body=state, headers=headers
        )
        return _model(response, SessionStateResponse)

    def get_state(self, scope: TenantScope) -> SessionStateReadResponse:
        """`GET S/state`: the record (its `state_digest` is the ETag), or a corrupt read report.

        Raises `NotFound` when nothing is stored.
        """
        return _model(self._call("GET", _session(contract.STATE, scope)), SessionStateReadResponse)

    def replay_preview(
        self, scope: TenantScope, max_inputs: int | None = None
    ) -> ReplayPreviewResponse:
        """`POST S/replay-preview`: replay inputs from digests (default 16 per list)."""
        body = {} if max_inputs is None else {"max_inputs": max_inputs}
        response = self._call(
            "POST", _session(contract.REPLAY_PREVIEW, scope), safe=True, body=body
        )
        return _model(response, ReplayPreviewResponse)

    # --- approvals, for operators ----------------------------------------------------------

    def grant_approval(
        self,
        tenant_id: str,
        workspace_id: str,
        grant: ApprovalGrantInput | Mapping[str, Any],
    ) -> ApprovalResponse:
        """`POST .../approvals` (201). Not retried on a connection failure: it may have landed."""
        path = _workspace(contract.APPROVALS, tenant_id, workspace_id)
        response = self._call("POST", path, safe=False, body=grant, ok=(201,))
        return _model(response, ApprovalResponse)

    def list_approvals(self, tenant_id: str, workspace_id: str) -> ApprovalListResponse:
        """`GET .../approvals`: the approvals in force."""
        path = _workspace(contract.APPROVALS, tenant_id, workspace_id)
        return _model(self._call("GET", path), ApprovalListResponse)

    def revoke_approval(self, tenant_id: str, workspace_id: str, approval_id: str) -> str:
        """`DELETE .../approvals/{id}` (204): revoked at once. Returns the decision id."""
        path = _workspace(contract.APPROVAL, tenant_id, workspace_id, approval_id=approval_id)
        response = self._call("DELETE", path, ok=(204,))
        decision_id: str = response.headers.get(contract.DECISION_ID_HEADER, "")
        if not decision_id:
            raise _unexpected(response)
        return decision_id

    # --- the decision log, for auditors ----------------------------------------------------

    def list_decisions(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        **filters: Unpack[DecisionFilters],
    ) -> DecisionListResponse:
        """`GET /v1/decisions`: one page; pass its `next_cursor` as `cursor` for the next."""
        params = _decision_params(filters)
        if limit is not None:
            params["limit"] = str(limit)
        if cursor is not None:
            params["cursor"] = cursor
        return _model(self._call("GET", contract.DECISIONS, params=params), DecisionListResponse)

    def iter_decisions(
        self, *, page_size: int | None = None, **filters: Unpack[DecisionFilters]
    ) -> Iterator[DecisionLogEntry]:
        """Every matching entry recorded before the iteration began, in chain order.

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
        path = contract.fill(contract.DECISION, decision_id=decision_id)
        return _model(self._call("GET", path), DecisionEntryResponse)

    def verify_decisions(self) -> DecisionVerifyResponse:
        """`GET /v1/decisions/verify`: the chain's state and a signed checkpoint to keep."""
        return _model(self._call("GET", contract.DECISIONS_VERIFY), DecisionVerifyResponse)

    def export_decisions(self, **filters: Unpack[DecisionFilters]) -> Iterator[dict[str, Any]]:
        """`GET /v1/decisions/export`: one OPA-style event a line, streamed.

        The request goes out when iteration starts; errors are raised from there.
        """
        params = _decision_params(filters)
        response = self._call("GET", contract.DECISIONS_EXPORT, params=params, stream=True)
        try:
            for line in response.iter_lines():
                if line.strip():
                    yield _json_line(response, line)
        except httpx.TransportError as error:
            raise ServiceUnavailable(None, _transport_reason(error)) from error
        finally:
            response.close()

    # --- operations, for anyone ------------------------------------------------------------

    def healthz(self) -> Health:
        return _model(self._call("GET", contract.HEALTHZ, auth=False), Health)

    def readyz(self) -> Readiness:
        """Readiness as reported: `ready` is False on a 503 answer, which is not retried."""
        response = self._call(
            "GET", contract.READYZ, auth=False, ok=(200, 503), retry_refusals=False
        )
        return _model(response, Readiness)

    def metrics(self) -> str:
        """The Prometheus text exposition."""
        return self._call("GET", contract.METRICS, auth=False).text

    def openapi(self) -> dict[str, Any]:
        """The OpenAPI 3.1 document."""
        response = self._call("GET", contract.OPENAPI, auth=False)
        document = _json_document(response)
        if not isinstance(document, dict):
            raise _unexpected(response)
        return document

    # --- one call, with its retries --------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        safe: bool = True,
        body: BaseModel | Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: bool = True,
        ok: tuple[int, ...] = (200, 201),
        retry_refusals: bool = True,
        stream: bool = False,
    ) -> httpx.Response:
        """The answer with an `ok` status, after retrying what `RetryPolicy` allows.

        `safe`: whether the call may be repeated after a connection failure.
        `retry_refusals`: whether a 503 or 429 (refused, nothing done) is tried again.
        """
        request_id = secrets.token_hex(8)
        content = None if body is None else _encode(body)
        attempt = 0
        while True:
            attempt += 1
            request = self._http.build_request(
                method,
                path,
                content=content,
                params=params,
                headers=self._headers(request_id, content is not None, auth, headers),
            )
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TransportError as error:
                wait = self.retry_policy.wait(attempt) if safe else None
                if wait is None:
                    raise ServiceUnavailable(
                        None, _transport_reason(error), request_id=request_id, attempts=attempt
                    ) from error
            else:
                if response.status_code in ok:
                    return response
                response.read()
                response.close()
                wait = None
                if response.status_code in NOTHING_DONE and retry_refusals:
                    retry_after = parse_retry_after(response.headers.get(contract.RETRY_AFTER))
                    wait = self.retry_policy.wait(attempt, retry_after)
                if wait is None:
                    raise error_from_response(response, attempts=attempt)
            self._sleep(wait)

    def _headers(
        self, request_id: str, has_body: bool, auth: bool, extra: Mapping[str, str] | None
    ) -> dict[str, str]:
        headers = {contract.REQUEST_ID: request_id, **(extra or {})}
        if has_body:
            headers["Content-Type"] = "application/json"
        token = self._token() if callable(self._token) else self._token
        if auth and token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return headers


def _session(path: str, scope: TenantScope) -> str:
    _check_scope_ids(scope.tenant_id, scope.workspace_id, scope.session_id)
    return contract.fill(
        path,
        tenant_id=scope.tenant_id,
        workspace_id=scope.workspace_id,
        session_id=scope.session_id,
    )


def _workspace(path: str, tenant_id: str, workspace_id: str, **more: str) -> str:
    _check_scope_ids(tenant_id, workspace_id)
    return contract.fill(path, tenant_id=tenant_id, workspace_id=workspace_id, **more)


def _check_scope_ids(*ids: str) -> None:
    # Checked here too: an id like ".." would otherwise be resolved away by URL handling.
    if not all(is_scope_id(value) for value in ids):
        raise ValueError("a tenant, workspace or session id is not a scope id")


def _decision_params(filters: DecisionFilters) -> dict[str, str]:
    params: dict[str, str] = {}
    for name, value in filters.items():
        if isinstance(value, bool):
            params[name] = "true" if value else "false"
        elif isinstance(value, datetime):
            params[name] = value.isoformat()
        else:
            params[name] = str(value)
    return params


def _encode(body: BaseModel | Mapping[str, Any]) -> bytes:
    document = (
        body.model_dump(mode="json", exclude_none=True)
        if isinstance(body, BaseModel)
        else dict(body)
    )
    # NaN and Infinity are not JSON; the service would refuse them as malformed.
    return json.dumps(document, ensure_ascii=False, allow_nan=False).encode()


def _model(response: httpx.Response, model: type[M]) -> M:
    """The answer as model; `UnexpectedResponse` (without the body) when it is not one."""
    try:
        return model.model_validate_json(response.content)
    except (ValueError, KeyError, TypeError):  # a ValidationError's text may quote values
        raise _unexpected(response) from None


def _json_document(response: httpx.Response) -> Any:
    try:
        return json.loads(response.content)
    except ValueError:
        raise _unexpected(response) from None


def _json_line(response: httpx.Response, line: str) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    if not isinstance(event, dict):
        raise _unexpected(response)
    return event


def _unexpected(response: httpx.Response) -> UnexpectedResponse:
    return UnexpectedResponse(
        response.status_code,
        "response_not_in_contract",
        request_id=response.headers.get(contract.REQUEST_ID),
    )


def _transport_reason(error: httpx.TransportError) -> str:
    return "timeout" if isinstance(error, httpx.TimeoutException) else "connection_failed"
