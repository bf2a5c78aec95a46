"""Token exchange (RFC 8693) end to end: real HTTP, real OPA, real LevelDB.

A bot holds one model-service token for its tenant and workspace and obtains a
session token per session from `POST /v1/token`; every exchange, allowed or
refused, is a decision on the log; the tokens verify with the service's JWKS.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from jwt import PyJWKClient
from sessionstate_client import (
    AsyncModelServiceSession,
    AsyncSessionStateClient,
    AsyncSessionTokens,
    InvalidRequest,
    ModelServiceSession,
    SessionStateClient,
    SessionTokens,
)
from sessionstate_client import TenantScope as ClientScope

from service.api.reasons import Reason
from service.auth.session_tokens import SIGNING_KEY_NAME, SigningKey
from service.auth.token_exchange import TokenErrorDocument, TokenExchangeResponse
from service.auth.tokens import Actor, AuthenticationFailed, TokenVerifier, mint_token
from service.config.check import check_settings
from service.config.configuration_error import ConfigurationError
from service.config.secret_values import session_token_issuer
from service.config.values import configured_public_origin
from service.policy.sidecar import OpaSidecar
from store.chain.head import NO_TENANT_CHAIN
from store.key_codec import TenantResourceLane
from store.scope import TenantScope
from store.secrets import SECRETS_DIR
from tests.support.factories import state_input
from tests.support.live import JWT_SECRET, LiveService, live_service, service_settings
from tests.support.served import ROOT, Served

GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TYPE = "urn:ietf:params:oauth:token-type:jwt"
SESSION = "/v1/tenants/{t}/workspaces/{w}/sessions/{s}"


def bot_token(service: LiveService, **overrides: Any) -> str:
    """A model service's token for tenant-a's ws-1, and no session: a bot's, living an hour
    (longer than the tokens it obtains)."""
    return service.token(**{"sub": "bot-1", "session": None, "ttl": 3600, **overrides})


def auditor(service: LiveService, tenant: str = "tenant-a") -> str:
    return service.token("auditor", sub="au-1", tenant=tenant, workspace=None, session=None)


def exchange(
    service: LiveService, subject_token: str | None, resource: str | None, **more: str
) -> Any:
    form = {"grant_type": GRANT, "subject_token_type": JWT_TYPE, **more}
    if subject_token is not None:
        form["subject_token"] = subject_token
    if resource is not None:
        form["resource"] = resource
    return service.http.post(service.url + "/v1/token", data=form, timeout=10)


def session_of(s: str, t: str = "tenant-a", w: str = "ws-1") -> str:
    return SESSION.format(t=t, w=w, s=s)


def logged(service: LiveService, decision_id: str, tenant: str = "tenant-a") -> dict[str, Any]:
    """The decision's entry, as the tenant's auditor lists the log (the `~no-tenant` chain,
    which no auditor reads, as the service stored it)."""
    if tenant == NO_TENANT_CHAIN:
        found = service.context.decision_log.get(NO_TENANT_CHAIN, decision_id)
        assert found is not None and found.hash_ok
        stored: dict[str, Any] = found.entry.model_dump(mode="json")
        return stored
    answer = service.call(
        "GET", "/v1/decisions?action=token.exchange&limit=100", auditor(service, tenant)
    )
    assert answer.status_code == 200, answer.text
    entries = {e["decision"]["decision_id"]: e for e in answer.json()["decisions"]}
    assert decision_id in entries
    entry: dict[str, Any] = entries[decision_id]
    return entry


# --- a bot's session token -------------------------------------------------------------


def test_a_workspace_token_obtains_a_session_token_that_acts_on_that_session_only(
    service: LiveService,
) -> None:
    answer = exchange(service, bot_token(service), session_of("user-42"))
    assert answer.status_code == 200, answer.text
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.headers["Cache-Control"] == "no-store"
    body = TokenExchangeResponse.model_validate(answer.json())
    assert (body.issued_token_type, body.token_type) == (JWT_TYPE, "Bearer")
    assert body.expires_in == 900
    assert (body.decision.action, body.decision.allow) == ("token.exchange", True)
    user_42 = body.access_token

    preview = service.call(
        "POST", session_of("user-42") + "/state/preview", user_42, json=state_input()
    )
    assert preview.status_code == 200, preview.text
    service.approve(session_id="user-42")
    written = service.call("PUT", session_of("user-42") + "/state", user_42, json=state_input())
    assert written.status_code == 201, written.text
    assert service.call("GET", session_of("user-42") + "/state", user_42).status_code == 200

    other = service.call(
        "POST", session_of("user-43") + "/state/preview", user_42, json=state_input()
    )
    assert other.status_code == 403
    assert other.json()["reason"] == "session_state_cross_session_write_rejected"
    assert service.call("GET", session_of("user-43") + "/state", user_42).status_code == 403

    entry = logged(service, body.decision.decision_id)
    assert entry["actor"]["sub"] == "bot-1"
    assert entry["target"] == {
        "tenant_id": "tenant-a",
        "workspace_id": "ws-1",
        "session_id": "user-42",
    }
    assert entry["outcome"]["status"] == 200
    assert entry["input"]["exchange"]["subject_token"] == "valid"
    assert user_42 not in json.dumps(entry)


# --- a resource's URL: under the configured public origin, never the Host header -----

PUBLIC_URL = "https://state.example.com"


@pytest.fixture
def public(sidecar: OpaSidecar, tmp_path: Path) -> Iterator[LiveService]:
    settings = service_settings(tmp_path / "var", public_url=PUBLIC_URL + "/")
    with live_service(sidecar, settings) as live:
        yield live


def exchange_as(service: LiveService, resource: str, host: str | None = None) -> Any:
    """An exchange of the bot's token for `resource`, sent with this `Host` header."""
    form = {
        "grant_type": GRANT,
        "subject_token_type": JWT_TYPE,
        "subject_token": bot_token(service),
        "resource": resource,
    }
    headers = {} if host is None else {"Host": host}
    return service.http.post(service.url + "/v1/token", data=form, headers=headers, timeout=10)


