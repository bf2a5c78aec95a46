"""Per-actor rate limits and the decision log's quota, over real HTTP with a real OPA.

An actor (token subject and tenant) over its budget gets 429 `rate_limited`
with `Retry-After`, before any policy call, and its refused requests add at
most one summary entry per window to the decision log instead of one each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from service.auth.token_exchange import ANONYMOUS
from service.config.check import check_settings
from service.config.configuration_error import ConfigurationError
from service.config.values import rate_limits
from service.context import utc_now
from service.policy.input import PolicyTarget
from service.policy.sidecar import OpaSidecar
from service.rate_limits import ActorRateLimiter, actor_key, peer_key
from store.chain.keys import chain_names
from store.key_codec import TenantResourceLane
from tests.support.factories import state_input
from tests.support.live import LiveService, live_service, service_settings
from tests.support.served import ROOT

VICTIM = "acme"
LONG_SUB = "evil-" + "x" * 123  # the longest subject a token may carry (128)


def attacker(live: LiveService, sub: str = LONG_SUB) -> str:
    """Tenant evil's model-service token: everything it asks of acme is denied."""
    return live.token(sub=sub, tenant="evil", workspace="ws-1", session="chat-1")


def auditor(live: LiveService, tenant: str = VICTIM) -> str:
    return live.token("auditor", sub="au", tenant=tenant, workspace=None, session=None)


def victim_path(n: int) -> str:
    return f"/v1/tenants/{VICTIM}/workspaces/ws-1/sessions/chat-{n % 50}/state"


def entries_of(live: LiveService, tenant: str) -> int:
    """The tenant's decision log entries, counted in the index the decision routes list."""
    return sum(1 for _ in live.context.lanes.scan(TenantResourceLane.TRACE_INDEX, tenant))


def logged(live: LiveService) -> int:
    """Entries on every decision chain together."""
    return live.context.lanes.count(TenantResourceLane.TRACE_EVIDENCE)


