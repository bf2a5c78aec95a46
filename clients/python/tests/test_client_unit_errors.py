"""Error answers become the client's typed exceptions, by status and by a 503's reason.

A problem+json body gives the exception its `reason`, its `problem` and, once
the policy was asked, its `decision`. A body that is not a problem document
(not JSON, cut short, or another shape) still gives the status's exception,
with `http_<status>` as its reason. Messages name the status, the reason and
the request id, and never quote the body.
"""

from __future__ import annotations

import httpx
import pytest
import sessionstate_client
from conftest import SCOPE, Scripted, decision, problem, refusal, write_report
from sessionstate_client import (
    AuthenticationFailed,
    Conflict,
    CorruptState,
    DecisionLogBehindSignedHead,
    DecisionLogUnavailable,
    ErasureIncomplete,
    InvalidRequest,
    NotFound,
    PolicyDecisionUndefined,
    PolicyDenied,
    PolicyEngineRefused,
    PolicyEngineUnavailable,
    PreconditionFailed,
    RateLimited,
    ServiceUnavailable,
    SessionStateError,
    StoreOutcomeUnknown,
    StoreUnavailable,
    TokenKeysUnavailable,
    UnexpectedResponse,
)
from sessionstate_client.errors import error_from_response, parse_problem
from sessionstate_client.models import SessionStateReadReport

CANARY = "ERROR-BODY-CANARY-91d2"

BY_STATUS = [
    (400, "invalid_precondition", InvalidRequest),
    (401, "token_expired", AuthenticationFailed),
    (404, "session_state_not_found", NotFound),
    (405, "method_not_allowed", InvalidRequest),
    (408, "request_timeout", InvalidRequest),
    (409, "session_state_exists", Conflict),
    (412, "precondition_failed", PreconditionFailed),
    (413, "body_too_large", InvalidRequest),
    (414, "uri_too_long", InvalidRequest),
    (415, "unsupported_media_type", InvalidRequest),
    (422, "validation_failed", InvalidRequest),
    (428, "precondition_required", InvalidRequest),
    (429, "rate_limited", RateLimited),
    (431, "headers_too_large", InvalidRequest),
    (500, "internal_error", UnexpectedResponse),
    (418, "teapot", UnexpectedResponse),
]
BY_503_REASON = [
    ("policy_engine_unavailable", PolicyEngineUnavailable),
    ("policy_engine_refused", PolicyEngineRefused),
    ("policy_decision_undefined", PolicyDecisionUndefined),
    ("decision_log_unavailable", DecisionLogUnavailable),
    ("decision_log_behind_signed_head", DecisionLogBehindSignedHead),
    ("store_unavailable", StoreUnavailable),
    ("store_outcome_unknown", StoreOutcomeUnknown),
    ("erasure_incomplete", ErasureIncomplete),
    ("token_keys_unavailable", TokenKeysUnavailable),
    ("some_proxy_reason", ServiceUnavailable),
]


def answered(response: httpx.Response) -> SessionStateError:
    """The error a GET of the session's state raises on this answer (no retries)."""
    with Scripted(response).sync_client(retries=0) as client:
        try:
            client.get_state(SCOPE)
        except SessionStateError as error:
            return error
    raise AssertionError("the call did not fail")


@pytest.mark.parametrize(("status", "reason", "kind"), BY_STATUS)
def test_each_status_has_its_exception(
    status: int, reason: str, kind: type[SessionStateError]
) -> None:
    error = answered(refusal(status, reason, {"X-Request-Id": "req-1"}))
    assert type(error) is kind
    assert (error.status, error.reason, error.request_id) == (status, reason, "req-1")
    assert error.problem is not None and error.problem.detail.startswith("what went wrong")
    assert error.attempts == 1
    assert str(error).startswith(f"HTTP {status}: {reason} (request id req-1)")


@pytest.mark.parametrize(("reason", "kind"), BY_503_REASON)
def test_each_reason_of_a_503_has_its_exception(reason: str, kind: type[SessionStateError]) -> None:
    error = answered(refusal(503, reason))
    assert type(error) is kind
    assert (error.status, error.reason) == (503, reason)


def test_every_exported_error_class_is_covered_here() -> None:
    exported = {
        value
        for value in vars(sessionstate_client).values()
        if isinstance(value, type) and issubclass(value, SessionStateError)
    }
    covered: set[type] = {kind for *_, kind in BY_STATUS} | {kind for _, kind in BY_503_REASON}
    covered |= {SessionStateError, PolicyDenied, CorruptState}
    assert exported == covered


def test_the_outage_families_share_their_parent() -> None:
    assert issubclass(PolicyEngineRefused, PolicyEngineUnavailable)
    assert issubclass(PolicyDecisionUndefined, PolicyEngineUnavailable)
    assert issubclass(DecisionLogBehindSignedHead, DecisionLogUnavailable)
    assert not issubclass(StoreOutcomeUnknown, StoreUnavailable)


def test_a_denial_carries_its_decision_and_every_blocked_reason() -> None:
    blocked = ["session_state_durable_writes_disabled", "session_state_operator_approval_missing"]
    body = problem(
        403,
        blocked[0],
        decision=decision("write", allow=False, reasons=["only_the_decisions_reason"]),
        write_report=write_report(False, blocked),
    )
    error = answered(httpx.Response(403, json=body))
    assert isinstance(error, PolicyDenied)
    assert error.decision.allow is False and error.decision.action == "write"
    assert error.reasons == blocked  # the write report's blockers come first
    assert error.write_report is not None and error.write_report.applied is False
    assert str(error).endswith("reasons: " + ", ".join(blocked))


