"""`PolicyGate`: every request's one way to a decision.

It builds the policy input (claims, target, deployment, approval, record
summary; never raw text), asks OPA through the client, counts the outcome,
and turns a decision that does not allow into the domain's exception
(`service.policy.errors`): `PolicyDenied`, `PolicyEngineUnavailable`,
`PolicyEngineRefused` when OPA does not accept the service's token, or
`PolicyDecisionUndefined` when the policies gave no decision.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from service.approvals.model import Approval
from service.auth.tokens import Actor
from service.observability import tracing
from service.observability.metrics import ServiceMetrics
from service.policy.client import EncodedInput, PolicyClient
from service.policy.errors import (
    PolicyDecisionUndefined,
    PolicyDenied,
    PolicyEngineRefused,
    PolicyEngineUnavailable,
)
from service.policy.input import (
    PolicyAction,
    PolicyDeployment,
    PolicyErasure,
    PolicyExchange,
    PolicyFork,
    PolicyHistory,
    PolicyInput,
    PolicyRewind,
    PolicyTarget,
    record_summary,
)
from service.policy.shadow import ShadowDecision, ShadowPolicy
from service.policy.trace import DecisionTrace
from store.record.reports import SessionStateWriteReport
from store.record.state_record import SessionStateRecord


class PolicyGate:
    """Decides through OPA and enforces the answer."""

    def __init__(
        self,
        client: PolicyClient,
        *,
        durable_writes: bool,
        metrics: ServiceMetrics,
        clock: Callable[[], datetime],
        shadow: ShadowPolicy | None = None,
        observe: Callable[[DecisionTrace], None] | None = None,
    ) -> None:
        self.client = client
        self.observe = observe  # told of every decision (which revision decides now)
        self.shadow = shadow
        self.durable_writes = durable_writes
        self.metrics = metrics
        self.clock = clock

    def decide(
        self,
        action: PolicyAction,
        actor: Actor,
        target: PolicyTarget,
        *,
        record: SessionStateRecord | None = None,
        approval: Approval | None = None,
        exchange: PolicyExchange | None = None,
        erasure: PolicyErasure | None = None,
        rewind: PolicyRewind | None = None,
        fork: PolicyFork | None = None,
        history: PolicyHistory | None = None,
    ) -> tuple[DecisionTrace, EncodedInput, ShadowDecision | None]:
        """The decision, the input it was made on (encoded, as sent), and with a shadow policy
        set what that would have decided (the decision log keeps all three)."""
        policy_input = PolicyInput(
            action=action,
            now=int(self.clock().timestamp()),
            actor=actor.to_policy(),
            target=target,
            deployment=PolicyDeployment(durable_writes_enabled=self.durable_writes),
            approval=None if approval is None else approval.to_policy(),
            record=None if record is None else record_summary(record),
            exchange=exchange,
            erasure=erasure,
            rewind=rewind,
            fork=fork,
            history=history,
        )
        encoded = EncodedInput.of(policy_input)  # the same bytes to the live and the shadow OPA
        question = None if self.shadow is None else self.shadow.ask(encoded)
        with tracing.decision_span(action) as span:  # OPA's own spans join it
            trace = self.client.decide(encoded, trace_id=tracing.trace_id(span))
            tracing.note_decision(span, trace)
        if self.observe is not None:
            self.observe(trace)
        outcome = (
            "refused"
            if trace.engine_refused
            else "undefined"
            if trace.decision_undefined
            else "unavailable"
            if trace.engine_unavailable
            else "allow"
            if trace.allow
            else "deny"
        )
        self.metrics.decisions.labels(action, outcome).inc()
        self.metrics.decision_latency.labels(action).observe(trace.latency_ms / 1000)
        if question is None or trace.engine_unavailable:  # nothing to compare with
            return trace, encoded, None
        shadow = question.verdict(trace)
        self.metrics.shadow_decisions.labels(action, shadow.outcome).inc()
        return trace, encoded, shadow

    @staticmethod
    def enforce(
        trace: DecisionTrace, *, write_report: SessionStateWriteReport | None = None
    ) -> None:
        """Raise the refusal the decision amounts to, unless it allows."""
        if trace.engine_refused:
            raise PolicyEngineRefused(trace, write_report)
        if trace.decision_undefined:
            raise PolicyDecisionUndefined(trace, write_report)
        if trace.engine_unavailable:
            raise PolicyEngineUnavailable(trace, write_report)
        if not trace.allow:
            raise PolicyDenied(trace, write_report)
