"""Comparing a candidate's answers with the logged decisions, and counting what changed.

A logged decision is evaluated again only when its input is one the candidate can be
asked today: the service's own decisions (rate limit summaries), decisions OPA did
not make (the engine was unavailable), and inputs of an older input schema are
skipped, each counted under why.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from service.api.reasons import Reason
from service.api.v1 import DECISION_PACKAGES
from service.impact.report import (
    ChangeCounts,
    ImpactExample,
    ImpactReport,
    ReasonCounts,
    Skipped,
    Verdict,
)
from service.policy.change import DecisionChange, decision_change
from service.policy.input import PolicyInput

ENGINE_FAILURES = {
    Reason.POLICY_ENGINE_UNAVAILABLE.value,
    Reason.POLICY_ENGINE_REFUSED.value,
    Reason.POLICY_DECISION_UNDEFINED.value,
}


class SkipReason(StrEnum):
    MISSING_INPUT = "missing_input"
    INPUT_SCHEMA_OUTDATED = "input_schema_outdated"
    DECIDED_BY_SERVICE = "decided_by_service"
    ENGINE_UNAVAILABLE = "engine_unavailable"


@dataclass(frozen=True)
class LoggedDecision:
    """A decision as the log holds it: enough to ask the candidate again and compare."""

    decision_id: str
    tenant_id: str | None
    action: str
    evaluated_at: str
    before: Verdict
    input: dict[str, Any] | None
    decided_by_opa: bool = True

    @property
    def package(self) -> str:
        return DECISION_PACKAGES[self.input["action"]] if self.input else ""


def skip_reason(logged: LoggedDecision) -> SkipReason | None:
    """Why the decision cannot be asked again (None: it can)."""
    if not logged.decided_by_opa:
        return SkipReason.DECIDED_BY_SERVICE
    if ENGINE_FAILURES.intersection(logged.before.reasons):
        return SkipReason.ENGINE_UNAVAILABLE
    if not logged.input:
        return SkipReason.MISSING_INPUT
    try:
        PolicyInput.model_validate(logged.input)
    except ValidationError:
        return SkipReason.INPUT_SCHEMA_OUTDATED
    return None


class ImpactTally:
    """Counts decisions as they are compared; `report()` is the report so far."""

    def __init__(self, candidate_revision: str, examples: int) -> None:
        self._report = ImpactReport(candidate_revision=candidate_revision)
        self._examples = examples

    def skip(self, why: SkipReason) -> None:
        skipped: Skipped = self._report.skipped
        skipped.total += 1
        skipped.why[why.value] = skipped.why.get(why.value, 0) + 1

    def compare(self, logged: LoggedDecision, after: Verdict) -> DecisionChange:
        report = self._report
        outcome = decision_change(logged.before, after)
        counts = [
            report.by_action.setdefault(logged.action, ChangeCounts()),
            report.by_tenant.setdefault(logged.tenant_id or "", ChangeCounts()),
        ]
        report.evaluated += 1
        for count in counts:
            count.evaluated += 1
        if outcome is DecisionChange.UNCHANGED:
            report.unchanged += 1
            return outcome
        report.changed += 1
        setattr(report, outcome.value, getattr(report, outcome.value) + 1)
        for count in counts:
            count.changed += 1
            setattr(count, outcome.value, getattr(count, outcome.value) + 1)
        before, now = set(logged.before.reasons), set(after.reasons)
        for code in now - before:
            report.by_reason.setdefault(code, ReasonCounts()).gained += 1
        for code in before - now:
            report.by_reason.setdefault(code, ReasonCounts()).lost += 1
        if len(report.examples) < self._examples:
            report.examples.append(
                ImpactExample(
                    decision_id=logged.decision_id,
                    tenant_id=logged.tenant_id,
                    action=logged.action,
                    before=logged.before,
                    after=after,
                )
            )
        return outcome

    def report(self) -> ImpactReport:
        return self._report.model_copy(deep=True)
