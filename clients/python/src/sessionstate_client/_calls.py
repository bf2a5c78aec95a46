"""Every endpoint as a `Call`: what to send and how to read the answer, without sending it.

The sync client (`client.py`) and the async one (`aio.py`) send the same
calls; only the sending differs. Successful answers are validated with the
response models; anything else becomes a typed exception (`errors.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, TypedDict, TypeVar
from urllib.parse import urlencode

import httpx
from pydantic import BaseModel

from sessionstate_client import contract
from sessionstate_client.errors import (
    ServiceUnavailable,
    SessionStateError,
    UnexpectedResponse,
    error_from_response,
)
from sessionstate_client.models import (
    ApprovalGrantInput,
    ApprovalListResponse,
    ApprovalResponse,
    DecisionEntryResponse,
    DecisionListResponse,
    DecisionVerifyResponse,
    Health,
    PolicyRevisionsResponse,
    Readiness,
    ReplayPreviewResponse,
    SessionListResponse,
    SessionStateInput,
    SessionStateReadResponse,
    SessionStateResponse,
    SessionVersionsResponse,
    TenantScope,
    TokenExchangeResponse,
    WorkspaceErasureResponse,
)
from sessionstate_client.retries import RetryPolicy, parse_retry_after, retried

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

StateBody = SessionStateInput | Mapping[str, Any]
"""A `SessionStateInput`, or the same as a JSON-ready mapping (the service validates it)."""
GrantBody = ApprovalGrantInput | Mapping[str, Any]
"""An `ApprovalGrantInput`, or the same as a JSON-ready mapping."""


class DecisionFilters(TypedDict, total=False):
    """Filters of the decision log listing and export (the query of `GET /v1/decisions`)."""

    tenant_id: str
    action: contract.PolicyAction
    allow: bool
    since: datetime | str
    until: datetime | str
    shadow: Literal["agree", "disagree"]
    order: Literal["asc", "desc"]  # oldest first (the default) or newest first


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request of the contract, and how its answer becomes `T`.

    `safe`: whether doing it twice does no more than once, so that it may be repeated after
    a connection failure or a 503 (`sessionstate_client.retries`).
    `retry_refusals`: whether a 429 or (if `safe`) a 503 is tried again at all.
    """

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    safe: bool = True
    content: bytes | None = None
    params: Mapping[str, str] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    auth: bool = True
    ok: tuple[int, ...] = (200, 201)
    retry_refusals: bool = True
    content_type: str = "application/json"


# --- session state, for model services ------------------------------------------------------


def preview_state(scope: TenantScope, state: StateBody) -> Call[SessionStateResponse]:
    path = _session(contract.STATE_PREVIEW, scope)
    return Call("POST", path, _reads(SessionStateResponse), content=_encode(state))


def put_state(
    scope: TenantScope, state: StateBody, if_match: str | None, if_none_match: bool
) -> Call[SessionStateResponse]:
    if if_match is not None and if_none_match:
        raise ValueError("send If-Match or If-None-Match, not both")
    headers = {}
    if if_match is not None:
        headers[contract.IF_MATCH] = _quoted(if_match)
    if if_none_match:
        headers[contract.IF_NONE_MATCH] = "*"
    return Call(
        "PUT",
        _session(contract.STATE, scope),
        _reads(SessionStateResponse),
        safe=bool(headers),
        content=_encode(state),
        headers=headers,
    )


def get_state(scope: TenantScope) -> Call[SessionStateReadResponse]:
    return Call("GET", _session(contract.STATE, scope), _reads(SessionStateReadResponse))


def versions(
    scope: TenantScope, limit: int | None, cursor: str | None
) -> Call[SessionVersionsResponse]:
    params = {} if limit is None else {"limit": str(limit)}
    if cursor is not None:
        params["cursor"] = cursor
    path = _session(contract.STATE_VERSIONS, scope)
    return Call("GET", path, _reads(SessionVersionsResponse), params=params)


def read_version(scope: TenantScope, version: int) -> Call[SessionStateReadResponse]:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError("a version is a whole number from 1")
    path = _session(contract.STATE_VERSION, scope, version=str(version))
    return Call("GET", path, _reads(SessionStateReadResponse))


def rewind(scope: TenantScope, to_version: int, if_match: str) -> Call[SessionStateResponse]:
    """Safe to repeat: a second rewind after the first landed fails its `If-Match` (412)."""
    headers = {contract.IF_MATCH: _quoted(if_match)}
    return Call(
        "POST",
        _session(contract.STATE_REWIND, scope),
        _reads(SessionStateResponse),
        content=_encode({"to_version": to_version}),
        headers=headers,
    )


def fork(
    scope: TenantScope, to_session_id: str, from_version: int | None
) -> Call[SessionStateResponse]:
    """Safe to repeat: a second fork after the first landed finds its target (409)."""
    body: dict[str, Any] = {"to_session_id": to_session_id}
    if from_version is not None:
        if isinstance(from_version, bool) or not isinstance(from_version, int) or from_version < 1:
            raise ValueError("a version is a whole number from 1")
        body["from_version"] = from_version
    path = _session(contract.FORK, scope)
    return Call("POST", path, _reads(SessionStateResponse), content=_encode(body), ok=(201,))


