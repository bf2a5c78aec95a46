"""Every reason code is one `Reason`, documented, and answered with the status it carries."""

from __future__ import annotations

import re
from http import HTTPStatus

import pytest
from sessionstate_client.errors import BY_503_REASON

from service.api.reasons import Reason
from service.auth.tokens import AuthenticationFailed
from service.decisions.journal import JournalClosed, JournalStoreUnavailable
from service.http.problems import Problem, problem_of
from service.policy.errors import PolicyDenied, PolicyEngineRefused, PolicyEngineUnavailable
from service.policy.trace import DecisionEngine, DecisionTrace
from service.rate_limits import RateLimited, Refusal
from store.backends.contract import StoreOffline
from tests.support.paths import ROOT

DOC = ROOT / "docs" / "model-service.md"
CODE = re.compile(r"`([a-z_]+)`")


def table(header: str) -> list[list[str]]:
    """The rows of the table in docs/model-service.md whose header line is `header`."""
    lines = DOC.read_text().splitlines()
    start = lines.index(header) + 2  # past the header and its rule
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def status_table() -> dict[str, set[int]]:
    """`reason` -> the statuses the table answers it with."""
    documented: dict[str, set[int]] = {}
    for status, reason, _ in table("| status | `reason` | when |"):
        for code in CODE.findall(reason):
            documented.setdefault(code, set()).add(int(status))
    return documented


def policy_codes() -> set[str]:
    """Every code a policy can return: `contains "..."` in policies/**/*.rego."""
    return {
        code
        for path in (ROOT / "policies").rglob("*.rego")
        if not path.name.endswith("_test.rego")
        for code in re.findall(r'contains "([a-z_]+)"', path.read_text())
    }


def denied(*reasons: str) -> DecisionTrace:
    return DecisionTrace(
        decision_id="decision-1",
        action="read",
        policy="sessionstate/read",
        allow=False,
        reasons=list(reasons),
        policy_revision="sha256:" + "0" * 64,
        input_digest="sha256:" + "1" * 64,
        evaluated_at="2026-01-01T00:00:00.000Z",
        engine=DecisionEngine(version="test"),
        latency_ms=1.0,
    )


def test_every_reason_is_in_the_reason_table_with_its_status() -> None:
    documented = status_table()
    assert {reason.value: {reason.status} for reason in Reason} == {
        code: statuses for code, statuses in documented.items() if code in set(Reason)
    }
    assert set(documented) <= set(Reason), "the table names a reason the service never gives"


def test_every_code_a_policy_can_return_is_in_the_policy_code_table() -> None:
    documented = {
        code for cells in table("| code | from | meaning |") for code in CODE.findall(cells[0])
    }
    assert policy_codes() <= documented
    assert not policy_codes() & set(Reason), "a policy code would be read as the service's own"


def test_each_reason_has_a_status_http_knows_and_a_fixed_detail() -> None:
    for reason in Reason:
        assert HTTPStatus(reason.status).phrase
        assert reason.detail.endswith(".")
        assert reason.retry_after is None or reason.status == 503


def test_the_client_maps_every_503_reason_to_its_own_error() -> None:
    assert set(BY_503_REASON) == {reason for reason in Reason if reason.status == 503}


@pytest.mark.parametrize(
    ("error", "status", "reason", "headers"),
    [
        (PolicyDenied(denied("cross_session_scope_rejected", "role_not_permitted")), 403,
         "role_not_permitted", {}),
        (PolicyDenied(denied()), 403, "policy_denied", {}),
        (PolicyEngineUnavailable(denied("policy_engine_unavailable")), 503,
         "policy_engine_unavailable", {"Retry-After": "1"}),
        (PolicyEngineRefused(denied("policy_engine_refused")), 503, "policy_engine_refused",
         {"Retry-After": "60"}),
        (RateLimited(Refusal("denials", 17)), 429, "rate_limited", {"Retry-After": "17"}),
        (AuthenticationFailed(Reason.TOKEN_EXPIRED), 401, "token_expired",
         {"WWW-Authenticate": 'Bearer realm="sessionstate"'}),
        (JournalClosed("closed"), 503, "decision_log_unavailable", {}),
        (JournalStoreUnavailable("latched"), 503, "store_unavailable", {"Retry-After": "5"}),
        (StoreOffline("latched"), 503, "store_unavailable", {"Retry-After": "5"}),
        (KeyError("a stored value"), 500, "internal_error", {}),
    ],
)  # fmt: skip
def test_the_domain_s_exceptions_become_the_problems_the_contract_fixes(
    error: Exception, status: int, reason: str, headers: dict[str, str]
) -> None:
    problem = problem_of(error)
    document = problem.document()
    assert (problem.status, problem.reason, problem.headers) == (status, reason, headers)
    assert (document["status"], document["reason"]) == (status, reason)
    # A denial names the policy's code and says what every denial says.
    kind = Reason.POLICY_DENIED if isinstance(error, PolicyDenied) else Reason(reason)
    assert document["detail"] == kind.detail
    if isinstance(error, PolicyDenied | PolicyEngineUnavailable):
        assert document["decision"]["decision_id"] == "decision-1"
    else:
        assert "decision" not in document
    assert "a stored value" not in str(document)


def test_a_problem_is_its_reason_s_status_and_detail() -> None:
    for reason in Reason:
        document = Problem(reason).document()
        assert (document["status"], document["reason"]) == (reason.status, reason.value)
        assert document["type"] == f"urn:sessionstate:problem:{reason.value}"
        assert document["detail"] == reason.detail
