"""`DecisionTrace`: the policy decision that governed a response, as docs/api.md fixes it."""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from service.api.reasons import Reason
from service.policy.input import PolicyAction


class DecisionEngine(BaseModel):
    """Who decided: OPA, or (for rate limit summaries) the service itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["opa", "sessionstate"] = Field(
        default="opa",
        description="`opa`, or `sessionstate` for a decision the service made before asking OPA "
        "(a rate limit summary) or of itself (a policy activation)",
    )
    version: str = Field(max_length=64)


@cache
def service_engine() -> DecisionEngine:
    """The service itself, as the engine of what it decided without OPA."""
    try:
        release = version("sessionstate")
    except PackageNotFoundError:  # run from a source tree that was never installed
        release = "unknown"
    return DecisionEngine(name="sessionstate", version=release)


class DecisionBatch(BaseModel):
    """Where a decision was asked: in one query to OPA with others (`service.policy.grouping`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision_id: str = Field(
        max_length=64,
        description="OPA's decision id of the query that asked for this decision and the others "
        "of its batch: the `decision_id` of OPA's own decision log event",
    )
    index: int = Field(ge=0, description="this decision's place in the query's `input.batch`")
    size: int = Field(ge=2, description="how many decisions the query asked for")


# What the service decides of itself, without OPA: never asked of a policy.
ServiceAction = Literal["policy.activate"]
TraceAction = Literal[PolicyAction, ServiceAction]


class DecisionTrace(BaseModel):
    """One decision: who decided what, under which policy revision, how fast."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision_id: str = Field(
        max_length=64,
        description="OPA's decision id (local when OPA failed; `ratelimit-` for a rate limit "
        "summary); for a decision asked in a batch (`batch`), OPA's id of the query, a dot and "
        "the decision's index in it",
    )
    action: TraceAction = Field(
        description="the policy action decided; `policy.activate` for a policy activation "
        "(the `~system` chain)"
    )
    policy: str = Field(description="policy path, e.g. sessionstate/write")
    allow: bool
    reasons: list[str]
    policy_revision: str = Field(description="content hash of the loaded policy set")
    input_digest: str = Field(description="sha256 of the RFC 8785 canonical policy input")
    evaluated_at: str = Field(description="RFC 3339")
    engine: DecisionEngine
    latency_ms: float = Field(ge=0)
    trace_id: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{32}$",
        exclude_if=lambda value: value is None,
        description="the W3C trace id of the request's OpenTelemetry trace, when tracing is "
        "configured and the request was sampled; absent otherwise (docs/operators.md, Tracing)",
    )

    batch: DecisionBatch | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="when OPA decided this in one query with other decisions (docs/operators.md, "
        "Grouped decisions): that query's decision id in OPA's own log, and this decision's "
        "index in it; absent for a decision asked on its own",
    )

    @property
    def engine_unavailable(self) -> bool:
        """OPA made no decision: it did not answer, answered wrongly, refused the service, or
        the policies in force gave none (`decision_undefined`)."""
        return (
            Reason.POLICY_ENGINE_UNAVAILABLE in self.reasons
            or self.engine_refused
            or self.decision_undefined
        )

    @property
    def decision_undefined(self) -> bool:
        """OPA answered, but without a decision of the decision schema: a fault of the policies."""
        return Reason.POLICY_DECISION_UNDEFINED in self.reasons

    @property
    def engine_refused(self) -> bool:
        """OPA refused the service's token (401/403): a configuration fault, not an outage."""
        return Reason.POLICY_ENGINE_REFUSED in self.reasons
