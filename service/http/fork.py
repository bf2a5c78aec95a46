"""A fork, for model services and operators: a version of a session written as the first
record of a new session of the same workspace (`POST .../fork`).

Decided by `sessionstate.fork`, whose input names the target as the decision's target
and the source version (`fork`), and committed as a write to the target through the
journal's one write path, expecting nothing stored there (an erased target holds
nothing). The record is the source version's with the target's scope and its
`lineage`. A source that is not there (no record, erased, no such version, a corrupt
one) is told under a `list` decision of the workspace: what is or is not stored in it
is told only to whoever may list it.
"""

from __future__ import annotations

from typing import NoReturn

from flask import Blueprint, Response

from service.api.fork_requests import ForkRequest
from service.api.reasons import Reason
from service.api.v1 import FORK, LOCATION, STATE, fill, flask_rule
from service.auth.tokens import Actor
from service.http.body import json_body
from service.http.common import (
    authenticate,
    authorize,
    checked_ids,
    context,
    session_scope,
    target_of,
)
from service.http.problems import Problem
from service.http.state import nothing_stored, refused_write, write_answer
from service.http.versions import not_kept
from service.policy.input import PolicyFork, PolicyTarget
from store.record.lineage import forked_record
from store.record.state_record import SessionStateRecord
from store.scope import TenantScope
from store.session_state import Precondition

bp = Blueprint("fork", __name__)


@bp.post(flask_rule(FORK))
def fork_session(tenant_id: str, workspace_id: str, session_id: str) -> Response:
    """Create the target session from a version of this one: 201 with its record."""
    actor = authenticate()
    source = session_scope(tenant_id, workspace_id, session_id)
    ask = json_body(ForkRequest)
    checked_ids(ask.to_session_id)
    target = TenantScope(
        tenant_id=tenant_id, workspace_id=workspace_id, session_id=ask.to_session_id
    )
    version, found = _source_version(actor, source, ask.from_version)
    record = forked_record(found, version, target)
    trace = authorize(
        "fork",
        actor,
        target_of(target),
        record=record,
        approval=context().approvals.covering(target, context().clock()),
        fork=PolicyFork(
            source_session_id=session_id,
            source_version=version,
            source_state_digest=found.state_digest,
        ),
        write_report=refused_write(target),
    )
    if context().states.base(target).version is not None:
        raise Problem(Reason.SESSION_STATE_EXISTS, decision=trace)
    response = write_answer(record, Precondition(if_none_match_any=True), trace)
    response.headers[LOCATION] = fill(
        STATE, tenant_id=tenant_id, workspace_id=workspace_id, session_id=ask.to_session_id
    )
    return response


def _source_version(
    actor: Actor, source: TenantScope, asked: int | None
) -> tuple[int, SessionStateRecord]:
    """The source version forked (the current one unless one is asked) and its record."""
    current = context().versions.current(source)
    if current is None:
        _refuse_missing(actor, source, None)
    version = current[1] if asked is None else asked
    report = current[0] if asked is None else context().versions.read(source, version)
    if report is None or report.record is None:
        _refuse_missing(actor, source, report is None)
    return version, report.record


def _refuse_missing(actor: Actor, source: TenantScope, not_kept_version: bool | None) -> NoReturn:
    """No version to fork: said, under a `list` decision, to whoever may list the workspace.
    `not_kept_version` None: the session holds no record; True: not that version; False:
    that version does not read."""
    workspace = PolicyTarget(tenant_id=source.tenant_id, workspace_id=source.workspace_id)
    trace = authorize("list", actor, workspace)
    if not_kept_version is None:
        raise nothing_stored(source, trace)
    if not_kept_version:
        raise not_kept(source, trace)
    raise Problem(Reason.SESSION_STATE_VERSION_CORRUPT, decision=trace)