def test_a_denial_without_blockers_gives_the_decisions_reasons() -> None:
    body = problem(403, "role_not_permitted", decision=decision(allow=False, reasons=[]))
    error = answered(httpx.Response(403, json=body))
    assert isinstance(error, PolicyDenied)
    assert error.reasons == [] and str(error).endswith("reasons: none given")


def test_a_403_without_a_decision_is_not_this_services_denial() -> None:
    error = answered(refusal(403, "forbidden_by_a_proxy"))
    assert type(error) is UnexpectedResponse
    assert (error.status, error.reason) == (403, "forbidden_by_a_proxy")
    with pytest.raises(ValueError, match="carries its decision"):
        PolicyDenied(403, "x", None)


def test_a_422_names_each_field_path_and_rule_but_no_value() -> None:
    errors = [{"loc": ["runtime_profile", "context_window"], "rule": "int_type"}]
    body = problem(422, "validation_failed", errors=errors, detail=CANARY)
    error = answered(httpx.Response(422, json=body))
    assert isinstance(error, InvalidRequest)
    assert [(e.loc, e.rule) for e in error.errors] == [
        (["runtime_profile", "context_window"], "int_type")
    ]
    assert str(error).endswith("; runtime_profile.context_window: int_type")
    assert CANARY not in str(error) and CANARY not in repr(error)


def test_a_rate_limit_carries_its_retry_after() -> None:
    error = answered(refusal(429, "rate_limited", {"Retry-After": "90"}))
    assert isinstance(error, RateLimited) and error.retry_after == 90.0
    assert str(error).endswith("; retry after 90 s")
    unreadable = answered(refusal(429, "rate_limited", {"Retry-After": "later"}))
    assert isinstance(unreadable, RateLimited) and unreadable.retry_after is None
    assert "retry after" not in str(unreadable)


def test_an_unknown_outcome_names_the_decision_to_look_up() -> None:
    named = answered(refusal(503, "store_outcome_unknown", {"Sessionstate-Decision-Id": "d-7"}))
    assert isinstance(named, StoreOutcomeUnknown) and named.decision_id == "d-7"
    assert str(named).endswith("; decision d-7")
    unnamed = answered(refusal(503, "store_outcome_unknown", {"Sessionstate-Decision-Id": ""}))
    assert isinstance(unnamed, StoreOutcomeUnknown) and unnamed.decision_id is None


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(CANARY.encode(), id="plain-text"),
        pytest.param(b'{"type": "t", "title": "t", "status": 404, "rea', id="truncated"),
        pytest.param(b"[1, 2, 3]", id="a-list"),
        pytest.param(b'{"reason": "only_a_reason"}', id="not-a-problem"),
        pytest.param(b"", id="empty"),
        pytest.param(b"\xff\xfe", id="not-utf8"),
    ],
)
@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (404, NotFound),
        (503, ServiceUnavailable),
        (403, UnexpectedResponse),
        (500, UnexpectedResponse),
    ],
)
def test_a_body_that_is_no_problem_document_still_gives_the_status_exception(
    body: bytes, status: int, kind: type[SessionStateError]
) -> None:
    error = answered(httpx.Response(status, content=body, headers={"Content-Type": "text/plain"}))
    assert type(error) is kind
    assert (error.status, error.reason, error.problem) == (status, f"http_{status}", None)
    assert error.decision is None and error.write_report is None
    assert CANARY not in str(error)


def test_parse_problem_accepts_only_problem_documents() -> None:
    document = parse_problem(b'{"type":"t","title":"t","status":1,"detail":"d","reason":"r","x":1}')
    assert document is not None and document.reason == "r"  # unknown members are ignored
    assert parse_problem(b"null") is None
    assert parse_problem(b'"text"') is None


def test_error_from_response_counts_the_attempts_it_is_given() -> None:
    error = error_from_response(refusal(404, "gone"), attempts=3)
    assert isinstance(error, NotFound) and error.attempts == 3


def test_a_corrupt_read_names_its_label_and_digest() -> None:
    report = SessionStateReadReport.model_validate(
        {
            "key_digest": "sha256:" + "1" * 64,
            "record": None,
            "corrupt": True,
            "redacted_error": "session_state_digest_mismatch",
            "error_digest": "sha256:" + "2" * 64,
        }
    )
    error = CorruptState(report, request_id="req-9")
    assert (error.status, error.reason) == (200, "session_state_digest_mismatch")
    assert str(error) == (
        "HTTP 200: session_state_digest_mismatch (request id req-9); error digest sha256:"
        + "2" * 64
    )
    unlabelled = CorruptState(report.model_copy(update={"redacted_error": None}))
    assert unlabelled.reason == "corrupt"


def test_no_answer_at_all_has_no_status() -> None:
    error = ServiceUnavailable(None, "connection_failed", request_id="req-2", attempts=3)
    assert str(error) == "no answer: connection_failed (request id req-2)"
    assert error.problem is None and error.decision is None
