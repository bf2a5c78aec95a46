"""Idle expiry end to end: a 3 s TTL, a sweep every second, real HTTP, real OPA, LevelDB and
PostgreSQL. The sweep runs on its own thread; the tests poll with a generous deadline and
time nothing. Where a session must be kept, the service's clock is the test's, moved by
hand, so "written again in between" does not depend on how fast the machine is."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from service.policy.sidecar import OpaSidecar
from store.chain.head import format_timestamp, parse_timestamp
from store.key_codec import TenantResourceLane
from tests.http.test_http_sessions import auditor, entry, read, sessions_path, versions, write
from tests.policy.test_tenant_settings import with_settings
from tests.support.factories import state_input
from tests.support.live import LiveService, live_service, service_settings

DEADLINE_SECONDS = 60.0


class HandClock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def expiring(tmp_path: Path, **overrides: Any) -> Any:
    values = {"state_idle_ttl_seconds": 3, "state_expiry_sweep_seconds": 1} | overrides
    return service_settings(tmp_path / "var", **values)


def erased_by_the_sweep(service: LiveService, session: str = "chat-1") -> dict[str, Any]:
    """The 404 problem of session once the sweep erased it."""
    return polled(lambda: read(service, session))


def polled(ask: Callable[[], Any]) -> dict[str, Any]:
    """The problem `ask` answers once it answers 404 (polled up to the deadline)."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        answer = ask()
        if answer.status_code == 404 or time.monotonic() > deadline:
            assert answer.status_code == 404, answer.text
            found: dict[str, Any] = answer.json()
            return found
        time.sleep(0.2)


def plus(timestamp: str, seconds: int) -> str:
    moment = parse_timestamp(timestamp)
    assert moment is not None
    return format_timestamp(moment + timedelta(seconds=seconds))


@pytest.fixture
def clock() -> HandClock:
    return HandClock()


@pytest.fixture
def service(sidecar: OpaSidecar, tmp_path: Path, clock: HandClock) -> Iterator[LiveService]:
    with live_service(sidecar, expiring(tmp_path), clock=clock) as live:
        yield live


def assert_expired(service: LiveService, problem: dict[str, Any], session: str) -> None:
    """The problem names the expiry, whose receipt is on the chain by `system`; no version."""
    assert problem["reason"] == "session_state_erased"
    assert problem["erasure_reason"] == "expired"
    receipt = entry(service, problem["erasure_decision_id"])
    assert receipt["actor"]["sub"] == "system"
    assert receipt["actor"]["roles"] == ["system"]
    assert receipt["input"]["erasure"]["reason"] == "expired"
    assert receipt["outcome"]["applied"] is True
    assert receipt["decision"]["allow"] is True
    assert versions(service, session).json()["reason"] == "session_state_erased"


def test_an_idle_session_is_erased_and_one_written_again_is_kept(
    service: LiveService, clock: HandClock
) -> None:
    service.approve()
    answer = service.call(
        "PUT",
        service.session_path() + "/state",
        service.token(),
        json=state_input(),
    )
    assert answer.status_code == 201, answer.text
    written_expiry = answer.json()["expires_at"]
    write(service, "chat-2")
    listed = service.call("GET", sessions_path(), service.operator()).json()["sessions"]
    assert [item["expires_at"] for item in listed] == [
        plus(item["updated_at"], 3) for item in listed
    ]
    assert listed[0]["expires_at"] == written_expiry
    assert read(service).json()["expires_at"] == written_expiry
    clock.advance(2)
    write(service, "chat-2")  # written again: its TTL starts again
    clock.advance(2)  # chat-1 idle 4 s, chat-2 2 s

    assert_expired(service, erased_by_the_sweep(service), "chat-1")
    kept = read(service, "chat-2")
    assert kept.status_code == 200, kept.text
    assert service.context.lanes.count(TenantResourceLane.SESSION_VERSION) == 2  # chat-2's
    listed = service.call("GET", sessions_path(), service.operator()).json()["sessions"]
    assert [item["session_id"] for item in listed] == ["chat-2"]
    verified = service.call("GET", "/v1/decisions/verify", auditor(service)).json()
    assert verified["ok"] is True


