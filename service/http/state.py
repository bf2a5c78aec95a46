"""Session state routes, for model services: preview, write, read, replay preview."""

from __future__ import annotations

import re

from flask import Blueprint, Response, request

from service.api.reasons import Reason
from service.api.v1 import (
    ETAG,
    IF_MATCH,
    IF_NONE_MATCH,
    REPLAY_PREVIEW,
    STATE,
    STATE_PREVIEW,
    flask_rule,
    quoted_etag,
)
from service.api.wire import ReplayPreviewResponse, SessionStateReadResponse, SessionStateResponse
from service.http.body import json_body
from service.http.common import (
    WriteReportOf,
    authenticate,
    authorize,
    context,
    journal_write,
    json_response,
    session_scope,
    target_of,
)
from service.http.problems import Problem
from service.policy.trace import DecisionTrace
from service.replay import ReplayPreviewRequest
from store.digests import is_digest
from store.record.builder import build_record
from store.record.inputs import SessionStateInput
from store.record.reports import SessionStateReadReport, SessionStateWriteReport
from store.record.state_record import SessionStateRecord
from store.record.validation import record_blockers
from store.record.violations import InputRejected
from store.scope import TenantScope
from store.session_data import read_meta
from store.session_state import Precondition, StoredVersion, state_key

bp = Blueprint("state", __name__)
_QUOTED = re.compile(r'^"([^"]*)"$')


@bp.post(flask_rule(STATE_PREVIEW))
def preview_state(tenant_id: str, workspace_id: str, session_id: str) -> Response:
    """Build the sanitized record and say what a write would do; never writes."""
    actor = authenticate()
    scope = session_scope(tenant_id, workspace_id, session_id)
    record, _ = _record_from_body(scope)
    approval = context().approvals.covering(scope, context().clock())

    def preview_report(trace: DecisionTrace) -> SessionStateWriteReport:
        # What would block a real write now: the decision's reasons, allowed or not.
        return _write_report(scope, applied=False, requested=False, blocked=trace.reasons)

    trace = authorize(
        "preview",
        actor,
        target_of(scope),
        record=record,
        approval=approval,
        write_report=preview_report,
    )
    return json_response(
        SessionStateResponse(record=record, write_report=preview_report(trace), decision=trace)
    )


@bp.put(flask_rule(STATE))
def put_state(tenant_id: str, workspace_id: str, session_id: str) -> Response:
    """Write the sanitized record durably, if the policy and the preconditions allow."""
    actor = authenticate()
    scope = session_scope(tenant_id, workspace_id, session_id)
    precondition = request_precondition()
    record, base = _record_from_body(scope)
    approval = context().approvals.covering(scope, context().clock())
    trace = authorize(
        "write",
        actor,
        target_of(scope),
        record=record,
        approval=approval,
        write_report=refused_write(scope),
    )
    return write_answer(record, precondition.extending(record, base), trace)


def refused_write(scope: TenantScope) -> WriteReportOf:
    """What a refused write of scope reports: nothing applied, the decision's reasons."""
    return lambda refusal: _write_report(
        scope, applied=False, requested=True, blocked=refusal.reasons
    )


def write_answer(
    record: SessionStateRecord, precondition: Precondition, trace: DecisionTrace
) -> Response:
    """Commit an allowed write of record (its session's next version) with its decision, if
    precondition holds then; the answer: 201 created or 200 replaced, with its `ETag`."""
    scope = record.scope
    blockers = [str(blocker) for blocker in record_blockers(record)]
    if blockers:  # the store's own gate, whatever a policy edit allows
        report = _write_report(scope, applied=False, requested=True, blocked=blockers)
        raise Problem(Reason.POLICY_DENIED, code=blockers[0], decision=trace, write_report=report)
    written = journal_write(record, precondition)
    if not written.applied:
        report = _write_report(
            scope, applied=False, requested=True, blocked=[Reason.PRECONDITION_FAILED.value]
        )
        raise Problem(Reason.PRECONDITION_FAILED, decision=trace, write_report=report)
    report = _write_report(scope, applied=True, requested=True, blocked=[])
    expires_at = context().idle_ttl.expires_at(scope.tenant_id, written.entry["recorded_at"])
    body = SessionStateResponse(
        record=record,
        write_report=report,
        decision=trace,
        version=written.version,
        expires_at=expires_at,
    )
    response = json_response(body, 201 if written.created else 200)
    response.headers[ETAG] = quoted_etag(record.state_digest)
    return response


