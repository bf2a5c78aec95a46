"""What every route does first: find the context, authenticate, check scope ids, decide."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from flask import Response, current_app, g, request
from pydantic import BaseModel

from service.approvals import Approval
from service.auth import Actor, AuthenticationFailed
from service.context import ServiceContext
from service.decisions.journal import WriteResult
from service.decisions.log import DecisionOutcome, entry_body
from service.http.problems import Problem
from service.policy.input import PolicyAction, PolicyTarget
from service.policy.trace import RATE_LIMITED, DecisionTrace
from store.keys import LaneKey
from store.lanes import StoreOffline
from store.record import SessionStateRecord
from store.scope import TenantScope, is_scope_id
from store.session_state import Precondition

CONTEXT_KEY = "sessionstate"
STORE_RETRY_AFTER = {"Retry-After": "5"}


def unkept_decision(error: Exception) -> Problem:
    """The answer when a decision cannot be kept: the store's fault, or the journal's."""
    if isinstance(error, StoreOffline):
        return Problem(503, "store_unavailable", headers=STORE_RETRY_AFTER)
    return Problem(503, "decision_log_unavailable")


def context() -> ServiceContext:
    return cast(ServiceContext, current_app.extensions[CONTEXT_KEY])


def authenticate() -> Actor:
    """The verified actor of the request, or 401."""
    try:
        actor = context().verifier.verify(request.headers.get("Authorization"))
    except AuthenticationFailed as failure:
        raise Problem(
            401, failure.reason, headers={"WWW-Authenticate": 'Bearer realm="sessionstate"'}
        ) from None
    g.actor_sub = actor.sub
    return actor


def checked_ids(*ids: str) -> None:
    """Scope ids from the path exactly as sent, or 400: never trimmed or case-folded."""
    if not all(is_scope_id(value) for value in ids):
        raise Problem(400, "invalid_scope_id")


def session_scope(tenant_id: str, workspace_id: str, session_id: str) -> TenantScope:
    checked_ids(tenant_id, workspace_id, session_id)
    return TenantScope(tenant_id=tenant_id, workspace_id=workspace_id, session_id=session_id)


def target_of(scope: TenantScope) -> PolicyTarget:
    return PolicyTarget(
        tenant_id=scope.tenant_id, workspace_id=scope.workspace_id, session_id=scope.session_id
    )


def json_response(body: BaseModel, status: int = 200) -> Response:
    return Response(body.model_dump_json(), status=status, mimetype="application/json")


def decide(
    action: PolicyAction,
    actor: Actor,
    target: PolicyTarget,
    *,
    record: SessionStateRecord | None = None,
    approval: Approval | None = None,
) -> DecisionTrace:
    """The policy decision for this request, remembered for its log line and the decision log.

    An actor over its budget is refused with 429 first: OPA is not asked and
    the request adds no entry of its own (see `service.decisions.rate_limit_log`).
    """
    ctx = context()
    refusal = ctx.rate_limiter.admit(actor)
    if refusal is not None:
        ctx.metrics.rate_limited.labels(refusal.budget).inc()
        ctx.rate_limit_log.note(actor, refusal, action, target)
        raise Problem(429, RATE_LIMITED, headers={"Retry-After": str(refusal.retry_after)})
    trace, policy_input = ctx.gate.decide(action, actor, target, record=record, approval=approval)
    if not trace.allow and not trace.engine_unavailable:
        ctx.rate_limiter.charge_denial(actor, target)
    g.decision_id = trace.decision_id
    g.decision_allow = trace.allow
    g.decision_entry = entry_body(trace, policy_input, actor, outcome=None)
    return trace


def journal_decision(status: int) -> None:
    """Append this request's decision with its final status, unless a write already did."""
    body = g.pop("decision_entry", None)
    if body is None:
        return
    body["outcome"] = DecisionOutcome(status=status, applied=False, approval_id=None).model_dump(
        mode="json"
    )
    context().journal.record(body)


def journal_effect(
    status: int, puts: Sequence[tuple[LaneKey, bytes]] = (), *, approval_id: str | None = None
) -> None:
    """Commit what an allowed decision changes, with its entry, in one batch."""
    body = g.pop("decision_entry")
    context().journal.record_effect(body, status=status, puts=puts, approval_id=approval_id)


def journal_write(record: SessionStateRecord, precondition: Precondition) -> WriteResult:
    """Commit a durable write and its decision entry together."""
    body = g.pop("decision_entry")
    return context().journal.record_write(body, record, precondition)
