"""The OpenAPI 3.1 document, generated from the pydantic wire models.

Paths are a table of operations (method, path, models in and out) over the
contract's path templates (`service.api.v1`, which the routes use too); every
schema comes from `models_json_schema`, so a renamed field changes the
document with it.
"""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from service.api.fork_requests import ForkRequest
from service.api.reasons import Reason
from service.api.v1 import (
    APPROVAL,
    APPROVALS,
    DECISION,
    DECISION_ID_HEADER,
    DECISION_INCLUSION,
    DECISIONS,
    DECISIONS_CHECKPOINT,
    DECISIONS_CHECKPOINT_TIMESTAMP,
    DECISIONS_CONSISTENCY,
    DECISIONS_EXPORT,
    DECISIONS_LOG_KEY,
    DECISIONS_REVISIONS,
    DECISIONS_VERIFY,
    EXCHANGE,
    FORK,
    HEALTHZ,
    IF_MATCH,
    JWKS,
    METRICS,
    NEXT_CURSOR_HEADER,
    PATH_SCHEMAS,
    READYZ,
    REPLAY_PREVIEW,
    RETRY_AFTER,
    SESSIONS,
    STATE,
    STATE_PREVIEW,
    STATE_REWIND,
    STATE_VERSION,
    STATE_VERSIONS,
    parameters,
)
from service.api.version_requests import RewindRequest, VersionsQuery
from service.api.wire import (
    ApprovalListResponse,
    ApprovalResponse,
    ConsistencyProofResponse,
    DecisionEntryResponse,
    DecisionListResponse,
    DecisionVerifyResponse,
    Health,
    InclusionProofResponse,
    PolicyRevisionsResponse,
    ProblemDocument,
    Readiness,
    ReplayPreviewResponse,
    SessionListResponse,
    SessionStateReadResponse,
    SessionStateResponse,
    SessionVersionsResponse,
    WorkspaceErasureResponse,
)
from service.approvals.model import ApprovalGrantInput
from service.auth.session_tokens import JsonWebKeySet
from service.auth.token_exchange import (
    FORM,
    TokenErrorDocument,
    TokenExchangeRequest,
    TokenExchangeResponse,
)
from service.decisions.query import (
    CheckpointNoteQuery,
    CheckpointQuery,
    ConsistencyQuery,
    DecisionQuery,
    InclusionQuery,
    RevisionsQuery,
    VerifyQuery,
)
from service.replay import ReplayPreviewRequest
from service.session_list import SessionListQuery
from store.digests import DIGEST_PATTERN
from store.record.inputs import SessionStateInput

REF = "#/components/schemas/{model}"
TEXT = "text/plain; charset=utf-8"
TIMESTAMP_REPLY = "application/timestamp-reply"


class Operation(NamedTuple):
    method: str
    path: str
    tag: str
    summary: str
    body: type[BaseModel] | None = None
    status: int = 200
    out: type[BaseModel] | None = None
    errors: tuple[int, ...] = ()
    query: type[BaseModel] | None = None
    media: str = "application/json"
    body_media: str = "application/json"
    headers: tuple[str, ...] = ()  # request headers the operation requires (`HEADERS`)


RATE_LIMIT_RETRY_AFTER = {
    "required": True,
    "description": "seconds until the actor's budget has room again",
    "schema": {"type": "integer", "minimum": 1},
}
UNAVAILABLE = (
    f"problem details (RFC 9457); nothing was done. `reason`: `{Reason.POLICY_ENGINE_UNAVAILABLE}` "
    f"(OPA did not answer in time), `{Reason.POLICY_ENGINE_REFUSED}` (OPA refused the service's "
    f"token), `{Reason.DECISION_LOG_UNAVAILABLE}` or `{Reason.STORE_UNAVAILABLE}`; except "
    f"`{Reason.STORE_OUTCOME_UNKNOWN}`: the store's commit was cut off, so the request may "
    f"have been stored (wholly, with its decision); `{DECISION_ID_HEADER}` names the decision "
    "to look up"
)
# A required request header's schema, by name.
HEADERS: dict[str, dict[str, Any]] = {
    IF_MATCH: {
        "description": "the current record's ETag: its state digest, quoted",
        "schema": {"type": "string", "pattern": '^"' + DIGEST_PATTERN.strip("^$") + '"$'},
    },
}
AUTHED = (400, 401, 403, 429, 503)  # 429: rate_limited, before any policy call
WITH_BODY = (413, 415, 422)

