"""Issue 9's findings, each once more against `sessionstate serve` as a real process.

The detailed specifications live beside their modules (test_rate_limits,
test_auth, test_http_no_echo_no_store, test_http_front, test_full_disk,
test_store_corruption); this module shows the same behaviour through the
process an operator runs: hypercorn, the OPA sidecar, LevelDB on disk.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
import requests

from service.auth.tokens import mint_token
from tests.support.live import JWT_SECRET
from tests.support.served import Served, start

VICTIM_SESSION = "/v1/tenants/acme/workspaces/ws-1/sessions/chat-{n}/state"
CANARY = "hunter2-served-canary"
DENIALS = 5


@pytest.fixture(scope="module")
def hardened(opa_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("hardened")
    running = start(
        opa_bin,
        tmp / "var",
        tmp,
        extra_env={"SESSIONSTATE_DENIAL_RATE_LIMIT": f"{DENIALS}/hour"},
    )
    yield running
    if running.process.poll() is None:
        running.process.terminate()
        running.process.wait(20)


def _token(sub: str, tenant: str, role: str = "model-service", **claims: object) -> str:
    scope = {"workspace": "ws-1", "session": "chat-1"} if role == "model-service" else {}
    return mint_token(
        JWT_SECRET.encode(), sub=sub, roles=[role], tenant=tenant, ttl_seconds=600, **scope
    )


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _acme_entries(served: Served) -> int:
    auditor = _bearer(_token("acme-auditor", "acme", role="auditor"))
    total, cursor = 0, None
    while True:
        page = requests.get(
            served.url + "/v1/decisions",
            params={"limit": 500, **({"cursor": cursor} if cursor else {})},
            headers=auditor,
            timeout=10,
        ).json()
        total += len(page["decisions"])
        cursor = page.get("next_cursor")
        if not cursor:
            return total


def test_a_flood_from_another_tenant_grows_the_victims_log_by_a_bounded_number(
    hardened: Served,
) -> None:
    before = _acme_entries(hardened)
    http = requests.Session()
    evil = _bearer(_token("evil-bot-" + "x" * 119, "evil"))
    statuses: dict[int, int] = {}
    for n in range(300):
        answer = http.get(hardened.url + VICTIM_SESSION.format(n=n % 20), headers=evil, timeout=10)
        statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
        if answer.status_code == 429:
            assert answer.json()["reason"] == "rate_limited"
            assert int(answer.headers["Retry-After"]) >= 1
    assert statuses == {403: DENIALS, 429: 300 - DENIALS}
    # The denials, plus their reads' own auditor entries: nothing per refused request.
    grown = _acme_entries(hardened) - before
    assert grown <= DENIALS + 2, grown


def test_a_string_exp_and_a_lifetime_beyond_the_maximum_are_refused(hardened: Served) -> None:
    now = int(time.time())
    base = {"sub": "svc", "roles": ["model-service"], "tenant": "t", "workspace": "w"}
    for claims, reason in (
        ({"exp": str(now + 600)}, "token_claims_invalid"),
        ({"exp": 10**30}, "token_lifetime_too_long"),
        ({"exp": now + 2 * 86400}, "token_lifetime_too_long"),
    ):
        token = jwt.encode(base | claims, JWT_SECRET.encode(), algorithm="HS256")
        answer = requests.get(
            hardened.url + "/v1/tenants/t/workspaces/w/sessions/s/state",
            headers=_bearer(token),
            timeout=10,
        )
        assert (answer.status_code, answer.json()["reason"]) == (401, reason)


def test_unknown_names_are_never_echoed_and_answers_are_not_stored(hardened: Served) -> None:
    answer = requests.post(
        hardened.url + "/v1/tenants/acme/workspaces/ws-1/sessions/chat-1/state/preview",
        json={CANARY: 1, "runtime_profile": {CANARY: 2}},
        headers=_bearer(_token("svc", "acme")),
        timeout=10,
    )
    assert answer.status_code == 422
    assert CANARY not in answer.text and CANARY not in str(answer.headers)
    assert answer.headers["Cache-Control"] == "no-store"
    read = requests.get(
        hardened.url + "/v1/tenants/acme/workspaces/ws-1/sessions/chat-1/state",
        headers=_bearer(_token("svc2", "acme")),
        timeout=10,
    )
    assert read.headers["Cache-Control"] == "no-store"


def test_readiness_names_what_is_not_ready_and_reports_a_writable_store(
    hardened: Served, tmp_path: Path
) -> None:
    body = requests.get(hardened.url + "/readyz", timeout=10).json()
    assert body["ready"] is True and body["store_writable"] is True and body["reasons"] == []
