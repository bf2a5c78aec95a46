"""What the policy gate raises when a decision does not allow: the domain's words, not HTTP's.

Each carries the decision (so the answer and the decision log can name it) and,
for a write or a preview, the write report a refused write would give.
`service.http.problems` alone turns them into problem documents.
"""

from __future__ import annotations

from service.api.reasons import primary_reason
from service.policy.trace import DecisionTrace
from store.record.reports import SessionStateWriteReport


class PolicyRefusal(Exception):
    """A decision that does not allow the request; nothing was done."""

    def __init__(
        self, trace: DecisionTrace, write_report: SessionStateWriteReport | None = None
    ) -> None:
        super().__init__(type(self).__name__)  # never a reason list: it may grow, it is in trace
        self.trace = trace
        self.write_report = write_report


class PolicyDenied(PolicyRefusal):
    """The policy said no; `reason` is the one code that leads (`primary_reason`)."""

    @property
    def reason(self) -> str:
        return primary_reason(self.trace.reasons)


class PolicyEngineUnavailable(PolicyRefusal):
    """OPA made no decision: it did not answer in time, or answered wrongly."""


class PolicyEngineRefused(PolicyEngineUnavailable):
    """OPA refused the service's token: a configuration fault, not an outage that passes."""


class PolicyDecisionUndefined(PolicyEngineUnavailable):
    """OPA answered without a decision of the decision schema: the policies must be fixed."""