OPERATIONS = [
    Operation("post", STATE_PREVIEW, "state", "Preview the sanitized record and what a write would do; never writes", SessionStateInput, 200, SessionStateResponse, AUTHED + WITH_BODY),
    Operation("put", STATE, "state", "Write the sanitized record (201 created, 200 replaced)", SessionStateInput, 201, SessionStateResponse, (*AUTHED, 412, *WITH_BODY)),
    Operation("get", STATE, "state", "Read the stored record; a corrupt one fails closed", None, 200, SessionStateReadResponse, (*AUTHED, 404)),
    Operation("get", STATE_VERSIONS, "state", "List the session's versions, newest first", None, 200, SessionVersionsResponse, (*AUTHED, 404, 422), VersionsQuery),
    Operation("get", STATE_VERSION, "state", "Read one kept version of the record, as the current one is read", None, 200, SessionStateReadResponse, (*AUTHED, 404)),
    Operation("post", STATE_REWIND, "state", "Write a kept version's record as the session's next version (If-Match required)", RewindRequest, 200, SessionStateResponse, (*AUTHED, 404, 409, 412, 428, *WITH_BODY), headers=(IF_MATCH,)),
    Operation("post", FORK, "sessions", "Create a session of the same workspace from a version of this one, with its lineage (201; 409 if the target holds a record)", ForkRequest, 201, SessionStateResponse, (*AUTHED, 404, 409, 412, *WITH_BODY)),
    Operation("post", REPLAY_PREVIEW, "state", "Replay inputs from digests and anchors, without raw payloads", ReplayPreviewRequest, 200, ReplayPreviewResponse, (*AUTHED, 404, *WITH_BODY)),
    Operation("delete", STATE, "sessions", "Erase the session's state and all its versions; the decision's entry is the erasure's receipt (204 also when nothing is stored)", None, 204, None, (*AUTHED, 412)),
    Operation("get", SESSIONS, "sessions", "List the workspace's stored sessions, in session-id order: versions and digests, no content", None, 200, SessionListResponse, (*AUTHED, 422), SessionListQuery),
    Operation("delete", SESSIONS, "workspaces", "Erase every session of the workspace, each with its own receipt; a repeat finishes an interrupted one", None, 200, WorkspaceErasureResponse, AUTHED),
    Operation("post", APPROVALS, "approvals", "Grant a durable-write approval", ApprovalGrantInput, 201, ApprovalResponse, AUTHED + WITH_BODY),
    Operation("get", APPROVALS, "approvals", "List active approvals", None, 200, ApprovalListResponse, AUTHED),
    Operation("delete", APPROVAL, "approvals", "Revoke an approval at once", None, 204, None, (*AUTHED, 404)),
    Operation("get", DECISIONS, "decisions", "List the decision log of the auditor's tenant, oldest (or newest) first, each entry as stored", None, 200, DecisionListResponse, (*AUTHED, 422), DecisionQuery),
    Operation("get", DECISIONS_VERIFY, "decisions", "Verify the hash chain; get a signed checkpoint of its head", None, 200, DecisionVerifyResponse, (*AUTHED, 422), VerifyQuery),
    Operation("get", DECISIONS_EXPORT, "decisions", "Export entries as NDJSON in OPA's decision log field names", None, 200, None, (*AUTHED, 422), DecisionQuery, "application/x-ndjson"),
    Operation("get", DECISIONS_REVISIONS, "decisions", "Which policy revisions were live when, and what each decided for the tenant: live intervals, first and last decision, counts by action, failed decisions", None, 200, PolicyRevisionsResponse, (*AUTHED, 422), RevisionsQuery),
    Operation("get", DECISIONS_CHECKPOINT, "decisions", "The tenant's checkpoint note (C2SP tlog-checkpoint, an Ed25519 signed note), the latest signed when the chain grew and verified (409 for a broken chain); with witnesses, the newest the quorum cosigned (else the latest), their cosignature lines appended, and `Sessionstate-Witnessed: <cosignatures>/<quorum>`; with a TSA (`SESSIONSTATE_TSA_URL`), the newest such note a kept RFC 3161 timestamp covers (while none is, as without); `tree_size`: the kept note of that size (404 when none is)", None, 200, None, (*AUTHED, 404, 409, 422), CheckpointNoteQuery, TEXT),
    Operation("get", DECISIONS_CHECKPOINT_TIMESTAMP, "decisions", "The RFC 3161 `TimeStampResp` (DER) a time-stamping authority (`SESSIONSTATE_TSA_URL`) answered over the signed text (origin, size and root lines) of the checkpoint note `GET /v1/decisions/checkpoint` serves now (with a TSA, the newest note timestamped); `tree_size`: the kept note of that size; 404 when no timestamp covering it is kept. Check it with `openssl ts -verify -data <signed text> -in <reply> -CAfile <the TSA's CA>`", None, 200, None, (*AUTHED, 404, 409, 422), CheckpointNoteQuery, TIMESTAMP_REPLY),
    Operation("get", DECISIONS_LOG_KEY, "decisions", "The checkpoint notes' verifier key (`<name>+<hex id>+<base64 key>`, Go's sumdb/note form)", None, 200, None, (*AUTHED, 422), CheckpointQuery, TEXT),
    Operation("get", DECISIONS_CONSISTENCY, "decisions", "An RFC 9162 consistency proof between two tree sizes the checkpoint notes signed", None, 200, ConsistencyProofResponse, (*AUTHED, 409, 410, 422), ConsistencyQuery),
    Operation("get", DECISION, "decisions", "One decision log entry", None, 200, DecisionEntryResponse, (*AUTHED, 404, 422)),
    Operation("get", DECISION_INCLUSION, "decisions", "An RFC 9162 inclusion proof of one entry in a tree the checkpoint notes signed", None, 200, InclusionProofResponse, (*AUTHED, 404, 409, 422), InclusionQuery),
    Operation("post", EXCHANGE, "token", "Exchange a model service's workspace token for a session token (OAuth 2.0 Token Exchange, RFC 8693)", TokenExchangeRequest, 200, TokenExchangeResponse, (400, 405, 413, 429, 503), body_media=FORM),
    Operation("get", JWKS, "ops", "The public keys of the session tokens the service issues (JWKS)", None, 200, JsonWebKeySet),
    Operation("get", HEALTHZ, "ops", "Liveness", None, 200, Health),
    Operation("get", READYZ, "ops", "Readiness: OPA answers with a loaded policy, store open", None, 200, Readiness, (503,)),
]  # fmt: skip


