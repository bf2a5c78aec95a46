"""Session state routes, for model services: preview, write, read, replay preview."""

from __future__ import annotations

import re

from flask import Blueprint, Response, request

from service.http.body import json_body
from service.http.common import (
    authenticate,
    context,
    decide,
    journal_write,
    json_response,
    session_scope,
    target_of,
)
from service.http.problems import Problem
from service.policy.gate import PolicyGate
from service.replay import ReplayPreviewRequest
from service.wire import ReplayPreviewResponse, SessionStateReadResponse, SessionStateResponse
from store.builder import build_record
from store.digests import is_digest
from store.inputs import SessionStateInput
from store.record import SessionStateRecord
from store.reports import SessionStateWriteReport
from store.scope import TenantScope
from store.session_state import Precondition, StoredVersion, state_key
from store.validation import record_blockers
from store.violations import InputRejected

bp = Blueprint("state", __name__)
SESSION = "/v1/tenants/<tenant_id>/workspaces/<workspace_id>/sessions/<session_id>"
_QUOTED = re.compile(r'^"([^"]*)"$')


@bp.post(SESSION + "/state/preview")
def preview_state(tenant_id: str, workspace_id: str, session_id: str) -> Response:
    """Build the sanitized record and say what a write would do; never writes."""
    actor = authenticate()
    scope = session_scope(tenant_id, workspace_id, session_id)
    record, _ = _record_from_body(scope)
    approval = context().approvals.covering(scope, context().clock())
    trace = decide("preview", actor, target_of(scope), record=record, approval=approval)
    report = _write_report(scope, applied=False, requested=False, blocked=trace.reasons)
    PolicyGate.enforce(trace, write_report=report)
    return json_response(SessionStateResponse(record=record, write_report=report, decision=trace))


@bp.put(SESSION + "/state")
def put_state(tenant_id: str, workspace_id: str, session_id: str) -> Response:
    """Write the sanitized record durably, if the policy and the preconditions allow."""
    actor = authenticate()
    scope = session_scope(tenant_id, workspace_id, session_id)
    precondition = _precondition()
    record, base = _record_from_body(scope)
    approval = context().approvals.covering(scope, context().clock())
    trace = decide("write", actor, target_of(scope), record=record, approval=approval)
    PolicyGate.enforce(
        trace,
        write_report=_write_report(scope, applied=False, requested=True, blocked=trace.reasons),
    )
    blockers = [str(blocker) for blocker in record_blockers(record)]
    if blockers:  # the store's own gate, whatever a policy edit allows
        report = _write_report(scope, applied=False, requested=True, blocked=blockers)
        raise Problem(403, blockers[0], decision=trace, write_report=report)
    written = journal_write(record, precondition.extending(record, base))
    if not written.applied:
        report = _write_report(
            scope, applied=False, requested=True, blocked=["precondition_failed"]
        )
        raise Problem(412, "precondition_failed", decision=trace, write_report=report)
    report = _write_report(scope, applied=True, requested=True, blocked=[])
    response = json_response(
        SessionStateResponse(record=record, write_report=report, decision=trace),
        201 if written.created else 200,
    )
    response.headers["ETag"] = f'"{record.state_digest}"'
    return response


@bp.get(SESSION + "/state")
def get_state(tenant_id: str, workspace_id: str, session_id: str) -> Response:
    """The stored record, or a corrupt read report that fails closed."""
    actor = authenticate()
    scope = session_scope(tenant_id, workspace_id, session_id)
    trace = decide("read", actor, target_of(scope))
    PolicyGate.enforce(trace)
    report = context().states.read(scope)
    if report is None:
        raise Problem(404, "session_state_not_found", decision=trace)
    if report.redacted_error is not None:
        context().metrics.corrupt_reads.labels(report.redacted_error.value).inc()
    response = json_response(SessionStateReadResponse(read_report=report, decision=trace))
    if report.record is not None:
        response.headers["ETag"] = f'"{report.record.state_digest}"'
    return response


@bp.post(SESSION + "/replay-preview")
def replay_preview(tenant_id: str, workspace_id: str, session_id: str) -> Response:
    """Replay inputs from digests and anchors; no inputs at all when denied or corrupt."""
    actor = authenticate()
    scope = session_scope(tenant_id, workspace_id, session_id)
    ask = json_body(ReplayPreviewRequest, optional=True)
    trace = decide("replay", actor, target_of(scope))
    PolicyGate.enforce(trace)
    report = context().states.read(scope)
    if report is None:
        raise Problem(404, "session_state_not_found", decision=trace)
    planner = context().planner
    if report.record is None:
        label = report.redacted_error.value if report.redacted_error else "session_state_corrupt"
        context().metrics.corrupt_reads.labels(label).inc()
        preview = planner.blocked([label])
    else:
        preview = planner.preview(report.record, ask.max_inputs)
    return json_response(ReplayPreviewResponse(preview=preview, decision=trace))


def _record_from_body(scope: TenantScope) -> tuple[SessionStateRecord, StoredVersion]:
    """The record the body makes over the stored version: its summary, extended by the overflow."""
    state = json_body(SessionStateInput)
    base = context().states.base(scope)
    try:
        record = build_record(
            scope,
            state,
            context().digest_key,
            compacted=base.compacted,
            turns_kept=context().settings.max_turns_kept,
        )
    except InputRejected as rejected:
        raise Problem(422, "validation_failed", errors=rejected.violations) from None
    return record, base


def _precondition() -> Precondition:
    if_match = request.headers.get("If-Match")
    if_none_match = request.headers.get("If-None-Match")
    if if_match is not None and if_none_match is not None:
        raise Problem(400, "invalid_precondition")
    if if_none_match is not None:
        if if_none_match.strip() != "*":
            raise Problem(400, "invalid_precondition")
        return Precondition(if_none_match_any=True)
    if if_match is not None:
        quoted = _QUOTED.fullmatch(if_match.strip())
        if quoted is None or not is_digest(quoted.group(1)):
            raise Problem(400, "invalid_precondition")
        return Precondition(if_match=quoted.group(1))
    return Precondition()


def _write_report(
    scope: TenantScope, *, applied: bool, requested: bool, blocked: list[str]
) -> SessionStateWriteReport:
    return SessionStateWriteReport(
        applied=applied,
        durable_write_requested=requested,
        key_digest=state_key(scope).digest(),
        blocked_reasons=sorted(blocked),
    )
