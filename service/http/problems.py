"""RFC 9457 problem documents: the one place an error becomes an HTTP answer.

The domain raises its own exceptions (a policy refusal, a rate limit, a failed
authentication, a journal or store that cannot keep a decision); `problem_of`
turns each into its problem, with the status and detail its `Reason` carries.
Routes raise `Problem` for what only HTTP knows (a missing record, a bad path).

A problem never carries the caller's input: its detail is fixed text per
reason, and validation errors list field paths and rule names only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from flask import Response, g, has_request_context
from werkzeug.exceptions import HTTPException

from service.api.reasons import QUERY_VALIDATION_DETAIL, Reason
from service.api.v1 import DECISION_ID_HEADER
from service.auth.tokens import AuthenticationFailed
from service.decisions.journal import ChainBehindSignedHead, JournalClosed
from service.policy.errors import (
    PolicyDecisionUndefined,
    PolicyDenied,
    PolicyEngineRefused,
    PolicyEngineUnavailable,
    PolicyRefusal,
)
from service.policy.trace import DecisionTrace
from service.rate_limits import RateLimited
from store.backends.contract import StoreOffline, StoreOutcomeUnknown
from store.record.reports import SessionStateWriteReport
from store.record.violations import FieldViolation
from store.session_data import Erasure

PROBLEM_TYPE_BASE = "urn:sessionstate:problem:"
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="sessionstate"'}
# What the HTTP framework itself refuses, by status; any other status keeps its number.
_FRAMEWORK_REASONS = {
    reason.status: reason
    for reason in (
        Reason.MALFORMED_REQUEST,
        Reason.NOT_FOUND,
        Reason.METHOD_NOT_ALLOWED,
        Reason.BODY_TOO_LARGE,
        Reason.UNSUPPORTED_MEDIA_TYPE,
    )
}
# The domain's exceptions that `problem_of` answers (besides `Problem` and HTTP's own).
REFUSALS: tuple[type[Exception], ...] = (
    PolicyRefusal,
    RateLimited,
    AuthenticationFailed,
    JournalClosed,
    StoreOffline,
)


class Problem(Exception):
    """An error answer. Raised anywhere in a request, rendered by the app's handler.

    `reason` gives the status and the detail; `code` replaces the code the answer
    names (a policy's own reason code on a denial), `status` the status (HTTP's own
    errors that have no code of their own).
    """

    def __init__(
        self,
        reason: Reason,
        *,
        code: str | None = None,
        status: int | None = None,
        errors: Sequence[FieldViolation] = (),
        decision: DecisionTrace | None = None,
        write_report: SessionStateWriteReport | None = None,
        headers: Mapping[str, str] | None = None,
        erasure: Erasure | None = None,
    ) -> None:
        super().__init__(code or reason.value)
        self.kind = reason
        self.reason: str = code or reason.value
        self.status = status or reason.status
        self.errors = tuple(errors)
        self.decision = decision
        self.write_report = write_report
        self.headers = dict(headers or {})
        self.erasure = erasure
        if reason.retry_after is not None:
            self.headers.setdefault("Retry-After", str(reason.retry_after))

    def document(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": PROBLEM_TYPE_BASE + self.reason,
            "title": HTTPStatus(self.status).phrase,
            "status": self.status,
            "detail": self.detail(),
            "reason": self.reason,
        }
        if self.errors:
            body["errors"] = [violation.to_json() for violation in self.errors]
        if self.decision is not None:
            body["decision"] = self.decision.model_dump(mode="json")
        if self.write_report is not None:
            body["write_report"] = self.write_report.model_dump(mode="json")
        if self.erasure is not None:  # the tombstone's members: no content, no input
            body |= self.erasure.model_dump(mode="json")
        return body

    def detail(self) -> str:
        """Fixed text per reason; a query's validation errors are named as the query's."""
        in_query = all(violation.loc[:1] == ("query",) for violation in self.errors)
        if self.kind is Reason.VALIDATION_FAILED and self.errors and in_query:
            return QUERY_VALIDATION_DETAIL
        return self.kind.detail

    def response(self) -> Response:
        return document_response(
            self.document(), self.status, "application/problem+json", self.headers
        )


def document_response(
    document: dict[str, Any], status: int, mimetype: str, headers: Mapping[str, str]
) -> Response:
    """An answer of a JSON document, with these headers."""
    response = Response(json.dumps(document), status=status, mimetype=mimetype)
    for name, value in headers.items():
        response.headers[name] = value
    return response


def problem_of(error: Exception) -> Problem:
    """The problem an exception ends a request with; an unforeseen one is `internal_error`."""
    if isinstance(error, Problem):
        return error
    if isinstance(error, PolicyRefusal):
        return _refusal(error)
    if isinstance(error, RateLimited):
        retry_after = str(error.refusal.retry_after)
        return Problem(Reason.RATE_LIMITED, headers={"Retry-After": retry_after})
    if isinstance(error, AuthenticationFailed):
        if error.reason.status == 401:
            return Problem(error.reason, headers=CHALLENGE)
        return Problem(error.reason)  # the provider's keys could not be had: 503, Retry-After
    if isinstance(error, StoreOutcomeUnknown):  # it may have landed: name what to look up
        return Problem(Reason.STORE_OUTCOME_UNKNOWN, headers=_decision_named())
    if isinstance(error, StoreOffline):  # before JournalClosed: the journal's may be both
        return Problem(Reason.STORE_UNAVAILABLE)
    if isinstance(error, ChainBehindSignedHead):
        return Problem(Reason.DECISION_LOG_BEHIND_SIGNED_HEAD)
    if isinstance(error, JournalClosed):
        return Problem(Reason.DECISION_LOG_UNAVAILABLE)
    if isinstance(error, HTTPException):
        status = error.code or 500
        # Keep what HTTP requires of the status, e.g. `Allow` on a 405.
        kept = {
            name: value for name, value in error.get_headers() if name in {"Allow", "Retry-After"}
        }
        reason = _FRAMEWORK_REASONS.get(status, Reason.MALFORMED_REQUEST)
        return Problem(reason, status=status, headers=kept)
    return Problem(Reason.INTERNAL_ERROR)


def _decision_named() -> dict[str, str]:
    """The request's decision id, as a header: how a caller finds out whether it landed."""
    decision_id = g.get("decision_id") if has_request_context() else None
    return {DECISION_ID_HEADER: decision_id} if isinstance(decision_id, str) else {}


def _refusal(error: PolicyRefusal) -> Problem:
    if isinstance(error, PolicyEngineRefused):
        reason, code = Reason.POLICY_ENGINE_REFUSED, None
    elif isinstance(error, PolicyDecisionUndefined):
        reason, code = Reason.POLICY_DECISION_UNDEFINED, None
    elif isinstance(error, PolicyEngineUnavailable):
        reason, code = Reason.POLICY_ENGINE_UNAVAILABLE, None
    elif isinstance(error, PolicyDenied):
        reason, code = Reason.POLICY_DENIED, error.reason
    else:  # a refusal of a kind this table does not know yet: fail closed, as a denial
        reason, code = Reason.POLICY_DENIED, None
    return Problem(reason, code=code, decision=error.trace, write_report=error.write_report)