@cache
def openapi_document() -> dict[str, Any]:
    requests = {op.body for op in OPERATIONS if op.body is not None}
    errors: set[type[BaseModel]] = {ProblemDocument, TokenErrorDocument}
    responses = {op.out for op in OPERATIONS if op.out is not None} | errors
    refs, schemas = models_json_schema(
        [(model, "validation") for model in sorted(requests, key=str)]
        + [(model, "serialization") for model in sorted(responses, key=str)],
        ref_template=REF,
    )
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op, refs)
    paths[METRICS] = {"get": {"tags": ["ops"], "summary": "Prometheus metrics", "responses": {"200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}}}}  # fmt: skip
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sessionstate",
            "version": "1",
            "description": "Policy-governed sanitized session state for model services. "
            "Every authorised response carries the policy `decision` that governed it. "
            "Every response but this document and `/docs` carries `Cache-Control: no-store`.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
            },
        },
    }


def _operation(op: Operation, refs: dict[Any, Any]) -> dict[str, Any]:
    listed = [_path_parameter(name) for name in parameters(op.path)]
    listed += [
        {"name": name, "in": "header", "required": True, **HEADERS[name]} for name in op.headers
    ]
    if op.query is not None:
        listed += _query_parameters(op.query)
    operation: dict[str, Any] = {
        "tags": [op.tag],
        "summary": op.summary,
        "operationId": f"{op.method}_{op.path}".replace("/", "_").replace("{", "").replace("}", ""),
        "parameters": listed,
        "responses": {str(op.status): _success(op, refs)},
    }
    if op.body is not None:
        operation["requestBody"] = {
            "required": op.body is not ReplayPreviewRequest,
            "content": {op.body_media: {"schema": refs[(op.body, "validation")]}},
        }
    if op.tag not in ("ops", "token"):  # the token endpoint's credential is in its body
        operation["security"] = [{"bearer": []}]
    for error in op.errors:
        operation["responses"][str(error)] = (
            _token_error(refs)
            if op.tag == "token"
            else {
                "description": "problem details (RFC 9457) with a machine-readable `reason`",
                "content": {
                    "application/problem+json": {"schema": refs[(ProblemDocument, "serialization")]}
                },
            }
        )
        if error == 429:
            operation["responses"]["429"]["headers"] = {RETRY_AFTER: RATE_LIMIT_RETRY_AFTER}
        if error == 503 and op.tag != "ops":
            operation["responses"]["503"]["description"] = UNAVAILABLE
    return operation