def metric(live: LiveService, name: str, **labels: str) -> float:
    """The sum of a counter's samples whose labels include `labels`."""
    text = live.call("GET", "/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def assert_rate_limited(answer: requests.Response) -> int:
    assert answer.status_code == 429, answer.text
    assert answer.headers["Content-Type"] == "application/problem+json"
    problem = answer.json()
    assert problem["reason"] == "rate_limited"
    assert "decision" not in problem  # OPA was not asked
    retry_after = answer.headers["Retry-After"]
    assert retry_after.isdigit() and int(retry_after) >= 1
    return int(retry_after)


def summaries(live: LiveService, tenant: str = VICTIM) -> list[dict[str, Any]]:
    answer = live.call("GET", "/v1/decisions?limit=1000", auditor(live, tenant))
    assert answer.status_code == 200, answer.text
    return [
        entry
        for entry in answer.json()["decisions"]
        if entry["decision"]["policy"] == "sessionstate/rate_limit"
    ]


@pytest.fixture
def limited(sidecar: OpaSidecar, tmp_path: Path) -> Iterator[LiveService]:
    """A service whose denial budget is 20 an hour: a flood never outlasts its window."""
    with live_service(sidecar, service_settings(tmp_path / "var", **HOURLY)) as live:
        yield live


HOURLY = {"denial_rate_limit": "20/hour"}


# --- the flood ---------------------------------------------------------------------------


def test_a_flood_of_denials_adds_the_denial_budget_and_one_summary_to_the_log(
    sidecar: OpaSidecar, tmp_path: Path
) -> None:
    settings = service_settings(tmp_path / "var", **HOURLY)
    with live_service(sidecar, settings) as live:
        token = attacker(live)
        victim_before, log_before = entries_of(live, VICTIM), logged(live)
        statuses = []
        for n in range(1000):
            answer = live.call("GET", victim_path(n), token)
            statuses.append(answer.status_code)
            if answer.status_code == 429:
                assert assert_rate_limited(answer) <= 3600
        assert statuses == [403] * 20 + [429] * 980
        # While the window is open, the refused requests added nothing at all.
        assert entries_of(live, VICTIM) - victim_before == 20
        assert logged(live) - log_before == 20
        assert all(
            live.context.journal.chain(name).verify().ok for name in chain_names(live.context.lanes)
        )
    # Closing the service appended the window's one summary; it reads like any entry.
    with live_service(sidecar, settings) as live:
        assert entries_of(live, VICTIM) - victim_before == 21
        assert logged(live) - log_before == 21
        (summary,) = summaries(live)
        assert summary["decision"]["reasons"] == ["rate_limited"]
        assert summary["decision"]["allow"] is False
        assert summary["decision"]["engine"]["name"] == "sessionstate"
        assert summary["outcome"] == {"status": 429, "applied": False, "approval_id": None}
        assert summary["actor"]["sub"] == LONG_SUB
        assert summary["actor"]["tenant_id"] == "evil"
        assert summary["target"] == {
            "tenant_id": VICTIM,
            "workspace_id": "ws-1",
            "session_id": "chat-20",  # the first refused request's
        }
        facts = summary["input"]
        assert facts["refused"] == 980
        assert facts["budgets"] == ["denials"]
        assert facts["action"] == "read"
        assert facts["first_at"] <= facts["last_at"]
        assert facts["limits"]["denials"] == "20 per 1 hour"
        assert set(facts) == {
            "kind",
            "actor",
            "action",
            "target",
            "refused",
            "budgets",
            "first_at",
            "last_at",
            "window_seconds",
            "limits",
        }
        token = auditor(live)
        one = live.call("GET", f"/v1/decisions/{summary['decision']['decision_id']}", token)
        assert one.status_code == 200
        assert one.json()["entry"] == summary
        export = live.call("GET", "/v1/decisions/export?action=read", token).text
        exported = [json.loads(line) for line in export.splitlines()]
        assert summary["decision"]["decision_id"] in {event["decision_id"] for event in exported}
        verified = live.call("GET", "/v1/decisions/verify", token).json()
        assert verified["ok"] is True


def test_a_rate_limited_request_is_refused_before_any_policy_call(limited: LiveService) -> None:
    token = attacker(limited)
    for n in range(20):
        assert limited.call("GET", victim_path(n), token).status_code == 403
    decided = metric(limited, "sessionstate_decisions_total")
    head = logged(limited)
    session = "/v1/tenants/acme/workspaces/ws-1/sessions/chat-1"
    refused = [
        limited.call("GET", session + "/state", token),
        limited.call("POST", session + "/state/preview", token, json=state_input()),
        limited.call("PUT", session + "/state", token, json=state_input()),
        limited.call("POST", session + "/replay-preview", token, json={}),
        limited.call("GET", "/v1/tenants/acme/workspaces/ws-1/approvals", token),
        limited.call("GET", "/v1/decisions?tenant_id=acme", token),
    ]
    for answer in refused:
        assert_rate_limited(answer)
    assert metric(limited, "sessionstate_decisions_total") == decided
    assert logged(limited) == head
    assert metric(limited, "sessionstate_rate_limited_total", budget="denials") == 6
    assert metric(limited, "sessionstate_rate_limited_total", budget="requests") == 0
    labels = {
        tuple(sorted(sample.labels))
        for family in text_string_to_metric_families(limited.call("GET", "/metrics").text)
        for sample in family.samples
        if sample.name == "sessionstate_rate_limited_total"
    }
    assert labels == {("budget",)}  # never a subject or a tenant


def test_a_limited_actor_does_not_limit_another(limited: LiveService) -> None:
    token = attacker(limited, sub="svc-1")
    for n in range(21):
        limited.call("GET", victim_path(n), token)
    assert_rate_limited(limited.call("GET", victim_path(0), token))
    # The same subject in another tenant is another actor; so is another subject of evil.
    acme_svc = limited.token(sub="svc-1", tenant=VICTIM, workspace="ws-1", session="chat-1")
    assert limited.call("GET", victim_path(1), acme_svc).status_code == 404
    other = attacker(limited, sub="svc-2")
    assert limited.call("GET", victim_path(0), other).status_code == 403
    own = limited.session_path("evil", "ws-1", "chat-1") + "/state"
    assert limited.call("GET", own, other).status_code == 404
    assert_rate_limited(limited.call("GET", own, token))  # the limited actor, even at home


# --- what is never limited ----------------------------------------------------------------


def test_a_model_service_serving_many_sessions_is_never_limited(service: LiveService) -> None:
    """Default budgets: 300 reads of 100 sessions under one subject, back to back."""
    tokens = [service.token(sub="bot", session=f"chat-{n}") for n in range(100)]
    decided = metric(service, "sessionstate_decisions_total", action="read", outcome="allow")
    paths = [service.session_path(s=f"chat-{n}") + "/state" for n in range(100)]
    statuses = {
        service.call("GET", paths[n % 100], tokens[n % 100]).status_code for n in range(300)
    }
    assert statuses == {404}  # allowed, nothing stored yet
    after = metric(service, "sessionstate_decisions_total", action="read", outcome="allow")
    assert after - decided == 300
    assert metric(service, "sessionstate_rate_limited_total") == 0


def test_denials_inside_the_actors_own_scope_do_not_spend_the_denial_budget(
    default_service: LiveService,
) -> None:
    """Durable writes off: every write is denied and the client falls back to previews."""
    live = default_service
    path = live.session_path()
    for _ in range(30):  # more than the default 20 denials a minute
        denied = live.call("PUT", path + "/state", live.token(), json=state_input())
        assert denied.status_code == 403
        assert denied.json()["reason"] == "session_state_durable_writes_disabled"
        previewed = live.call("POST", path + "/state/preview", live.token(), json=state_input())
        assert previewed.status_code == 200
    assert metric(live, "sessionstate_rate_limited_total") == 0


# --- the request budget, and the summary's window ----------------------------------------


def test_the_request_budget_refuses_with_retry_after(sidecar: OpaSidecar, tmp_path: Path) -> None:
    settings = service_settings(tmp_path / "var", rate_limit="5/hour", denial_rate_limit="off")
    with live_service(sidecar, settings) as live:
        token = live.token()
        for _ in range(5):
            assert live.call("GET", live.session_path() + "/state", token).status_code == 404
        assert assert_rate_limited(live.call("GET", live.session_path() + "/state", token)) >= 1
        assert metric(live, "sessionstate_rate_limited_total", budget="requests") == 1
        auditor_token = auditor(live, "tenant-a")
        assert live.call("GET", "/v1/decisions", auditor_token).status_code == 200


class SteppedClock:
    """The service's clock, moved on by the test: summary windows end when it says."""

    def __init__(self) -> None:
        self.offset = timedelta()
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return utc_now() + self.offset

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.offset += timedelta(seconds=seconds)


def wait_for(condition: Any, what: str) -> None:
    """Wait for the service's timer to act; the deadline only stops a hung test."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_a_summary_is_appended_when_its_window_ends(sidecar: OpaSidecar, tmp_path: Path) -> None:
    clock = SteppedClock()
    settings = service_settings(tmp_path / "var", denial_rate_limit="1/minute")
    with live_service(sidecar, settings, clock=clock) as live:
        token = attacker(live)
        assert live.call("GET", victim_path(0), token).status_code == 403
        for n in range(1, 6):
            assert_rate_limited(live.call("GET", victim_path(n), token))
        base = entries_of(live, VICTIM)
        clock.advance(61)  # the summary window (60 s, the longest configured) has ended
        wait_for(lambda: entries_of(live, VICTIM) == base + 1, "the first summary")
        (first,) = summaries(live)
        assert first["input"]["refused"] == 5
        assert first["input"]["window_seconds"] == 60
        # Still limited (the budget's own window has not passed): a new summary begins.
        assert_rate_limited(live.call("GET", victim_path(7), token))
        clock.advance(61)
        assert_rate_limited(live.call("GET", victim_path(8), token))  # hands the second one over
        wait_for(lambda: len(summaries(live)) == 2, "the second summary")
        second = summaries(live)[1]
        assert second["input"]["refused"] == 1
        assert second["target"]["session_id"] == "chat-7"
        assert live.call("GET", "/v1/decisions/verify", auditor(live)).json()["ok"] is True


# --- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize("variable", ["rate_limit", "denial_rate_limit"])
@pytest.mark.parametrize("value", ["lots", "0/hour", "", "20/minute;", "-5/hour"])
def test_a_bad_budget_is_a_configuration_error_naming_the_variable(
    tmp_path: Path, variable: str, value: str
) -> None:
    settings = service_settings(tmp_path, **{variable: value})
    with pytest.raises(ConfigurationError) as error:
        check_settings(settings)
    message = str(error.value)
    assert f"SESSIONSTATE_{variable.upper()}" in message
    assert "\n" not in message
    if value:
        assert value not in message


def test_budgets_parse_or_turn_off(tmp_path: Path) -> None:
    defaults = rate_limits(service_settings(tmp_path))
    assert defaults.describe() == {
        "requests": "500 per 1 second; 15000 per 1 minute",
        "denials": "20 per 1 minute",
    }
    assert defaults.summary_window_seconds == 60
    off = rate_limits(service_settings(tmp_path, rate_limit="off", denial_rate_limit="OFF"))
    assert (off.requests, off.denials) == ((), ())
    daily = rate_limits(service_settings(tmp_path, denial_rate_limit="100/day"))
    assert daily.summary_window_seconds == 3600  # a summary is never more than an hour late


def test_anonymous_budgets_are_per_address_and_their_memory_is_bounded(tmp_path: Path) -> None:
    """The anonymous caller's budgets are its address's; the least recent address is
    forgotten, budgets and all, once more are kept than the limiter holds."""
    limiter = ActorRateLimiter(
        rate_limits(service_settings(tmp_path, denial_rate_limit="1/hour")), peers_kept=2
    )
    nowhere = PolicyTarget(tenant_id=None, workspace_id=None, session_id=None)
    for peer in ("192.0.2.1", "192.0.2.2"):
        assert limiter.admit(ANONYMOUS, peer=peer) is None
        limiter.charge_denial(ANONYMOUS, nowhere, peer=peer)
        refusal = limiter.admit(ANONYMOUS, peer=peer)
        assert refusal is not None and refusal.budget == "denials"
    assert limiter.admit(ANONYMOUS) is None  # the verified-actor key is none of theirs
    assert limiter.admit(ANONYMOUS, peer="192.0.2.2") is not None  # now the most recent
    assert limiter.admit(ANONYMOUS, peer="192.0.2.3") is None  # 192.0.2.1 is forgotten
    assert limiter.admit(ANONYMOUS, peer="192.0.2.1") is None
    assert len(limiter._peers) == 2


def test_a_client_address_is_keyed_as_one_client_holds_it() -> None:
    assert peer_key("2001:db8:1:2::1") == peer_key("2001:db8:1:2:ffff::9")  # one /64
    assert peer_key("2001:db8:1:2::1") != peer_key("2001:db8:1:3::1")
    assert peer_key("::ffff:192.0.2.1") == peer_key("192.0.2.1")
    assert peer_key("192.0.2.1") != peer_key("192.0.2.2")
    assert peer_key("") == peer_key("not an address")
    assert peer_key("192.0.2.1") != actor_key(ANONYMOUS)


def test_serve_refuses_a_bad_budget_before_starting(tmp_path: Path) -> None:
    env = {
        **{key: value for key, value in os.environ.items() if not key.startswith("SESSIONSTATE_")},
        "SESSIONSTATE_DATA_DIR": str(tmp_path),
        "SESSIONSTATE_DENIAL_RATE_LIMIT": "twenty-CANARY",
    }
    served = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert served.returncode == 2
    err = served.stderr.strip()
    assert err.startswith("sessionstate: SESSIONSTATE_DENIAL_RATE_LIMIT must be"), err
    assert "CANARY" not in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "opa").exists()  # refused before the sidecar started