def test_no_ttl_no_expiry(sidecar: OpaSidecar, tmp_path: Path) -> None:
    with live_service(sidecar, service_settings(tmp_path / "var")) as live:
        assert live.context.expiry is None
        live.approve()
        write(live, "chat-1")
        assert read(live).json()["expires_at"] is None
        listed = live.call("GET", sessions_path(), live.operator()).json()["sessions"]
        assert listed[0]["expires_at"] is None


def test_a_tenant_setting_shortens_the_ttl(opa_bin: str, tmp_path: Path, clock: HandClock) -> None:
    document = {"settings": [{"tenant_id": "tenant-b", "idle_ttl_seconds": 1}]}
    sidecar = OpaSidecar(opa_bin, with_settings(tmp_path, document), tmp_path / "opa")
    sidecar.start()
    settings = expiring(tmp_path, state_idle_ttl_seconds=3600)
    try:
        with live_service(sidecar, settings, clock=clock, local_sidecar=True) as live:
            for tenant in ("tenant-a", "tenant-b"):
                on(live, tenant)
            path = sessions_path(t="tenant-b")
            (listed,) = live.call("GET", path, live.operator("tenant-b")).json()["sessions"]
            assert listed["expires_at"] == plus(listed["updated_at"], 1)
            assert tenant_read(live, "tenant-b").json()["expires_at"] == listed["expires_at"]
            clock.advance(2)
            problem = polled(lambda: tenant_read(live, "tenant-b"))
            assert problem["erasure_reason"] == "expired"
            assert tenant_read(live, "tenant-a").status_code == 200  # the deployment's hour
    finally:
        sidecar.stop()


def on(live: LiveService, tenant: str) -> None:
    approval = live.call(
        "POST",
        f"/v1/tenants/{tenant}/workspaces/ws-1/approvals",
        live.operator(tenant),
        json={"ttl_seconds": 600, "reason": "tests"},
    )
    assert approval.status_code in (200, 201), approval.text
    answer = live.call(
        "PUT",
        live.session_path(t=tenant) + "/state",
        live.token(tenant=tenant),
        json=state_input(),
    )
    assert answer.status_code == 201, answer.text


def tenant_read(live: LiveService, tenant: str) -> Any:
    return live.call("GET", live.session_path(t=tenant) + "/state", live.token(tenant=tenant))


def test_idle_expiry_on_postgresql(
    sidecar: OpaSidecar, tmp_path: Path, postgres_conninfo: str
) -> None:
    """The real clock: a session written once is erased by the sweep once idle 3 s."""
    settings = expiring(tmp_path, store=postgres_conninfo)
    with live_service(sidecar, settings) as live:
        live.approve()
        write(live, "chat-1")
        assert read(live).json()["expires_at"] is not None
        assert_expired(live, erased_by_the_sweep(live), "chat-1")
        assert live.context.lanes.count(TenantResourceLane.SESSION_VERSION) == 0


def test_a_write_landing_while_an_expiry_is_decided_is_not_erased(
    sidecar: OpaSidecar, tmp_path: Path, clock: HandClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same content written again, over HTTP, after the sweep found the session idle and
    before its erasure commits: the erasure's receipt says 412, and the session stays."""
    settings = expiring(tmp_path, state_expiry_sweep_seconds=86_400)  # the test runs the pass
    with live_service(sidecar, settings, clock=clock) as live:
        live.approve()
        write(live, "chat-1")
        clock.advance(4)
        gate = live.context.gate
        decide = gate.decide
        receipts: list[str] = []

        def write_meanwhile(*args: Any, **kwargs: Any) -> Any:
            monkeypatch.setattr(gate, "decide", decide)  # the write decides as usual
            write(live, "chat-1")
            trace, policy_input, shadow = decide(*args, **kwargs)
            receipts.append(trace.decision_id)
            return trace, policy_input, shadow

        monkeypatch.setattr(gate, "decide", write_meanwhile)
        assert live.context.expiry is not None
        assert live.context.expiry.sweep() == 0
        assert read(live).json()["version"] == 2
        (receipt,) = [entry(live, decision_id) for decision_id in receipts]
        assert receipt["actor"]["sub"] == "system"
        assert receipt["outcome"]["status"] == 412
        assert receipt["outcome"]["applied"] is False