def _token_error(refs: dict[Any, Any]) -> dict[str, Any]:
    return {
        "description": "an OAuth error (RFC 6749 section 5.2: `error`) that is a problem "
        "document too, with the decision when the policy was asked",
        "content": {"application/json": {"schema": refs[(TokenErrorDocument, "serialization")]}},
    }


def _path_parameter(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": dict(PATH_SCHEMAS[name]),
    }


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """The query model's fields as parameters; those without a default are required."""
    schema = model.model_json_schema()
    needed = set(schema.get("required", ()))
    return [
        {"name": name, "in": "query", "required": name in needed, "schema": _plain(prop)}
        for name, prop in schema["properties"].items()
    ]


def _plain(prop: dict[str, Any]) -> dict[str, Any]:
    """A query parameter's schema: `X | None` is just X (absent means unset)."""
    options = [option for option in prop.get("anyOf", []) if option != {"type": "null"}]
    kept = options[0] if len(options) == 1 else {k: v for k, v in prop.items() if k != "anyOf"}
    return {k: v for k, v in kept.items() if k not in {"title", "default"}} or {"type": "string"}


def _success(op: Operation, refs: dict[Any, Any]) -> dict[str, Any]:
    if op.media == "application/x-ndjson":
        return {
            "description": f"one JSON event a line; the governing decision's id is in `{DECISION_ID_HEADER}`; with `limit`, one page, and the next page's cursor in `{NEXT_CURSOR_HEADER}` (absent on the last)",
            "content": {op.media: {"schema": {"type": "string"}}},
        }
    if op.media == TIMESTAMP_REPLY:
        return {
            "description": f"DER bytes; the governing decision's id is in `{DECISION_ID_HEADER}`",
            "content": {op.media: {"schema": {"type": "string", "format": "binary"}}},
        }
    if op.media == TEXT:
        return {
            "description": f"text; the governing decision's id is in `{DECISION_ID_HEADER}`",
            "content": {op.media: {"schema": {"type": "string"}}},
        }
    if op.out is None:
        return {"description": f"done; the governing decision's id is in `{DECISION_ID_HEADER}`"}
    doc = op.out.__doc__
    return {
        "description": doc.strip().splitlines()[0] if doc else op.out.__name__,
        "content": {"application/json": {"schema": refs[(op.out, "serialization")]}},
    }