def replay_preview(scope: TenantScope, max_inputs: int | None) -> Call[ReplayPreviewResponse]:
    body = {} if max_inputs is None else {"max_inputs": max_inputs}
    path = _session(contract.REPLAY_PREVIEW, scope)
    return Call("POST", path, _reads(ReplayPreviewResponse), content=_encode(body))


def erase(scope: TenantScope, if_match: str | None) -> Call[str]:
    """`DELETE S/state`: safe to repeat (erasing nothing stored answers 204 too)."""
    headers = {} if if_match is None else {contract.IF_MATCH: _quoted(if_match)}
    path = _session(contract.STATE, scope)
    return Call("DELETE", path, _decision_id, headers=headers, ok=(204,))


# --- a workspace's sessions, for model services with a workspace's token and operators ----


def list_sessions(
    tenant_id: str, workspace_id: str, limit: int | None, cursor: str | None
) -> Call[SessionListResponse]:
    params = {} if limit is None else {"limit": str(limit)}
    if cursor is not None:
        params["cursor"] = cursor
    path = _workspace(contract.SESSIONS, tenant_id, workspace_id)
    return Call("GET", path, _reads(SessionListResponse), params=params)


def erase_workspace(tenant_id: str, workspace_id: str) -> Call[WorkspaceErasureResponse]:
    """`DELETE .../sessions`: safe to repeat, and a repeat finishes an interrupted one."""
    path = _workspace(contract.SESSIONS, tenant_id, workspace_id)
    return Call("DELETE", path, _reads(WorkspaceErasureResponse))


# --- session tokens, for model services serving many sessions -----------------------------

TOKEN_EXCHANGE_GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"  # noqa: S105 - a name
JWT_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:jwt"  # noqa: S105 - a token type's name


def exchange_token(subject_token: str, scope: TenantScope) -> Call[TokenExchangeResponse]:
    """`POST /v1/token`: the subject token (a workspace's service token) for a session's."""
    form = {
        "grant_type": TOKEN_EXCHANGE_GRANT,
        "subject_token": subject_token,
        "subject_token_type": JWT_TOKEN_TYPE,
        "resource": _session(contract.SESSION, scope),
    }
    return Call(
        "POST",
        contract.EXCHANGE,
        _reads(TokenExchangeResponse),
        content=urlencode(form).encode(),
        auth=False,  # the subject token is the credential, in the body
        content_type="application/x-www-form-urlencoded",
    )


# --- approvals, for operators ---------------------------------------------------------------


def grant_approval(tenant_id: str, workspace_id: str, grant: GrantBody) -> Call[ApprovalResponse]:
    path = _workspace(contract.APPROVALS, tenant_id, workspace_id)
    return Call(
        "POST", path, _reads(ApprovalResponse), safe=False, content=_encode(grant), ok=(201,)
    )


def list_approvals(tenant_id: str, workspace_id: str) -> Call[ApprovalListResponse]:
    path = _workspace(contract.APPROVALS, tenant_id, workspace_id)
    return Call("GET", path, _reads(ApprovalListResponse))


def revoke_approval(tenant_id: str, workspace_id: str, approval_id: str) -> Call[str]:
    path = _workspace(contract.APPROVAL, tenant_id, workspace_id, approval_id=approval_id)
    return Call("DELETE", path, _decision_id, ok=(204,))


# --- the decision log, for auditors ---------------------------------------------------------


def list_decisions(
    limit: int | None, cursor: str | None, filters: DecisionFilters
) -> Call[DecisionListResponse]:
    params = _decision_params(filters)
    if limit is not None:
        params["limit"] = str(limit)
    if cursor is not None:
        params["cursor"] = cursor
    return Call("GET", contract.DECISIONS, _reads(DecisionListResponse), params=params)


def get_decision(decision_id: str) -> Call[DecisionEntryResponse]:
    path = contract.fill(contract.DECISION, decision_id=decision_id)
    return Call("GET", path, _reads(DecisionEntryResponse))


def verify_decisions(full: bool) -> Call[DecisionVerifyResponse]:
    params = {"full": "true"} if full else {}
    return Call("GET", contract.DECISIONS_VERIFY, _reads(DecisionVerifyResponse), params=params)


def policy_revisions(tenant_id: str | None) -> Call[PolicyRevisionsResponse]:
    params = {} if tenant_id is None else {"tenant_id": tenant_id}
    path = contract.DECISIONS_REVISIONS
    return Call("GET", path, _reads(PolicyRevisionsResponse), params=params)


def export_decisions(filters: DecisionFilters) -> Call[httpx.Response]:
    """The export's answer, streamed: `export_lines` reads it."""
    params = _decision_params(filters)
    return Call("GET", contract.DECISIONS_EXPORT, _as_is, params=params)