@bp.get(flask_rule(STATE))
def get_state(tenant_id: str, workspace_id: str, session_id: str) -> Response:
    """The stored record, or a corrupt read report that fails closed."""
    actor = authenticate()
    scope = session_scope(tenant_id, workspace_id, session_id)
    trace = authorize("read", actor, target_of(scope))
    found = context().versions.current(scope)
    if found is None:
        raise nothing_stored(scope, trace)
    meta = read_meta(context().lanes, scope)
    updated_at = None if meta is None else meta.updated_at
    return read_answer(*found, trace, context().idle_ttl.expires_at(tenant_id, updated_at))


def read_answer(
    report: SessionStateReadReport,
    version: int,
    trace: DecisionTrace,
    expires_at: str | None = None,
) -> Response:
    """A version of the record as read (the current one, or one kept), with its `ETag`."""
    if report.redacted_error is not None:
        context().metrics.corrupt_reads.labels(report.redacted_error.value).inc()
    body = SessionStateReadResponse(
        read_report=report, decision=trace, version=version, expires_at=expires_at
    )
    response = json_response(body)
    if report.record is not None:
        response.headers[ETAG] = quoted_etag(report.record.state_digest)
    return response


@bp.post(flask_rule(REPLAY_PREVIEW))
def replay_preview(tenant_id: str, workspace_id: str, session_id: str) -> Response:
    """Replay inputs from digests and anchors; no inputs at all when denied or corrupt."""
    actor = authenticate()
    scope = session_scope(tenant_id, workspace_id, session_id)
    ask = json_body(ReplayPreviewRequest, optional=True)
    trace = authorize("replay", actor, target_of(scope))
    report = context().states.read(scope)
    if report is None:
        raise nothing_stored(scope, trace)
    planner = context().planner
    if report.record is None:
        label = report.redacted_error.value if report.redacted_error else "session_state_corrupt"
        context().metrics.corrupt_reads.labels(label).inc()
        preview = planner.blocked([label])
    else:
        preview = planner.preview(report.record, ask.max_inputs)
    return json_response(ReplayPreviewResponse(preview=preview, decision=trace))


def nothing_stored(scope: TenantScope, trace: DecisionTrace) -> Problem:
    """The 404 of a session without a record: `session_state_erased` with its tombstone's
    members when it was erased (and not written since), else `session_state_not_found`."""
    erasure = context().states.erasure(scope)
    if erasure is None:
        return Problem(Reason.SESSION_STATE_NOT_FOUND, decision=trace)
    return Problem(Reason.SESSION_STATE_ERASED, decision=trace, erasure=erasure)


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
            lineage=base.lineage,
        )
    except InputRejected as rejected:
        raise Problem(Reason.VALIDATION_FAILED, errors=rejected.violations) from None
    return record, base


def request_precondition() -> Precondition:
    """The request's `If-Match` or `If-None-Match`; 400 invalid_precondition if malformed."""
    if_match = request.headers.get(IF_MATCH)
    if_none_match = request.headers.get(IF_NONE_MATCH)
    if if_match is not None and if_none_match is not None:
        raise Problem(Reason.INVALID_PRECONDITION)
    if if_none_match is not None:
        if if_none_match.strip() != "*":
            raise Problem(Reason.INVALID_PRECONDITION)
        return Precondition(if_none_match_any=True)
    if if_match is not None:
        return Precondition(if_match=_matched(if_match))
    return Precondition()


def required_if_match() -> Precondition:
    """A change that must name the version it replaces: `If-Match` alone, or 428."""
    if request.headers.get(IF_NONE_MATCH) is not None:
        raise Problem(Reason.INVALID_PRECONDITION)
    if_match = request.headers.get(IF_MATCH)
    if if_match is None:
        raise Problem(Reason.PRECONDITION_REQUIRED)
    return Precondition(if_match=_matched(if_match))


def _matched(if_match: str) -> str:
    """The state digest an `If-Match` names, or 400."""
    quoted = _QUOTED.fullmatch(if_match.strip())
    if quoted is None or not is_digest(quoted.group(1)):
        raise Problem(Reason.INVALID_PRECONDITION)
    return quoted.group(1)


def _write_report(
    scope: TenantScope, *, applied: bool, requested: bool, blocked: list[str]
) -> SessionStateWriteReport:
    return SessionStateWriteReport(
        applied=applied,
        durable_write_requested=requested,
        key_digest=state_key(scope).digest(),
        blocked_reasons=sorted(blocked),
    )