def assert_resource_malformed(answer: Any) -> None:
    assert answer.status_code == 400, answer.text
    assert (answer.json()["error"], answer.json()["reason"]) == (
        "invalid_target",
        "token_exchange_resource_malformed",
    )


def test_a_sessions_url_under_the_public_origin_is_a_resource_too(public: LiveService) -> None:
    answer = exchange_as(public, PUBLIC_URL + session_of("user-42"))
    assert answer.status_code == 200, answer.text
    assert exchange_as(public, session_of("user-42")).status_code == 200
    # The Host header names no origin: not the attacker's, not even the one it connected to.
    assert_resource_malformed(
        exchange_as(public, "http://evil.example" + session_of("user-42"), host="evil.example")
    )
    assert_resource_malformed(exchange_as(public, public.url + session_of("user-42")))
    for near in ("http://state.example.com", "https://state.example.com:8443", PUBLIC_URL + "."):
        assert_resource_malformed(exchange_as(public, near + session_of("user-42")))
    # Scheme and host in any case, the default port written or not: the same origin.
    for same in ("HTTPS://State.Example.COM", "https://state.example.com:443"):
        assert exchange_as(public, same + session_of("user-42")).status_code == 200
    assert_resource_malformed(
        exchange_as(public, "https://u@state.example.com" + session_of("user-42"))
    )


def test_without_a_public_url_only_a_sessions_path_is_a_resource(service: LiveService) -> None:
    assert exchange_as(service, session_of("user-42")).status_code == 200
    assert_resource_malformed(
        exchange_as(service, "http://evil.example" + session_of("user-42"), host="evil.example")
    )
    # The URL the request was sent to, its Host header and all: still no origin configured.
    assert_resource_malformed(exchange_as(service, service.url + session_of("user-42")))


@pytest.mark.parametrize(
    "url",
    [
        "https://state.example.com/sessionstate",
        "https://state.example.com/?a=1",
        "https://state.example.com#top",
        "https://user:secret@state.example.com",
        "ftp://state.example.com",
        "https://",
        "https://state.example.com:99999",
        "state.example.com",
    ],
)
def test_a_public_url_that_is_no_origin_stops_the_start(tmp_path: Path, url: str) -> None:
    with pytest.raises(ConfigurationError, match="SESSIONSTATE_PUBLIC_URL") as raised:
        check_settings(service_settings(tmp_path / "var", public_url=url))
    assert url not in str(raised.value) and "secret" not in str(raised.value)


