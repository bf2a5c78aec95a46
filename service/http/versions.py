"""A session's versions, for model services: the list, one version's record, a rewind.

Reading versions is decided by `sessionstate.history`; a rewind by `sessionstate.rewind`,
as a write of the version's record (the journal's one write path, with its entry, whose
input names the version restored). A rewind that finds nothing to restore (no record,
no such version, a corrupt one) asks `history` instead: what is not there is told only
to whoever may read the session, with that decision. An erasure takes every version
with the record: until the next write (version 1 again) the versions' reads and a
rewind answer `session_state_erased`, as `GET .../state` does.
"""

from __future__ import annotations

from typing import NoReturn

from flask import Blueprint, Response

from service.api.reasons import Reason
from service.api.v1 import STATE_REWIND, STATE_VERSION, STATE_VERSIONS, VERSION, flask_rule
from service.api.version_requests import RewindRequest, VersionsQuery, next_cursor
from service.api.wire import SessionVersionsResponse
from service.auth.tokens import Actor
from service.http.body import json_body
from service.http.common import (
    authenticate,
    authorize,
    context,
    json_response,
    query_of,
    session_scope,
    target_of,
)
from service.http.problems import Problem
from service.http.state import (
    nothing_stored,
    read_answer,
    refused_write,
    required_if_match,
    write_answer,
)
from service.policy.input import PolicyHistory, PolicyRewind
from service.policy.trace import DecisionTrace
from store.scope import TenantScope
from store.version_lane import MAX_VERSION

bp = Blueprint("versions", __name__)


@bp.get(flask_rule(STATE_VERSIONS))
def list_versions(tenant_id: str, workspace_id: str, session_id: str) -> Response:
    """A page of the session's versions, newest first."""
    actor = authenticate()
    scope = session_scope(tenant_id, workspace_id, session_id)
    query = query_of(VersionsQuery)
    trace = authorize("history", actor, target_of(scope), history=PolicyHistory(version=None))
    listed = context().versions.page(scope, limit=query.limit + 1, below=query.below())
    page = listed[: query.limit]
    if not page and query.cursor is None:
        raise nothing_stored(scope, trace)
    cursor = next_cursor(page[-1].version) if len(listed) > query.limit else None
    return json_response(SessionVersionsResponse(versions=page, next_cursor=cursor, decision=trace))


@bp.get(flask_rule(STATE_VERSION))
def read_version(tenant_id: str, workspace_id: str, session_id: str, version: str) -> Response:
    """One kept version of the record, as `GET .../state` answers the current one."""
    actor = authenticate()
    scope = session_scope(tenant_id, workspace_id, session_id)
    number = _version_number(version)
    trace = authorize("history", actor, target_of(scope), history=PolicyHistory(version=number))
    report = context().versions.read(scope, number)
    if report is None:
        raise not_kept(scope, trace)
    return read_answer(report, number, trace)


@bp.post(flask_rule(STATE_REWIND))
def rewind_state(tenant_id: str, workspace_id: str, session_id: str) -> Response:
    """Write a kept version's record as the session's next version, if the policy and
    `If-Match` (required: the current record's ETag) allow."""
    actor = authenticate()
    scope = session_scope(tenant_id, workspace_id, session_id)
    precondition = required_if_match()
    ask = json_body(RewindRequest)
    found = context().versions.current(scope)
    restored = context().versions.read(scope, ask.to_version) if found is not None else None
    if found is None or restored is None or restored.record is None:
        _refuse_missing(actor, scope, ask.to_version, found is None, restored is None)
    record = restored.record
    trace = authorize(
        "rewind",
        actor,
        target_of(scope),
        record=record,
        approval=context().approvals.covering(scope, context().clock()),
        rewind=PolicyRewind(restored_version=ask.to_version, replaced_version=found[1]),
        write_report=refused_write(scope),
    )
    return write_answer(record, precondition, trace)


def _refuse_missing(
    actor: Actor, scope: TenantScope, version: int, no_record: bool, no_version: bool
) -> NoReturn:
    """Nothing to restore: said, under a `history` decision (of reading the version asked
    for), to whoever may read the session."""
    history = PolicyHistory(version=version)
    trace = authorize("history", actor, target_of(scope), history=history)
    if no_record:
        raise nothing_stored(scope, trace)
    if no_version:
        raise not_kept(scope, trace)
    raise Problem(Reason.SESSION_STATE_VERSION_CORRUPT, decision=trace)


def not_kept(scope: TenantScope, trace: DecisionTrace) -> Problem:
    """The 404 of a version not kept: `session_state_erased` when the session was erased
    (and not written since: its versions went with it), else
    `session_state_version_not_found`."""
    if context().states.erasure(scope) is not None:
        return nothing_stored(scope, trace)
    return Problem(Reason.SESSION_STATE_VERSION_NOT_FOUND, decision=trace)


def _version_number(text: str) -> int:
    """A version number from the path (1 to `MAX_VERSION`, the largest the decision log's
    RFC 8785 JSON holds exactly), or 400; one a session has not reached is 404, decided."""
    if VERSION.fullmatch(text) is None or int(text) > MAX_VERSION:
        raise Problem(Reason.INVALID_VERSION)
    return int(text)
