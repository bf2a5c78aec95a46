"""RFC 9457 problem documents: every error, with a machine-readable `reason`.

A problem never carries the caller's input: its detail is fixed text per
reason, and validation errors list field paths and rule names only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from flask import Response

from service.policy.trace import DecisionTrace
from store.reports import SessionStateWriteReport
from store.violations import FieldViolation

PROBLEM_TYPE_BASE = "urn:sessionstate:problem:"
# `validation_failed` of a query string (every error under `query`) says so, not "body".
QUERY_VALIDATION_DETAIL = "The query string breaks the rules listed in `errors`."

DETAILS: dict[str, str] = {
    "token_missing": "The request needs an `Authorization: Bearer <token>` header.",
    "token_invalid": "The bearer token is malformed, wrongly signed or of an unaccepted algorithm.",
    "token_expired": "The bearer token has expired.",
    "token_claims_invalid": "The bearer token lacks `sub`, `roles` or `exp`, has a claim out of "
    "bounds or of the wrong type (dates must be numbers), is not yet valid, "
    "or has an invalid scope claim.",
    "token_lifetime_too_long": "The bearer token lives longer than this service accepts; "
    "ask for one with a shorter lifetime.",
    "invalid_scope_id": "A tenant, workspace or session id in the path is not a valid scope id.",
    "invalid_approval_id": "The approval id in the path is not a valid approval id.",
    "malformed_request": "The request could not be read as HTTP (framing, headers or body).",
    "malformed_json": "The request body is not a single well-formed JSON document.",
    "unsupported_media_type": "The request body must be `application/json`.",
    "validation_failed": "The request body breaks the rules listed in `errors`.",
    "body_too_large": "The request body is over 1 MiB.",
    "request_target_too_long": "The request's path and query are over 8 KiB.",
    "request_headers_too_large": "The request's headers are over 16 KiB together.",
    "request_timeout": "The request body did not arrive within the server's deadline.",
    "invalid_precondition": "`If-Match` must be a quoted state digest, and `If-None-Match` only `*`.",
    "precondition_failed": "The stored state is not the version the request was based on.",
    "session_state_not_found": "No session state is stored for this scope.",
    "decision_not_found": "No decision with this id is in the decision log.",
    "chain_unverified": "The decision log does not verify, so nothing is signed for it; "
    "`GET /v1/decisions/verify` names the first problem.",
    "approval_not_found": "No such approval in this workspace.",
    "cross_site_request_rejected": "A sign-in or sign-out posted from another site is refused.",
    "decision_log_unavailable": "The decision could not be kept in the decision log; nothing was done.",
    "store_unavailable": "The store cannot be reached or cannot write now; nothing was stored. Retry later.",
    "policy_engine_unavailable": "The policy engine did not answer in time; nothing was done.",
    "policy_engine_refused": "The policy engine refused the service's credentials; nothing was "
    "done. An operator must fix the service's OPA token.",
    "rate_limited": "Too many requests, or too many denied requests, from this actor; nothing "
    "was done. Try again after `Retry-After` seconds.",
    "not_found": "No such resource.",
    "method_not_allowed": "The resource does not support this method.",
    "internal_error": "The service failed; nothing was written. The request id names it in the logs.",
}


class Problem(Exception):
    """An error answer. Raised anywhere in a request, rendered by the app's handler."""

    def __init__(
        self,
        status: int,
        reason: str,
        *,
        errors: Sequence[FieldViolation] = (),
        decision: DecisionTrace | None = None,
        write_report: SessionStateWriteReport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.errors = tuple(errors)
        self.decision = decision
        self.write_report = write_report
        self.headers = dict(headers or {})

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
        return body

    def detail(self) -> str:
        """Fixed text per reason; a query's validation errors are named as the query's."""
        in_query = all(violation.loc[:1] == ("query",) for violation in self.errors)
        if self.reason == "validation_failed" and self.errors and in_query:
            return QUERY_VALIDATION_DETAIL
        return DETAILS.get(self.reason, "The policy denied the request; see `decision.reasons`.")

    def response(self) -> Response:
        response = Response(
            json.dumps(self.document()),
            status=self.status,
            mimetype="application/problem+json",
        )
        for name, value in self.headers.items():
            response.headers[name] = value
        return response


# A denial's one `reason`: the most fundamental refusal leads. Access first (who may
# ask at all), then scope (which tenant, which session), then everything else, in the
# order the policy lists it. Codes not named here (store gates, validation blockers)
# share the last rank.
REASON_PRECEDENCE: tuple[tuple[str, ...], ...] = (
    ("role_not_permitted", "action_not_supported"),
    (
        "session_state_cross_tenant_write_rejected",
        "cross_tenant_scope_rejected",
        "session_replay_cross_tenant_rejected",
    ),
    (
        "session_state_cross_session_write_rejected",
        "cross_session_scope_rejected",
        "session_replay_cross_session_rejected",
    ),
)
_RANK = {code: rank for rank, codes in enumerate(REASON_PRECEDENCE) for code in codes}


def primary_reason(reasons: Sequence[str]) -> str:
    """The one `reason` of a denial: by `REASON_PRECEDENCE`, then the first code in order."""
    if not reasons:
        return "policy_denied"
    return min(reasons, key=lambda code: (_RANK.get(code, len(REASON_PRECEDENCE)), code))
