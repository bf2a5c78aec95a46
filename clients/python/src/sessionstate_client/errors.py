"""Typed exceptions of the client: one per status and reason the contract fixes.

Every one carries `status`, `reason` (the problem document's), `problem` (the
whole problem+json document) and `decision` (the decision trace, once the
policy was asked). A message names the status, the reason and, for a denial,
the reason codes; never a token, a body, a payload or a stored value (a
problem document holds none of those either, so keeping it whole is safe).
"""

from __future__ import annotations

import json

import httpx

from sessionstate_client.contract import DECISION_ID_HEADER, REQUEST_ID, RETRY_AFTER
from sessionstate_client.models import (
    DecisionTrace,
    FieldError,
    ProblemDocument,
    SessionStateReadReport,
    SessionStateWriteReport,
)
from sessionstate_client.retries import parse_retry_after


class SessionStateError(Exception):
    """Any failed call. `status` is None when no HTTP answer came back."""

    def __init__(
        self,
        status: int | None,
        reason: str,
        problem: ProblemDocument | None = None,
        *,
        request_id: str | None = None,
        attempts: int = 1,
    ) -> None:
        self.status = status
        self.reason = reason
        self.problem = problem
        self.request_id = request_id
        self.attempts = attempts
        super().__init__(self._message())

    @property
    def decision(self) -> DecisionTrace | None:
        """The decision that governed the refused call, once the policy was asked."""
        return None if self.problem is None else self.problem.decision

    @property
    def write_report(self) -> SessionStateWriteReport | None:
        return None if self.problem is None else self.problem.write_report

    def _message(self) -> str:
        status = "no answer" if self.status is None else f"HTTP {self.status}"
        text = f"{status}: {self.reason}"
        if self.request_id:
            text += f" (request id {self.request_id})"
        return text


class AuthenticationFailed(SessionStateError):
    """401: the token is missing, malformed, wrongly signed, expired, lacks claims or lives too long."""


class PolicyDenied(SessionStateError):
    """403: the policy (or the store's own record check) refused; nothing was done."""

    def __init__(
        self,
        status: int | None,
        reason: str,
        problem: ProblemDocument | None = None,
        *,
        request_id: str | None = None,
        attempts: int = 1,
    ) -> None:
        if problem is None or problem.decision is None:
            raise ValueError("a policy denial carries its decision")
        self._decision = problem.decision
        super().__init__(status, reason, problem, request_id=request_id, attempts=attempts)

    @property
    def decision(self) -> DecisionTrace:
        return self._decision

    @property
    def reasons(self) -> list[str]:
        """Every reason code: the write report's blockers if any, else the decision's."""
        if self.write_report is not None and self.write_report.blocked_reasons:
            return list(self.write_report.blocked_reasons)
        return list(self._decision.reasons)

    def _message(self) -> str:
        return super()._message() + f"; reasons: {', '.join(self.reasons) or 'none given'}"


class NotFound(SessionStateError):
    """404: no record for the session, no such approval or decision, or no such path."""


class PreconditionFailed(SessionStateError):
    """412: the stored version is not the one `If-Match` / `If-None-Match` named."""


class Conflict(SessionStateError):
    """409: what is stored forbids it: a fork's target holds a record (`session_state_exists`),
    a version that does not read (`session_state_version_corrupt`), a decision log that does
    not verify (`chain_unverified`). Resending it unchanged cannot help."""


class InvalidRequest(SessionStateError):
    """400, 405, 413, 415, 422 or 428: the request itself is wrong; resending it cannot help."""

    @property
    def errors(self) -> list[FieldError]:
        """On a 422: each broken rule as a field path and a rule name (never a value)."""
        return [] if self.problem is None or self.problem.errors is None else self.problem.errors

    def _message(self) -> str:
        text = super()._message()
        if self.errors:
            text += "; " + "; ".join(
                f"{'.'.join(str(part) for part in error.loc)}: {error.rule}"
                for error in self.errors
            )
        return text


class RateLimited(SessionStateError):
    """429 `rate_limited`: this actor is over its budget; nothing was done, OPA was not asked.

    `retry_after` is the service's `Retry-After` in seconds (None if it sent none):
    the call is retried within the client's retry budget when that wait is short enough.
    """

    def __init__(
        self,
        status: int | None,
        reason: str,
        problem: ProblemDocument | None = None,
        *,
        request_id: str | None = None,
        attempts: int = 1,
        retry_after: float | None = None,
    ) -> None:
        self.retry_after = retry_after
        super().__init__(status, reason, problem, request_id=request_id, attempts=attempts)

    def _message(self) -> str:
        text = super()._message()
        if self.retry_after is not None:
            text += f"; retry after {self.retry_after:g} s"
        return text


class PolicyEngineUnavailable(SessionStateError):
    """503 `policy_engine_unavailable`: OPA did not answer; nothing was done."""


class PolicyEngineRefused(PolicyEngineUnavailable):
    """503 `policy_engine_refused`: OPA refused the service's token; nothing was done.

    A configuration fault of the service, not an outage that passes: its
    `Retry-After` (60 s) is over the client's longest wait, so it is not retried.
    """


class PolicyDecisionUndefined(PolicyEngineUnavailable):
    """503 `policy_decision_undefined`: OPA answered, but the policies in force gave no
    decision for the request; nothing was done.

    A fault of the deployment's policies, not an outage that passes: its `Retry-After`
    (60 s) is over the client's longest wait, so it is not retried.
    """


class DecisionLogUnavailable(SessionStateError):
    """503 `decision_log_unavailable`: the decision could not be logged; nothing was done."""


class DecisionLogBehindSignedHead(DecisionLogUnavailable):
    """503 `decision_log_behind_signed_head`: the tenant's decision log was cut below the head
    the service signed for it, so none of the tenant's decisions is taken until an operator
    records the loss; nothing was done. Not retried (its `Retry-After` is 60 s)."""