def test_a_public_url_is_its_origin(tmp_path: Path) -> None:
    for url, origin in [
        ("https://State.Example.com/", "https://state.example.com"),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("https://[::1]:8443", "https://[::1]:8443"),
        ("https://state.example.com:443", "https://state.example.com"),
    ]:
        assert configured_public_origin(service_settings(tmp_path, public_url=url)) == origin
    assert configured_public_origin(service_settings(tmp_path)) is None


# --- refusals, each on the log ---------------------------------------------------------

FORGED = mint_token(
    b"another-secret-than-the-services-0123456789",
    sub="bot-1",
    roles=["model-service"],
    tenant="tenant-a",
    workspace="ws-1",
    ttl_seconds=600,
)
EXPIRED = mint_token(
    JWT_SECRET.encode(),
    sub="bot-1",
    roles=["model-service"],
    tenant="tenant-a",
    workspace="ws-1",
    ttl_seconds=60,
    now=int(time.time()) - 3600,
)
REFUSALS = {
    # name: (subject token (None: the bot's), resource, error, reason, the log's tenant)
    "another workspace": (
        None,
        session_of("user-42", w="ws-2"),
        "invalid_target",
        "cross_workspace_scope_rejected",
        "tenant-a",
    ),
    "another tenant": (
        None,
        session_of("user-42", t="tenant-b"),
        "invalid_target",
        "cross_tenant_scope_rejected",
        "tenant-b",
    ),
    # An unverified subject's request names no tenant, whatever its resource says.
    "forged": (
        FORGED,
        session_of("user-42"),
        "invalid_request",
        "token_exchange_subject_token_invalid",
        NO_TENANT_CHAIN,
    ),
    "expired": (
        EXPIRED,
        session_of("user-42"),
        "invalid_request",
        "token_exchange_subject_token_expired",
        NO_TENANT_CHAIN,
    ),
    "missing resource": (
        None,
        None,
        "invalid_request",
        "token_exchange_resource_missing",
        "tenant-a",
    ),
    "percent-escaped resource": (
        None,
        "/v1/tenants/tenant-a/workspaces/ws-1/sessions/user%2D42",
        "invalid_target",
        "token_exchange_resource_malformed",
        "tenant-a",
    ),
    "dot-dot resource": (
        None,
        "/v1/tenants/tenant-a/workspaces/ws-1/sessions/..",
        "invalid_target",
        "token_exchange_resource_malformed",
        "tenant-a",
    ),
    "another service's URL": (
        None,
        "https://elsewhere.example" + session_of("user-42"),
        "invalid_target",
        "token_exchange_resource_malformed",
        "tenant-a",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refused_exchanges_are_oauth_errors_and_on_the_log(service: LiveService, case: str) -> None:
    subject, resource, error, reason, tenant = REFUSALS[case]
    subject = subject or bot_token(service)
    answer = exchange(service, subject, resource)
    assert answer.status_code == 400, answer.text
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.headers["Cache-Control"] == "no-store"
    body = TokenErrorDocument.model_validate(answer.json())
    assert (body.error, body.reason, body.status) == (error, reason, 400)
    assert body.decision is not None and not body.decision.allow
    assert reason in body.decision.reasons
    assert subject not in answer.text and "user%2D42" not in answer.text

    entry = logged(service, body.decision.decision_id, tenant)
    assert entry["outcome"]["status"] == 400
    assert entry["decision"]["reasons"] == body.decision.reasons
    anonymous = case in ("forged", "expired")
    assert entry["actor"]["sub"] == ("anonymous" if anonymous else "bot-1")
    assert entry["target"]["tenant_id"] == (None if anonymous else tenant)
    assert subject not in json.dumps(entry) and "user%2D42" not in json.dumps(entry)


@pytest.mark.parametrize(
    ("who", "error", "reason"),
    [
        ("session", "unauthorized_client", "token_exchange_subject_scope_unsupported"),
        ("operator", "unauthorized_client", "role_not_permitted"),
        ("auditor", "unauthorized_client", "role_not_permitted"),
    ],
)
def test_session_operator_and_auditor_tokens_get_no_session_tokens(
    service: LiveService, who: str, error: str, reason: str
) -> None:
    subject = {
        "session": service.token(sub="svc-1", session="user-42"),
        "operator": service.operator(),
        "auditor": auditor(service),
    }[who]
    answer = exchange(service, subject, session_of("user-43"))
    assert answer.status_code == 400, answer.text
    body = TokenErrorDocument.model_validate(answer.json())
    assert (body.error, body.reason) == (error, reason)
    assert body.decision is not None
    if who == "session":
        assert "cross_session_scope_rejected" in body.decision.reasons
    entry = logged(service, body.decision.decision_id)
    assert entry["outcome"]["status"] == 400
    assert entry["actor"]["roles"] == [
        {"session": "model-service", "operator": "operator", "auditor": "auditor"}[who]
    ]


@pytest.mark.parametrize(
    ("form", "error", "reason"),
    [
        ({"grant_type": "client_credentials"}, "unsupported_grant_type", "token_exchange_grant_type_unsupported"),
        ({"subject_token_type": "urn:x"}, "invalid_request", "token_exchange_subject_token_type_unsupported"),
        ({"actor_token": "x", "actor_token_type": JWT_TYPE}, "invalid_request", "token_exchange_actor_token_unsupported"),
    ],
)  # fmt: skip
def test_requests_this_service_does_not_support(
    service: LiveService, form: dict[str, str], error: str, reason: str
) -> None:
    answer = exchange(service, bot_token(service), session_of("user-42"), **form)
    assert answer.status_code == 400
    assert (answer.json()["error"], answer.json()["reason"]) == (error, reason)


def test_a_json_body_or_a_repeated_parameter_is_a_malformed_request(
    service: LiveService,
) -> None:
    token = bot_token(service)
    as_json = service.http.post(
        service.url + "/v1/token",
        json={"grant_type": GRANT, "subject_token": token, "resource": session_of("user-42")},
        timeout=10,
    )
    assert as_json.status_code == 400
    assert as_json.json()["reason"] == "token_exchange_request_malformed"
    twice = service.http.post(
        service.url + "/v1/token",
        data=[
            ("grant_type", GRANT),
            ("subject_token_type", JWT_TYPE),
            ("subject_token", token),
            ("resource", session_of("user-42")),
            ("resource", session_of("user-43")),
        ],
        timeout=10,
    )
    assert twice.status_code == 400
    assert twice.json()["reason"] == "token_exchange_request_malformed"
    assert token not in as_json.text + twice.text


def test_other_methods_answer_as_oauth_errors(service: LiveService) -> None:
    answer = service.http.get(service.url + "/v1/token", timeout=10)
    assert answer.status_code == 405
    assert (answer.json()["error"], answer.json()["reason"]) == (
        "invalid_request",
        "method_not_allowed",
    )


# --- unauthenticated callers: no tenant's chain, a budget per client address ----------

ANONYMOUS_FORMS = {
    # name: the subject token (None: none sent)
    "no subject token": None,
    "forged": FORGED,
    "expired": EXPIRED,
}


def acme_entries(service: LiveService) -> int:
    """Entries on acme's chain, counted in its index (the listing would add one of its own)."""
    return sum(1 for _ in service.context.lanes.scan(TenantResourceLane.TRACE_INDEX, "acme"))


def test_anonymous_refusals_make_no_entry_on_the_chain_of_the_tenant_they_name(
    service: LiveService,
) -> None:
    acme = session_of("chat-1", t="acme")
    for subject in ANONYMOUS_FORMS.values():
        answer = exchange(service, subject, acme)
        assert answer.status_code == 400, answer.text
        entry = logged(service, answer.json()["decision"]["decision_id"], NO_TENANT_CHAIN)
        assert entry["actor"] == {"sub": "anonymous", "roles": []} | {
            name: None for name in ("tenant_id", "workspace_id", "session_id")
        }
        assert entry["target"] == {"tenant_id": None, "workspace_id": None, "session_id": None}
        assert entry["input"]["exchange"]["resource"] == "valid"
    for token in (None, FORGED, EXPIRED):  # the other routes: 401, no decision at all
        assert service.call("GET", acme + "/state", token).status_code == 401
        assert service.call("POST", acme + "/state/preview", token, json={}).status_code == 401
    assert acme_entries(service) == 0
    listed = service.call("GET", "/v1/decisions", auditor(service, "acme"))
    assert listed.status_code == 200 and listed.json()["decisions"] == []


@pytest.fixture
def tight(sidecar: OpaSidecar, tmp_path: Path) -> Iterator[LiveService]:
    settings = service_settings(tmp_path / "var", denial_rate_limit="2/minute")
    with live_service(sidecar, settings) as live:
        yield live


def from_address(address: str) -> httpx.Client:
    """A client whose requests leave from this loopback address (Linux routes 127/8 to lo,
    so 127.0.0.2 reaches a service listening on 127.0.0.1)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=10)


def exchange_from(
    url: str, address: str, subject_token: str, resource: str = session_of("user-42")
) -> httpx.Response:
    """An exchange for `resource` sent from this address to the service at `url`."""
    form = {
        "grant_type": GRANT,
        "subject_token_type": JWT_TYPE,
        "subject_token": subject_token,
        "resource": resource,
    }
    with from_address(address) as client:
        return client.post(url + "/v1/token", data=form)


def test_each_client_address_has_its_own_anonymous_budget(tight: LiveService) -> None:
    for _ in range(2):
        assert exchange_from(tight.url, "127.0.0.1", FORGED).status_code == 400
    limited = exchange_from(tight.url, "127.0.0.1", FORGED)
    assert limited.status_code == 429
    assert (limited.json()["error"], limited.json()["reason"]) == ("slow_down", "rate_limited")
    assert int(limited.headers["Retry-After"]) >= 1
    # Another address's anonymous caller is refused for what it sent, not for the flood.
    other = exchange_from(tight.url, "127.0.0.2", FORGED)
    assert (other.status_code, other.json()["reason"]) == (
        400,
        "token_exchange_subject_token_invalid",
    )
    # A caller whose token verifies has budgets of its own, from any address.
    assert exchange_from(tight.url, "127.0.0.1", bot_token(tight)).status_code == 200


@pytest.mark.slow
def test_an_anonymous_flood_from_one_address_changes_no_other_callers_answer(
    served: Served, tmp_path: Path
) -> None:
    """The attack over `sessionstate serve` (hypercorn, its OPA, LevelDB), default budgets:
    300 anonymous token requests naming acme from one address."""
    acme = session_of("chat-1", t="acme")
    answered: Counter[int] = Counter()
    form = {"grant_type": GRANT, "subject_token_type": JWT_TYPE, "subject_token": FORGED}
    with from_address("127.0.0.1") as flood:
        for _ in range(300):
            answered[
                flood.post(served.url + "/v1/token", data=form | {"resource": acme}).status_code
            ] += 1
    assert answered == {400: 20, 429: 280}  # SESSIONSTATE_DENIAL_RATE_LIMIT: 20/minute
    other = exchange_from(served.url, "127.0.0.2", FORGED, acme)
    assert (other.status_code, other.json()["reason"]) == (
        400,
        "token_exchange_subject_token_invalid",
    )
    acme_auditor = mint_token(
        JWT_SECRET.encode(), sub="au", roles=["auditor"], tenant="acme", ttl_seconds=600
    )
    listed = httpx.get(
        served.url + "/v1/decisions", headers={"Authorization": f"Bearer {acme_auditor}"}
    )
    assert listed.status_code == 200 and listed.json()["decisions"] == []

    served.process.terminate()  # its rate limit summary is appended as it stops
    assert served.process.wait(30) == 0
    exported = subprocess.run(
        [sys.executable, "-m", "service.cli", "decisions", "export", "--tenant", NO_TENANT_CHAIN],
        env={**os.environ, "SESSIONSTATE_DATA_DIR": str(served.data_dir)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    entries = [json.loads(line)["sessionstate"] for line in exported.stdout.splitlines()]
    no_target = {"tenant_id": None, "workspace_id": None, "session_id": None}
    assert [entry["target"] for entry in entries] == [no_target] * 22
    assert [entry["outcome"]["status"] for entry in entries].count(400) == 21
    (summary,) = [entry["input"] for entry in entries if entry["outcome"]["status"] == 429]
    assert (summary["kind"], summary["refused"]) == ("rate_limit_summary", 280)
    assert "127.0.0" not in exported.stdout  # no address is kept on the log


# --- the issued tokens: verifiable anywhere, short-lived -------------------------------


def test_issued_tokens_verify_with_the_published_keys(service: LiveService) -> None:
    answer = exchange(service, bot_token(service), session_of("user-42"))
    token = answer.json()["access_token"]
    keys = service.http.get(service.url + "/.well-known/jwks.json", timeout=10)
    assert keys.status_code == 200
    assert keys.headers["Cache-Control"] == "public, max-age=300"
    key = PyJWKClient(service.url + "/.well-known/jwks.json").get_signing_key_from_jwt(token)
    claims = jwt.decode(
        token, key.key, algorithms=["ES256"], audience="sessionstate", issuer="sessionstate"
    )
    assert claims["sub"] == "bot-1"
    assert claims["act"] == {"sub": "bot-1"}
    assert claims["roles"] == ["model-service"]
    assert (claims["tenant"], claims["workspace"], claims["session"]) == (
        "tenant-a",
        "ws-1",
        "user-42",
    )
    assert claims["exp"] - claims["iat"] == 900
    assert claims["jti"] == answer.json()["decision"]["decision_id"]


def test_an_exchanged_token_ends_when_its_subject_token_does(service: LiveService) -> None:
    """A leaked subject token five seconds from its end buys five seconds, not fifteen minutes."""
    now = int(time.time())
    subject = mint_token(
        JWT_SECRET.encode(),
        sub="bot-1",
        roles=["model-service"],
        tenant="tenant-a",
        workspace="ws-1",
        ttl_seconds=60,
        now=now - 55,
    )
    ends = jwt.decode(subject, options={"verify_signature": False})["exp"]
    answer = exchange(service, subject, session_of("user-42"))
    assert answer.status_code == 200, answer.text
    token = answer.json()["access_token"]
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["exp"] == ends
    assert answer.json()["expires_in"] == claims["exp"] - claims["iat"] <= 5
    assert service.call("GET", session_of("user-42") + "/state", token).status_code == 404
    while time.time() < ends:  # no assertion on durations: only on the order of events
        time.sleep(0.1)
    refused = service.call("GET", session_of("user-42") + "/state", token)
    assert (refused.status_code, refused.json()["reason"]) == (401, "token_expired")


def test_a_subject_token_ending_within_the_second_is_expired(
    sidecar: OpaSidecar, tmp_path: Path
) -> None:
    """The subject still verifies, but by the issuing clock nothing is left to issue."""

    def ahead() -> datetime:
        return datetime.now(UTC) + timedelta(seconds=30)

    with live_service(sidecar, service_settings(tmp_path / "var"), clock=ahead) as live:
        subject = bot_token(live, ttl=20)
        answer = exchange(live, subject, session_of("user-42"))
        assert answer.status_code == 400, answer.text
        assert answer.json()["reason"] == "token_exchange_subject_token_expired"
        entry = logged(live, answer.json()["decision"]["decision_id"], NO_TENANT_CHAIN)
        assert entry["actor"]["sub"] == "anonymous"


def test_issued_tokens_expire(sidecar: OpaSidecar, tmp_path: Path) -> None:
    """Issued by a service whose clock is two hours behind: already expired everywhere."""

    def behind() -> datetime:
        return datetime.now(UTC) - timedelta(hours=2)

    settings = service_settings(tmp_path / "var", token_exchange_ttl_seconds=60)
    with live_service(sidecar, settings, clock=behind) as live:
        answer = exchange(live, bot_token(live), session_of("user-42"))
        assert answer.status_code == 200, answer.text
        assert answer.json()["expires_in"] == 60
        token = answer.json()["access_token"]
        key = PyJWKClient(live.url + "/.well-known/jwks.json").get_signing_key_from_jwt(token)
        with pytest.raises(jwt.ExpiredSignatureError):
            jwt.decode(token, key.key, algorithms=["ES256"], audience="sessionstate")
        refused = live.call("GET", session_of("user-42") + "/state", token)
        assert (refused.status_code, refused.json()["reason"]) == (401, "token_expired")


# --- the service's own key -------------------------------------------------------------


def test_the_signing_key_is_generated_once_and_kept(tmp_path: Path) -> None:
    settings = service_settings(tmp_path / "var")
    first = session_token_issuer(settings)
    again = session_token_issuer(settings)
    assert first.key.kid == again.key.kid
    path = tmp_path / "var" / SECRETS_DIR / SIGNING_KEY_NAME
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_key_file_that_is_no_p256_key_is_a_configuration_error(tmp_path: Path) -> None:
    wrong = tmp_path / "key.pem"
    wrong.write_text("not a key")
    with pytest.raises(ConfigurationError, match="SESSIONSTATE_TOKEN_SIGNING_KEY_FILE") as raised:
        session_token_issuer(service_settings(tmp_path / "var", token_signing_key_file=wrong))
    assert "not a key" not in str(raised.value)
    with pytest.raises(ConfigurationError, match="MAX_LIFETIME"):
        session_token_issuer(
            service_settings(
                tmp_path / "var", token_exchange_ttl_seconds=7200, jwt_max_lifetime_seconds=3600
            )
        )


def test_the_verifier_accepts_its_own_tokens_by_kid_and_nothing_like_them(
    tmp_path: Path,
) -> None:
    issuer = session_token_issuer(service_settings(tmp_path / "var"))
    verifier = TokenVerifier(
        JWT_SECRET.encode(), own_keys=issuer.verification_keys(), own_issuer="sessionstate"
    )
    subject = Actor(sub="bot-1", roles=("model-service",), tenant_id="t", workspace_id="w")
    scope = TenantScope(tenant_id="t", workspace_id="w", session_id="s")
    now = int(time.time())
    issued = issuer.issue(subject, scope, token_id="d-1", now=now, not_after=now + 3600)
    actor = verifier.verify(f"Bearer {issued.access_token}")
    assert (actor.sub, actor.roles, actor.session_id) == ("bot-1", ("model-service",), "s")

    stranger = SigningKey(SigningKey.generated())
    claims = jwt.decode(issued.access_token, options={"verify_signature": False})
    forged = jwt.encode(
        claims, stranger._private, algorithm="ES256", headers={"kid": issuer.key.kid}
    )
    with pytest.raises(AuthenticationFailed) as refused:
        verifier.verify(f"Bearer {forged}")
    assert refused.value.reason is Reason.TOKEN_INVALID
    other_issuer = issuer.key.sign({**claims, "iss": "someone-else"})
    with pytest.raises(AuthenticationFailed) as refused:
        verifier.verify(f"Bearer {other_issuer}")
    assert refused.value.reason is Reason.TOKEN_CLAIMS_INVALID


# --- the client: a session's token, exchanged on first use and before expiry -----------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_session_tokens_exchange_on_first_use_and_again_shortly_before_expiry(
    service: LiveService,
) -> None:
    scope = ClientScope(tenant_id="tenant-a", workspace_id="ws-1", session_id="user-42")
    clock = FakeClock()
    with SessionStateClient(service.url, None) as client:
        tokens = SessionTokens(client, lambda: bot_token(service), scope, clock=clock)
        session = ModelServiceSession(client.with_token(tokens), scope, state_input())
        assert tokens.exchanges == 0  # nothing is asked before the session first sends
        session.load()
        session.replay()
        assert tokens.exchanges == 1
        first = tokens()
        clock.now += 900 - 61  # still more than a minute to go: kept
        assert tokens() == first and tokens.exchanges == 1
        clock.now += 2  # within a minute of expiry: exchanged again
        session.replay()
        assert tokens.exchanges == 2

        built = ModelServiceSession.for_service(client, bot_token(service), scope, state_input())
        assert built.load() is not None

        refused = SessionTokens(client, service.operator(), scope)
        with pytest.raises(InvalidRequest) as raised:
            ModelServiceSession(client.with_token(refused), scope, state_input()).load()
        assert raised.value.reason == "role_not_permitted"
        assert raised.value.decision is not None and not raised.value.decision.allow


def test_async_session_tokens_exchange_once_for_concurrent_first_uses(
    service: LiveService,
) -> None:
    scope = ClientScope(tenant_id="tenant-a", workspace_id="ws-1", session_id="user-42")

    async def run() -> int:
        async with AsyncSessionStateClient(service.url, None) as client:
            tokens = AsyncSessionTokens(client, bot_token(service), scope)
            session = AsyncModelServiceSession(client.with_token(tokens), scope, state_input())
            await session.load()
            await asyncio.gather(*(tokens() for _ in range(5)))
            built = AsyncModelServiceSession.for_service(
                client, bot_token(service), scope, state_input()
            )
            await built.replay()
            return tokens.exchanges

    assert asyncio.run(run()) == 1
