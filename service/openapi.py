"""The OpenAPI 3.1 document, generated from the pydantic wire models.

Paths are a table of (method, path, model in, model out); every schema comes
from `models_json_schema`, so a renamed field changes the document with it.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from service.approvals import ApprovalGrantInput
from service.replay import ReplayPreviewRequest
from service.wire import (
    ApprovalListResponse,
    ApprovalResponse,
    Health,
    ProblemDocument,
    Readiness,
    ReplayPreviewResponse,
    SessionStateReadResponse,
    SessionStateResponse,
)
from store.inputs import SessionStateInput
from store.scope import SCOPE_ID_PATTERN

SESSION = "/v1/tenants/{tenant_id}/workspaces/{workspace_id}/sessions/{session_id}"
WORKSPACE = "/v1/tenants/{tenant_id}/workspaces/{workspace_id}"
REF = "#/components/schemas/{model}"

Audience = Literal["state", "approvals", "ops"]

# method, path, tag, summary, request model, success status, success model, error statuses
OPERATIONS: list[tuple[str, str, Audience, str, type[BaseModel] | None, int, type[BaseModel] | None, tuple[int, ...]]] = [
    ("post", SESSION + "/state/preview", "state", "Preview the sanitized record and what a write would do; never writes", SessionStateInput, 200, SessionStateResponse, (400, 401, 403, 413, 415, 422, 503)),
    ("put", SESSION + "/state", "state", "Write the sanitized record (201 created, 200 replaced)", SessionStateInput, 201, SessionStateResponse, (400, 401, 403, 412, 413, 415, 422, 503)),
    ("get", SESSION + "/state", "state", "Read the stored record; a corrupt one fails closed", None, 200, SessionStateReadResponse, (400, 401, 403, 404, 503)),
    ("post", SESSION + "/replay-preview", "state", "Replay inputs from digests and anchors, without raw payloads", ReplayPreviewRequest, 200, ReplayPreviewResponse, (400, 401, 403, 404, 413, 415, 422, 503)),
    ("post", WORKSPACE + "/approvals", "approvals", "Grant a durable-write approval", ApprovalGrantInput, 201, ApprovalResponse, (400, 401, 403, 413, 415, 422, 503)),
    ("get", WORKSPACE + "/approvals", "approvals", "List active approvals", None, 200, ApprovalListResponse, (400, 401, 403, 503)),
    ("delete", WORKSPACE + "/approvals/{approval_id}", "approvals", "Revoke an approval at once", None, 204, None, (400, 401, 403, 404, 503)),
    ("get", "/healthz", "ops", "Liveness", None, 200, Health, ()),
    ("get", "/readyz", "ops", "Readiness: OPA answers with a loaded policy, store open", None, 200, Readiness, (503,)),
]  # fmt: skip

MODELS: list[type[BaseModel]] = [
    SessionStateInput,
    ReplayPreviewRequest,
    ApprovalGrantInput,
    SessionStateResponse,
    SessionStateReadResponse,
    ReplayPreviewResponse,
    ApprovalResponse,
    ApprovalListResponse,
    Health,
    Readiness,
    ProblemDocument,
]
_REQUESTS = {SessionStateInput, ReplayPreviewRequest, ApprovalGrantInput}


@cache
def openapi_document() -> dict[str, Any]:
    refs, schemas = models_json_schema(
        [(model, "validation" if model in _REQUESTS else "serialization") for model in MODELS],
        ref_template=REF,
    )
    paths: dict[str, dict[str, Any]] = {}
    for method, path, tag, summary, body, status, out, errors in OPERATIONS:
        operation: dict[str, Any] = {
            "tags": [tag],
            "summary": summary,
            "operationId": f"{method}_{path}".replace("/", "_").replace("{", "").replace("}", ""),
            "parameters": [_path_parameter(name) for name in _path_names(path)],
            "responses": {str(status): _response(out, refs)},
        }
        if body is not None:
            operation["requestBody"] = {
                "required": body is not ReplayPreviewRequest,
                "content": {"application/json": {"schema": refs[(body, "validation")]}},
            }
        if tag != "ops":
            operation["security"] = [{"bearer": []}]
        for error in errors:
            operation["responses"][str(error)] = {
                "description": "problem details (RFC 9457) with a machine-readable `reason`",
                "content": {
                    "application/problem+json": {"schema": refs[(ProblemDocument, "serialization")]}
                },
            }
        paths.setdefault(path, {})[method] = operation
    paths["/metrics"] = {"get": {"tags": ["ops"], "summary": "Prometheus metrics", "responses": {"200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}}}}  # fmt: skip
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sessionstate",
            "version": "1",
            "description": "Policy-governed sanitized session state for model services. "
            "Every authorised response carries the policy `decision` that governed it.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
            },
        },
    }


def _path_names(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


def _path_parameter(name: str) -> dict[str, Any]:
    pattern = r"^appr_[0-9a-f]{24}$" if name == "approval_id" else SCOPE_ID_PATTERN
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": pattern},
    }


def _response(model: type[BaseModel] | None, refs: dict[Any, Any]) -> dict[str, Any]:
    if model is None:
        return {"description": "done; the governing decision's id is in `Sessionstate-Decision-Id`"}
    return {
        "description": model.__doc__.strip().splitlines()[0] if model.__doc__ else model.__name__,
        "content": {"application/json": {"schema": refs[(model, "serialization")]}},
    }