# --- operations, for anyone -----------------------------------------------------------------


def healthz() -> Call[Health]:
    return Call("GET", contract.HEALTHZ, _reads(Health), auth=False)


def readyz() -> Call[Readiness]:
    """Readiness as reported: `ready` is False on a 503 answer, which is not retried."""
    return Call(
        "GET", contract.READYZ, _reads(Readiness), auth=False, ok=(200, 503), retry_refusals=False
    )


def metrics() -> Call[str]:
    return Call("GET", contract.METRICS, _text, auth=False)


def openapi() -> Call[dict[str, Any]]:
    return Call("GET", contract.OPENAPI, _document, auth=False)


# --- sending: what both clients share -------------------------------------------------------


def headers(call: Call[Any], request_id: str, token: str | None) -> dict[str, str]:
    """The headers of one attempt of call."""
    sent = {contract.REQUEST_ID: request_id, **call.headers}
    if call.content is not None:
        sent["Content-Type"] = call.content_type
    if call.auth and token is not None:
        sent["Authorization"] = f"Bearer {token}"
    return sent


def wait_after_answer(
    call: Call[Any], response: httpx.Response, attempt: int, policy: RetryPolicy
) -> float | None:
    """Seconds to wait before trying call again after this (read) error answer; None: raise."""
    if not call.retry_refusals or not retried(response.status_code, call.safe):
        return None
    retry_after = parse_retry_after(response.headers.get(contract.RETRY_AFTER))
    return policy.wait(attempt, retry_after)


def wait_after_failure(call: Call[Any], attempt: int, policy: RetryPolicy) -> float | None:
    """Seconds to wait before trying call again after a connection failure; None: raise."""
    return policy.wait(attempt) if call.safe else None


def failed(
    error: httpx.TransportError, request_id: str | None, attempts: int
) -> ServiceUnavailable:
    return ServiceUnavailable(
        None, transport_reason(error), request_id=request_id, attempts=attempts
    )


def refused(response: httpx.Response, attempts: int) -> SessionStateError:
    return error_from_response(response, attempts=attempts)


def transport_reason(error: httpx.TransportError) -> str:
    return "timeout" if isinstance(error, httpx.TimeoutException) else "connection_failed"


def export_event(response: httpx.Response, line: str) -> dict[str, Any] | None:
    """One line of the export as its event; None for a blank line."""
    if not line.strip():
        return None
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    if not isinstance(event, dict):
        raise unexpected(response)
    return event


def unexpected(response: httpx.Response) -> UnexpectedResponse:
    """The service answered outside the contract (the body is never quoted)."""
    return UnexpectedResponse(
        response.status_code,
        "response_not_in_contract",
        request_id=response.headers.get(contract.REQUEST_ID),
    )


# --- helpers --------------------------------------------------------------------------------


def _session(path: str, scope: TenantScope, **more: str) -> str:
    _check_scope_ids(scope.tenant_id, scope.workspace_id, scope.session_id)
    return contract.fill(
        path,
        tenant_id=scope.tenant_id,
        workspace_id=scope.workspace_id,
        session_id=scope.session_id,
        **more,
    )


def _quoted(if_match: str) -> str:
    """A state digest as `If-Match` sends it: quoted (an ETag as answered is already)."""
    return if_match if if_match.startswith('"') else f'"{if_match}"'


def _workspace(path: str, tenant_id: str, workspace_id: str, **more: str) -> str:
    _check_scope_ids(tenant_id, workspace_id)
    return contract.fill(path, tenant_id=tenant_id, workspace_id=workspace_id, **more)


def _check_scope_ids(*ids: str) -> None:
    # Checked here too: an id like ".." would otherwise be resolved away by URL handling.
    if not all(contract.is_scope_id(value) for value in ids):
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
        body.model_dump(mode="json", exclude_none=True, by_alias=True)
        if isinstance(body, BaseModel)
        else dict(body)
    )
    # NaN and Infinity are not JSON; the service would refuse them as malformed.
    return json.dumps(document, ensure_ascii=False, allow_nan=False).encode()


def _reads(model: type[M]) -> Callable[[httpx.Response], M]:
    def parse(response: httpx.Response) -> M:
        try:
            return model.model_validate_json(response.content)
        except (ValueError, KeyError, TypeError):  # a ValidationError's text may quote values
            raise unexpected(response) from None

    return parse


def _decision_id(response: httpx.Response) -> str:
    decision_id = response.headers.get(contract.DECISION_ID_HEADER, "")
    if not decision_id:
        raise unexpected(response)
    return str(decision_id)


def _text(response: httpx.Response) -> str:
    return response.text


def _as_is(response: httpx.Response) -> httpx.Response:
    return response


def _document(response: httpx.Response) -> dict[str, Any]:
    try:
        document = json.loads(response.content)
    except ValueError:
        raise unexpected(response) from None
    if not isinstance(document, dict):
        raise unexpected(response)
    return document