class StoreUnavailable(SessionStateError):
    """503 `store_unavailable`: the store cannot write or be reached now; nothing was stored."""


class StoreOutcomeUnknown(SessionStateError):
    """503 `store_outcome_unknown`: the store's commit was cut off, so the call may or may
    not have been done (wholly, with its decision, or not at all).

    Never retried for a call that is not safe to repeat (a grant, an unconditional PUT).
    `decision_id` names the call's decision: `get_decision(decision_id)` (an auditor's
    token) finds its entry, with its outcome, if the call landed, and raises `NotFound`
    if it did not. A session's writer can `get_state` and compare the record instead.
    """

    def __init__(
        self,
        status: int | None,
        reason: str,
        problem: ProblemDocument | None = None,
        *,
        request_id: str | None = None,
        attempts: int = 1,
        decision_id: str | None = None,
    ) -> None:
        self.decision_id = decision_id
        super().__init__(status, reason, problem, request_id=request_id, attempts=attempts)

    def _message(self) -> str:
        text = super()._message()
        if self.decision_id:
            text += f"; decision {self.decision_id}"
        return text


class ErasureIncomplete(StoreOutcomeUnknown):
    """503 `erasure_incomplete`: the session is erased (`decision_id` names its receipt),
    but a read older than the erasure kept its bytes in the store's files. An erasure is
    safe to repeat, and a repeat removes them: it is retried, and raised after the retries.
    A `StoreOutcomeUnknown` for its `decision_id` only: here the outcome is known."""


class TokenKeysUnavailable(SessionStateError):
    """503 `token_keys_unavailable`: the identity provider's keys could not be fetched to
    verify the token; nothing was done."""


class ServiceUnavailable(SessionStateError):
    """No usable answer: connection failures or timeouts (after any retries), or another 503.

    `status` is None when no answer came back at all. A call that is not safe
    to repeat (granting an approval, an unconditional write) is never retried
    on a connection failure or a 503, so after a connection failure it may or
    may not have taken effect.
    """


class UnexpectedResponse(SessionStateError):
    """The service answered something the contract does not describe (or a 500)."""


_BY_STATUS: dict[int, type[SessionStateError]] = {
    400: InvalidRequest,
    401: AuthenticationFailed,
    403: PolicyDenied,
    404: NotFound,
    405: InvalidRequest,
    408: InvalidRequest,
    409: Conflict,
    412: PreconditionFailed,
    413: InvalidRequest,
    414: InvalidRequest,
    415: InvalidRequest,
    422: InvalidRequest,
    431: InvalidRequest,
    428: InvalidRequest,  # precondition_required: a rewind without If-Match
    429: RateLimited,
}
BY_503_REASON: dict[str, type[SessionStateError]] = {
    "policy_engine_unavailable": PolicyEngineUnavailable,
    "policy_engine_refused": PolicyEngineRefused,
    "policy_decision_undefined": PolicyDecisionUndefined,
    "decision_log_unavailable": DecisionLogUnavailable,
    "decision_log_behind_signed_head": DecisionLogBehindSignedHead,
    "store_unavailable": StoreUnavailable,
    "store_outcome_unknown": StoreOutcomeUnknown,
    "erasure_incomplete": ErasureIncomplete,
    "token_keys_unavailable": TokenKeysUnavailable,
}
"""The reasons of a 503, each with its own exception (the service's `Reason`s of status 503)."""


def error_from_response(response: httpx.Response, *, attempts: int = 1) -> SessionStateError:
    """The typed exception for an error answer (the response body must have been read)."""
    status = response.status_code
    problem = parse_problem(response.content)
    reason = problem.reason if problem is not None else f"http_{status}"
    request_id = response.headers.get(REQUEST_ID)
    if status == 503:
        kind = BY_503_REASON.get(reason, ServiceUnavailable)
    elif status == 403 and (problem is None or problem.decision is None):
        kind = UnexpectedResponse  # a denial without its decision is not this service's
    else:
        kind = _BY_STATUS.get(status, UnexpectedResponse)
    if kind is RateLimited:
        retry_after = parse_retry_after(response.headers.get(RETRY_AFTER))
        return RateLimited(
            status,
            reason,
            problem,
            request_id=request_id,
            attempts=attempts,
            retry_after=retry_after,
        )
    if kind is StoreOutcomeUnknown or kind is ErasureIncomplete:
        decision_id = response.headers.get(DECISION_ID_HEADER) or None
        return kind(
            status,
            reason,
            problem,
            request_id=request_id,
            attempts=attempts,
            decision_id=decision_id,
        )
    return kind(status, reason, problem, request_id=request_id, attempts=attempts)


def parse_problem(content: bytes) -> ProblemDocument | None:
    """The problem document in content, or None when it is not one."""
    try:
        document = json.loads(content)
        if not isinstance(document, dict):
            return None
        return ProblemDocument.model_validate(document)
    except ValueError:  # not JSON, or not a problem document (ValidationError is one)
        return None


class CorruptState(SessionStateError):
    """`GET S/state` found a record it cannot trust: `read_report` has its label and digest.

    The session does not start over on its own: replacing the record loses the
    evidence an operator may need. `ModelServiceSession(replace_corrupt=True)`
    replaces it with `If-Match: "<error_digest>"`, as the contract describes.
    """

    def __init__(self, read_report: SessionStateReadReport, *, request_id: str | None = None):
        self.read_report = read_report
        label = read_report.redacted_error.value if read_report.redacted_error else "corrupt"
        super().__init__(200, label, request_id=request_id)

    def _message(self) -> str:
        return super()._message() + f"; error digest {self.read_report.error_digest}"
