"""What every route does first: find the context, authenticate, check scope ids, authorize.

`authorize` is a route's one way to a decision: the actor's rate limits first
(OPA is not asked when they refuse), then the policy, whose decision is kept as
the request's `PendingDecision` (`g.pending_decision`) and returned only when it
allows; otherwise the domain's refusal is raised, and `service.http.problems`
answers it. The pending decision is kept in the log with the effect, the write
or, by the app when the answer leaves, the status of the request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar, cast

from flask import Response, current_app, g, request
from pydantic import BaseModel, ValidationError

from service.api.reasons import Reason
from service.approvals.model import Approval
from service.auth.tokens import Actor
from service.context import ServiceContext
from service.decisions.journal import WriteResult
from service.decisions.log import entry_body
from service.decisions.pending import PendingDecision
from service.decisions.record_writes import StateErase
from service.http.problems import Problem
from service.policy.gate import PolicyGate
from service.policy.input import (
    PolicyAction,
    PolicyErasure,
    PolicyExchange,
    PolicyFork,
    PolicyHistory,
    PolicyRewind,
    PolicyTarget,
)
from service.policy.trace import DecisionTrace
from service.rate_limits import RateLimited
from store.key_codec import LaneKey
from store.record.reports import SessionStateWriteReport
from store.record.state_record import SessionStateRecord
from store.record.violations import UNKNOWN_PARAMETER, violations_of
from store.scope import TenantScope, is_scope_id
from store.session_state import Precondition

CONTEXT_KEY = "sessionstate"
Q = TypeVar("Q", bound=BaseModel)
WriteReportOf = Callable[[DecisionTrace], SessionStateWriteReport]
"""What a refused write or preview reports, from the decision that refused it."""


def context() -> ServiceContext:
    return cast(ServiceContext, current_app.extensions[CONTEXT_KEY])


def authenticate() -> Actor:
    """The verified actor of the request; `AuthenticationFailed` (401) otherwise."""
    actor = context().verifier.verify(request.headers.get("Authorization"))
    g.actor_sub = actor.sub
    return actor


def checked_ids(*ids: str) -> None:
    """Scope ids from the path exactly as sent, or 400: never trimmed or case-folded."""
    if not all(is_scope_id(value) for value in ids):
        raise Problem(Reason.INVALID_SCOPE_ID)


def session_scope(tenant_id: str, workspace_id: str, session_id: str) -> TenantScope:
    checked_ids(tenant_id, workspace_id, session_id)
    return TenantScope(tenant_id=tenant_id, workspace_id=workspace_id, session_id=session_id)


def query_of(model: type[Q]) -> Q:
    """The query string as `model`, or 422 naming what breaks its rules (never a value)."""
    try:
        return model.model_validate(request.args.to_dict())
    except ValidationError as error:
        # An unknown parameter is reported as one, never by its name.
        violations = violations_of(error, model, prefix=("query",), unknown=UNKNOWN_PARAMETER)
        raise Problem(Reason.VALIDATION_FAILED, errors=violations) from None


def target_of(scope: TenantScope) -> PolicyTarget:
    return PolicyTarget(
        tenant_id=scope.tenant_id, workspace_id=scope.workspace_id, session_id=scope.session_id
    )


def json_response(body: BaseModel, status: int = 200) -> Response:
    return Response(body.model_dump_json(), status=status, mimetype="application/json")


def authorize(
    action: PolicyAction,
    actor: Actor,
    target: PolicyTarget,
    *,
    record: SessionStateRecord | None = None,
    approval: Approval | None = None,
    write_report: WriteReportOf | None = None,
    exchange: PolicyExchange | None = None,
    erasure: PolicyErasure | None = None,
    rewind: PolicyRewind | None = None,
    fork: PolicyFork | None = None,
    history: PolicyHistory | None = None,
    authenticated: bool = True,
) -> DecisionTrace:
    """The policy's decision for this request, when it allows; a refusal raised otherwise.

    `RateLimited` before any policy call (the request adds no entry of its own:
    see `service.decisions.rate_limit_log`); then `PolicyDenied`,
    `PolicyEngineUnavailable` or `PolicyEngineRefused`, with the write report
    `write_report` makes of the decision. Every decision made is pending in the log.
    An actor that is not `authenticated` (the anonymous one of a token request) is
    counted by the socket's peer address: no proxy's header is trusted.
    """
    ctx = context()
    peer = None if authenticated else request.remote_addr or ""
    refusal = ctx.rate_limiter.admit(actor, peer=peer)
    if refusal is not None:
        ctx.metrics.rate_limited.labels(refusal.budget).inc()
        ctx.rate_limit_log.note(actor, refusal, action, target)
        raise RateLimited(refusal)
    trace, sent, shadow = ctx.gate.decide(
        action,
        actor,
        target,
        record=record,
        approval=approval,
        exchange=exchange,
        erasure=erasure,
        rewind=rewind,
        fork=fork,
        history=history,
    )
    if not trace.allow and not trace.engine_unavailable:
        ctx.rate_limiter.charge_denial(actor, target, peer=peer)
    g.decision_id = trace.decision_id
    g.decision_allow = trace.allow
    g.pending_decision = PendingDecision(entry_body(trace, sent, actor, shadow))
    PolicyGate.enforce(trace, write_report=None if write_report is None else write_report(trace))
    return trace


def authorize_within(
    action: PolicyAction, actor: Actor, target: PolicyTarget, *, erasure: PolicyErasure
) -> PendingDecision | None:
    """A decision of its own within a request `authorize` admitted (one session of a
    workspace's erasure): the actor's rate limits are not charged again. It allows: its
    pending decision, to be kept with its effect; it denies: kept (403), and None; the
    engine did not decide: kept (503), and its refusal raised."""
    ctx = context()
    trace, sent, shadow = ctx.gate.decide(action, actor, target, erasure=erasure)
    pending = PendingDecision(entry_body(trace, sent, actor, shadow))
    if trace.allow:
        return pending
    denied = not (trace.engine_unavailable or trace.engine_refused or trace.decision_undefined)
    pending.record(ctx.journal, 403 if denied else 503)
    if denied:
        return None
    PolicyGate.enforce(trace)
    raise AssertionError("a decision that neither allows nor denies was enforced")


def pending_decision() -> PendingDecision | None:
    """This request's decision, while it is not kept (or dropped) yet."""
    pending = cast(PendingDecision | None, g.get("pending_decision"))
    return None if pending is None or pending.settled else pending


def journal_decision(status: int) -> None:
    """Keep this request's decision with its final status, unless an effect or write did."""
    pending = pending_decision()
    if pending is not None:
        pending.record(context().journal, status)


def drop_decision() -> None:
    """Forget this request's decision: nothing was done, and the log cannot take it now."""
    pending = pending_decision()
    if pending is not None:
        pending.drop()


def journal_effect(
    status: int,
    puts: Sequence[tuple[LaneKey, bytes | None]] = (),
    *,
    approval_id: str | None = None,
) -> None:
    """Commit what an allowed decision changes, with its entry, in one batch (None deletes)."""
    _allowed().record_effect(context().journal, status, puts, approval_id=approval_id)


def journal_write(record: SessionStateRecord, precondition: Precondition) -> WriteResult:
    """Commit a durable write and its decision entry together, the record as the session's
    next version."""
    kept = context().settings.state_versions_kept
    return _allowed().record_write(context().journal, record, precondition, kept=kept)


def journal_erase(erase: StateErase) -> WriteResult:
    """Commit an erasure and its decision entry, the erasure's receipt, together."""
    return _allowed().record_erase(context().journal, erase)


def _allowed() -> PendingDecision:
    pending = pending_decision()
    if pending is None:  # a route that changes state without authorize(): never let it pass
        raise RuntimeError("no pending decision allows this change")
    return pending
