"""Decision log routes, for compliance reviewers: list, one entry, verify, export.

The `audit` policy decides who sees what: an auditor sees the entries whose
target is its own tenant. Reading the log is itself a decision, and is logged.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Literal

from flask import Blueprint, Response, request
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from service.auth import Actor
from service.decisions.log import DecisionLogEntry, opa_event, seq_name
from service.http.common import authenticate, context, decide, json_response
from service.http.problems import Problem
from service.policy.gate import PolicyGate
from service.policy.input import PolicyAction, PolicyTarget
from service.policy.trace import DecisionTrace
from service.wire import DecisionEntryResponse, DecisionListResponse, DecisionVerifyResponse
from store.checkpoints import CheckpointSigner
from store.keys import TenantResourceLane
from store.scope import ScopeId
from store.signed_head import verified_checkpoint
from store.violations import UNKNOWN_PARAMETER, FieldViolation, violations_of

bp = Blueprint("decisions", __name__)
log = logging.getLogger("sessionstate.decisions")
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

    def window(self) -> tuple[int, int | None]:
        """The seqs a page may show: after the cursor, up to the head the first page saw."""
        return (0, None) if self.cursor is None else decode_cursor(self.cursor)

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


def encode_cursor(after: int, until: int) -> str:
    """Where the next page starts, and the head the first page saw (reading the log adds
    to it, so without a fixed end a reader following cursors would never finish)."""
    document = json.dumps({"after": after, "until": until}).encode()
    return base64.urlsafe_b64encode(document).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, int]:
    try:
        document = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        after, until = document["after"], document["until"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("not a cursor of this service") from None
    for value in (after, until):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError("not a cursor of this service")
    return after, until


def _query() -> DecisionQuery:
    try:
        return DecisionQuery.model_validate(request.args.to_dict())
    except ValidationError as error:
        # An unknown parameter is reported as one, never by its name.
        violations = violations_of(
            error, DecisionQuery, prefix=("query",), unknown=UNKNOWN_PARAMETER
        )
        raise Problem(422, "validation_failed", errors=violations) from None


def audit_decision(actor: Actor, query_tenant: str | None = None) -> tuple[DecisionTrace, str]:
    """Decide on the tenant an auditor asks about (its own by default)."""
    tenant = query_tenant or actor.tenant_id
    if tenant is None:  # a token without a tenant must name one to be judged on
        raise Problem(
            422, "validation_failed", errors=[FieldViolation(("query", "tenant_id"), "missing")]
        )
    trace = decide("decisions.read", actor, PolicyTarget(tenant_id=tenant))
    PolicyGate.enforce(trace)
    return trace, tenant


def tenant_entries(
    tenant: str, query: DecisionQuery, until: int | None = None
) -> Iterator[dict[str, Any]]:
    """The tenant's entries in the query's window, in chain order, that pass the filters."""
    chain = context().journal.chain
    after, cursor_until = query.window()
    until = cursor_until if until is None else until
    start = seq_name(after + 1)
    for key, _ in context().lanes.scan(TenantResourceLane.TRACE_INDEX, tenant):
        if key.name < start:
            continue
        seq = int.from_bytes(key.name, "big")
        if until is not None and seq > until:
            return
        entry = _readable(chain.get(seq), seq)
        if entry is not None and query.matches(entry):
            yield entry


def _readable(entry: dict[str, Any] | None, seq: int) -> dict[str, Any] | None:
    """An entry that has the shape of one, else None: a listing shows what it can,
    and `verify` (shown beside every listing in the UI) names what was tampered with."""
    if entry is None:
        return None
    try:
        DecisionLogEntry.model_validate(entry)
    except ValidationError:
        log.warning("unreadable_decision_entry", extra={"seq": seq})
        return None
    return entry


def tenant_page(tenant: str, query: DecisionQuery) -> tuple[list[dict[str, Any]], str | None]:
    """One page of the tenant's entries, and the cursor of the next (None at the end)."""
    cursor_until = query.window()[1]
    until = context().journal.head.seq if cursor_until is None else cursor_until
    page: list[dict[str, Any]] = []
    for entry in tenant_entries(tenant, query, until):
        if len(page) == query.limit:
            return page, encode_cursor(page[-1]["seq"], until)
        page.append(entry)
    return page, None


def decision_entry(actor: Actor, decision_id: str) -> tuple[DecisionTrace, dict[str, Any]]:
    """One entry, decided on the tenant it is about; 404 or 403 problems otherwise."""
    entry = context().journal.find(decision_id) if len(decision_id) <= 64 else None
    tenant = entry["target"]["tenant_id"] if entry is not None else actor.tenant_id
    if tenant is None:
        raise Problem(404, "decision_not_found")
    trace = decide("decisions.read", actor, PolicyTarget(tenant_id=tenant))
    PolicyGate.enforce(trace)
    if entry is None:
        raise Problem(404, "decision_not_found", decision=trace)
    return trace, entry


@bp.get("/v1/decisions")
def list_decisions() -> Response:
    actor = authenticate()
    query = _query()
    trace, tenant = audit_decision(actor, query.tenant_id)
    page, next_cursor = tenant_page(tenant, query)
    body = DecisionListResponse(
        decisions=[DecisionLogEntry.model_validate(entry) for entry in page],
        next_cursor=next_cursor,
        decision=trace,
    )
    return json_response(body)


@bp.get("/v1/decisions/verify")
def verify_decisions() -> Response:
    """Verify the whole chain; when it holds, hand out a signed checkpoint of that head."""
    trace, _ = audit_decision(authenticate())
    data_dir = context().settings.data_dir
    # A checkpoint vouches for a head that verified; a broken chain gets none.
    result, checkpoint = verified_checkpoint(context().journal.chain, data_dir, context().clock())
    signer = CheckpointSigner.from_data_dir(data_dir)
    return json_response(
        DecisionVerifyResponse(
            ok=result.ok,
            entries=result.entries,
            head_hash=result.head_hash,
            first_invalid_seq=result.first_invalid_seq,
            problem=result.problem,
            checkpoint=checkpoint,
            checkpoint_public_key=signer.public_key_pem.decode("ascii"),
            decision=trace,
        )
    )


@bp.get("/v1/decisions/export")
def export_decisions() -> Response:
    """NDJSON, one OPA-style decision log event a line, with our entry beside it."""
    actor = authenticate()
    query = _query()
    trace, tenant = audit_decision(actor, query.tenant_id)
    lines = [json.dumps(opa_event(entry)) + "\n" for entry in tenant_entries(tenant, query)]
    return Response(
        "".join(lines),
        mimetype="application/x-ndjson",
        headers={DECISION_ID_HEADER: trace.decision_id},
    )


@bp.get("/v1/decisions/<decision_id>")
def get_decision(decision_id: str) -> Response:
    trace, entry = decision_entry(authenticate(), decision_id)
    return json_response(
        DecisionEntryResponse(entry=DecisionLogEntry.model_validate(entry), decision=trace)
    )
