"""`PolicyGate`: every request's one way to a decision.

It builds the policy input (claims, target, deployment, approval, record
summary; never raw text), asks OPA through the client, counts the outcome,
and turns a denial or an unavailable engine into the problem the contract
fixes: 403 with the decision, 503 `policy_engine_unavailable`, or 503
`policy_engine_refused` when OPA does not accept the service's token.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from service.approvals import Approval
from service.auth import Actor
from service.http.problems import Problem, primary_reason
from service.metrics import ServiceMetrics
from service.policy.client import PolicyClient
from service.policy.input import (
    PolicyAction,
    PolicyDeployment,
    PolicyInput,
    PolicyTarget,
    record_summary,
)
from service.policy.trace import POLICY_ENGINE_REFUSED, POLICY_ENGINE_UNAVAILABLE, DecisionTrace
from store.record import SessionStateRecord
from store.reports import SessionStateWriteReport


class PolicyGate:
    """Decides through OPA and enforces the answer."""

    def __init__(
        self,
        client: PolicyClient,
        *,
        durable_writes: bool,
        metrics: ServiceMetrics,
        clock: Callable[[], datetime],
    ) -> None:
        self.client = client
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
    ) -> tuple[DecisionTrace, PolicyInput]:
        """The decision, and the input it was made on (the decision log keeps both)."""
        policy_input = PolicyInput(
            action=action,
            now=int(self.clock().timestamp()),
            actor=actor.to_policy(),
            target=target,
            deployment=PolicyDeployment(durable_writes_enabled=self.durable_writes),
            approval=None if approval is None else approval.to_policy(),
            record=None if record is None else record_summary(record),
        )
        trace = self.client.decide(policy_input)
        outcome = (
            "refused"
            if trace.engine_refused
            else "unavailable"
            if trace.engine_unavailable
            else "allow"
            if trace.allow
            else "deny"
        )
        self.metrics.decisions.labels(action, outcome).inc()
        self.metrics.decision_latency.labels(action).observe(trace.latency_ms / 1000)
        return trace, policy_input

    @staticmethod
    def enforce(
        trace: DecisionTrace, *, write_report: SessionStateWriteReport | None = None
    ) -> None:
        """Raise the contract's problem unless the decision allows."""
        if trace.engine_refused:
            # Not an outage that passes: an operator must fix the token. A Retry-After over
            # the client's longest wait (30 s) ends its retries at once.
            raise Problem(
                503,
                POLICY_ENGINE_REFUSED,
                decision=trace,
                write_report=write_report,
                headers={"Retry-After": "60"},
            )
        if trace.engine_unavailable:
            raise Problem(
                503,
                POLICY_ENGINE_UNAVAILABLE,
                decision=trace,
                write_report=write_report,
                headers={"Retry-After": "1"},
            )
        if not trace.allow:
            raise Problem(
                403, primary_reason(trace.reasons), decision=trace, write_report=write_report
            )
