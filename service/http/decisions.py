"""Decision log routes, for compliance reviewers: list, one entry, verify, export.

The `audit` policy decides who sees what: an auditor sees the entries whose
target is its own tenant. Reading the log is itself a decision, and is logged.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Literal

from flask import Blueprint, Response, request
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from service.auth import Actor
from service.decision_log import DecisionLogEntry, opa_event, seq_name
from service.decision_trace import DecisionTrace
from service.http.common import authenticate, context, decide, json_response
from service.http.problems import Problem
from service.policy_gate import PolicyGate
from service.policy_input import PolicyAction, PolicyTarget
from service.wire import DecisionEntryResponse, DecisionListResponse, DecisionVerifyResponse
from store.checkpoints import CheckpointSigner
from store.keys import TenantResourceLane
from store.scope import ScopeId
from store.violations import FieldViolation, violations_of

bp = Blueprint("decisions", __name__)
DECISION_ID_HEADER = "Sessionstate-Decision-Id"
MAX_LIMIT = 1000


class DecisionQuery(BaseModel):
    """Filters of the list and the export, from the query string."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    tenant_id: ScopeId | None = None
    action: PolicyAction | None = None
    allow: Literal["true", "false"] | None = None
    since: AwareDatetime | None = None
    until: AwareDatetime | None = None
    limit: int = Field(default=100, ge=1, le=MAX_LIMIT)
    cursor: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="next_cursor of the previous page; only cursors this service issued",
    )

    @field_validator("cursor")
    @classmethod
    def _cursor_is_ours(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                decode_cursor(value)
            except ValueError:
                raise PydanticCustomError(
                    "invalid_cursor", "not a cursor of this service"
                ) from None
        return value

    def after_seq(self) -> int:
        return 0 if self.cursor is None else decode_cursor(self.cursor)

    def matches(self, entry: dict[str, Any]) -> bool:
        decision = entry["decision"]
        if self.action is not None and decision["action"] != self.action:
            return False
        if self.allow is not None and decision["allow"] != (self.allow == "true"):
            return False
        evaluated = datetime.fromisoformat(decision["evaluated_at"])
        if self.since is not None and evaluated < self.since:
            return False
        return self.until is None or evaluated < self.until


def encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"after": seq}).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        document = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        after = document["after"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("not a cursor of this service") from None
    if not isinstance(after, int) or isinstance(after, bool) or after < 0:
        raise ValueError("not a cursor of this service")
    return after


def _query() -> DecisionQuery:
    try:
        return DecisionQuery.model_validate(request.args.to_dict())
    except ValidationError as error:
        raise Problem(
            422, "validation_failed", errors=violations_of(error, prefix=("query",))
        ) from None


def _audit(actor: Actor, query_tenant: str | None = None) -> tuple[DecisionTrace, str]:
    """Decide on the tenant an auditor asks about (its own by default)."""
    tenant = query_tenant or actor.tenant_id
    if tenant is None:  # a token without a tenant must name one to be judged on
        raise Problem(
            422, "validation_failed", errors=[FieldViolation(("query", "tenant_id"), "missing")]
        )
    trace = decide("decisions.read", actor, PolicyTarget(tenant_id=tenant))
    PolicyGate.enforce(trace)
    return trace, tenant


def tenant_entries(tenant: str, query: DecisionQuery) -> Iterator[dict[str, Any]]:
    """The tenant's entries after the cursor, in chain order, that pass the filters."""
    chain = context().journal.chain
    start = seq_name(query.after_seq() + 1)
    for key, _ in context().lanes.scan(TenantResourceLane.TRACE_INDEX, tenant):
        if key.name < start:
            continue
        entry = chain.get(int.from_bytes(key.name, "big"))
        if entry is not None and query.matches(entry):
            yield entry


@bp.get("/v1/decisions")
def list_decisions() -> Response:
    actor = authenticate()
    query = _query()
    trace, tenant = _audit(actor, query.tenant_id)
    page: list[dict[str, Any]] = []
    next_cursor = None
    for entry in tenant_entries(tenant, query):
        if len(page) == query.limit:
            next_cursor = encode_cursor(page[-1]["seq"])
            break
        page.append(entry)
    body = DecisionListResponse(
        decisions=[DecisionLogEntry.model_validate(entry) for entry in page],
        next_cursor=next_cursor,
        decision=trace,
    )
    return json_response(body)


@bp.get("/v1/decisions/verify")
def verify_decisions() -> Response:
    """Verify the whole chain, and hand out a signed checkpoint of its head to keep."""
    trace, _ = _audit(authenticate())
    result = context().journal.chain.verify()
    signer = CheckpointSigner.from_data_dir(context().settings.data_dir)
    checkpoint = signer.sign(context().journal.chain.head(), context().clock())
    return json_response(
        DecisionVerifyResponse(
            ok=result.ok,
            entries=result.entries,
            head_hash=result.head_hash,
            first_invalid_seq=result.first_invalid_seq,
            problem=result.problem,
            checkpoint=checkpoint,
            decision=trace,
        )
    )


@bp.get("/v1/decisions/export")
def export_decisions() -> Response:
    """NDJSON, one OPA-style decision log event a line, with our entry beside it."""
    actor = authenticate()
    query = _query()
    trace, tenant = _audit(actor, query.tenant_id)
    lines = [json.dumps(opa_event(entry)) + "\n" for entry in tenant_entries(tenant, query)]
    return Response(
        "".join(lines),
        mimetype="application/x-ndjson",
        headers={DECISION_ID_HEADER: trace.decision_id},
    )


@bp.get("/v1/decisions/<decision_id>")
def get_decision(decision_id: str) -> Response:
    actor = authenticate()
    entry = context().journal.find(decision_id) if len(decision_id) <= 64 else None
    tenant = entry["target"]["tenant_id"] if entry is not None else actor.tenant_id
    if tenant is None:
        raise Problem(404, "decision_not_found")
    trace = decide("decisions.read", actor, PolicyTarget(tenant_id=tenant))
    PolicyGate.enforce(trace)
    if entry is None:
        raise Problem(404, "decision_not_found", decision=trace)
    return json_response(
        DecisionEntryResponse(entry=DecisionLogEntry.model_validate(entry), decision=trace)
    )
