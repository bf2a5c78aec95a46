"""Session lifecycle routes: a workspace's sessions listed, a session erased, and every
session of a workspace erased.

An erasure is decided like any action (`erase`), and its entry is the erasure's
receipt: the policy input names what it erases (`erasure`: how many records, the
last state digest, why), the entry who asked and its outcome, never any content.
The erasure commits with its entry in one journal batch, expecting the record
the decision saw, so a write that lands in between is not erased unseen (412).
Then the store makes the erased bytes gone from its files (`Lanes.expunge`)
before the answer leaves. Erasing a session that holds nothing answers 204 too
(and its entry says nothing was applied): the caller's end holds either way, and
a repeat of an erasure whose answer was lost, or which answered
`erasure_incomplete`, is safe, and finishes what was left.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from flask import Blueprint, Response

from service.api.reasons import Reason
from service.api.v1 import DECISION_ID_HEADER, SESSIONS, STATE, flask_rule
from service.api.wire import SessionListResponse, SessionSummary, WorkspaceErasureResponse
from service.auth.tokens import Actor
from service.decisions.record_writes import StateErase
from service.http.common import (
    authenticate,
    authorize,
    authorize_within,
    checked_ids,
    context,
    journal_erase,
    json_response,
    query_of,
    session_scope,
    target_of,
)
from service.http.problems import Problem
from service.http.state import request_precondition
from service.policy.input import PolicyErasure, PolicyTarget
from service.policy.trace import DecisionTrace
from service.session_list import SessionListQuery, encode_cursor
from store.scope import TenantScope
from store.session_data import SESSION_DATA_LANES
from store.session_state import BuiltOn, ListedSession, Precondition
from store.version_lane import versions_count

bp = Blueprint("sessions", __name__)
ERASE_BATCH = 64  # sessions a workspace's erasure reads and erases at a time
Erased = Literal["erased", "absent", "refused", "changed"]


@bp.get(flask_rule(SESSIONS))
def list_sessions(tenant_id: str, workspace_id: str) -> Response:
    """A page of the workspace's stored sessions, in session-id order, each with its
    version and digest, no content."""
    actor = authenticate()
    checked_ids(tenant_id, workspace_id)
    query = query_of(SessionListQuery)
    trace = authorize("list", actor, PolicyTarget(tenant_id=tenant_id, workspace_id=workspace_id))
    listed, more = context().states.listed(tenant_id, workspace_id, query.after, query.limit)
    next_cursor = encode_cursor(listed[-1].scope.session_id) if more else None
    sessions = [_summary(item) for item in listed]
    return json_response(
        SessionListResponse(sessions=sessions, next_cursor=next_cursor, decision=trace)
    )


@bp.delete(flask_rule(STATE))
def erase_state(tenant_id: str, workspace_id: str, session_id: str) -> Response:
    """Erase the session's record and all its versions: 204, the decision named."""
    actor = authenticate()
    scope = session_scope(tenant_id, workspace_id, session_id)
    asked = request_precondition()
    if asked.if_none_match_any:  # `If-None-Match: *` means nothing for an erasure
        raise Problem(Reason.INVALID_PRECONDITION)
    erasure, precondition = _erasure_of(scope, asked.if_match)
    trace = authorize("erase", actor, target_of(scope), erasure=erasure)
    result = journal_erase(StateErase(scope, precondition))
    if result.entry["outcome"]["status"] == 412:
        raise Problem(Reason.PRECONDITION_FAILED, decision=trace)
    _expunge(trace, tenant_id, workspace_id, session_id)
    # 204 has no body: the decision, whose entry is the receipt, is named in a header.
    response = Response(status=204, headers={DECISION_ID_HEADER: trace.decision_id})
    del response.headers["Content-Type"]
    return response


@bp.delete(flask_rule(SESSIONS))
def erase_workspace(tenant_id: str, workspace_id: str) -> Response:
    """Erase every session of the workspace, `ERASE_BATCH` at a time, each decided and
    receipted on its own. Each erasure commits alone, so a request cut off leaves the
    sessions it did not reach stored, and the next request erases them."""
    actor = authenticate()
    checked_ids(tenant_id, workspace_id)
    target = PolicyTarget(tenant_id=tenant_id, workspace_id=workspace_id)
    trace = authorize("erase", actor, target)
    tally: Counter[Erased] = Counter()
    after: str | None = None
    while True:
        listed, more = context().states.listed(tenant_id, workspace_id, after, ERASE_BATCH)
        for item in listed:
            tally[_erase_one(actor, item.scope, trace.decision_id)] += 1
        _expunge(trace, tenant_id, workspace_id)
        if not more:
            break
        after = listed[-1].scope.session_id
    body = WorkspaceErasureResponse(
        sessions_erased=tally["erased"],
        sessions_refused=tally["refused"],
        sessions_changed=tally["changed"],
        complete=tally["refused"] + tally["changed"] == 0,
        decision=trace,
    )
    return json_response(body)


def _erasure_of(
    scope: TenantScope, if_match: str | None, workspace_decision_id: str | None = None
) -> tuple[PolicyErasure, Precondition]:
    """What erasing scope would erase now, and the precondition its commit holds it to:
    the version the decision is made on (and the caller's `If-Match`, if any)."""
    base = context().states.base(scope)
    erasure = PolicyErasure(
        reason="requested",
        versions=versions_count(context().lanes, scope, record_stored=base.version is not None),
        state_digest=base.version,
        workspace_decision_id=workspace_decision_id,
    )
    return erasure, Precondition(if_match=if_match, built_on=BuiltOn(base.version))


def _erase_one(actor: Actor, scope: TenantScope, workspace_decision_id: str) -> Erased:
    """One session of a workspace's erasure, decided and receipted on its own. A refusal
    is kept as its entry; an engine that does not decide ends the request (503): a repeat
    goes on from there."""
    erasure, precondition = _erasure_of(scope, None, workspace_decision_id)
    pending = authorize_within("erase", actor, target_of(scope), erasure=erasure)
    if pending is None:
        return "refused"
    result = pending.record_erase(context().journal, StateErase(scope, precondition))
    if result.applied:
        return "erased"
    return "changed" if result.entry["outcome"]["status"] == 412 else "absent"


def _expunge(trace: DecisionTrace, *scope: str) -> None:
    """The erased bytes gone from the store's files, or 503 `erasure_incomplete`."""
    done = [context().lanes.expunge(lane, *scope) for lane in SESSION_DATA_LANES]
    if not all(done):
        raise Problem(
            Reason.ERASURE_INCOMPLETE,
            decision=trace,
            headers={DECISION_ID_HEADER: trace.decision_id},
        )


def _summary(item: ListedSession) -> SessionSummary:
    record = item.report.record
    updated_at = None if item.meta is None else item.meta.updated_at
    return SessionSummary(
        session_id=item.scope.session_id,
        version=item.version,
        state_digest=None if record is None else record.state_digest,
        updated_at=updated_at,
        expires_at=context().idle_ttl.expires_at(item.scope.tenant_id, updated_at),
        lineage=None if record is None else record.lineage,
    )
