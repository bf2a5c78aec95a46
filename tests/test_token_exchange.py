"""Token exchange (RFC 8693) end to end: real HTTP, real OPA, real LevelDB.

A bot holds one model-service token for its tenant and workspace and obtains a
session token per session from `POST /v1/token`; every exchange, allowed or
refused, is a decision on the log; the tokens verify with the service's JWKS.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

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

from service.auth import Actor, AuthenticationFailed, TokenVerifier, mint_token
from service.context import ConfigurationError, session_token_issuer
from service.policy.sidecar import OpaSidecar
from service.reasons import Reason
from service.session_tokens import SIGNING_KEY_NAME, SigningKey
from service.token_exchange import TokenErrorDocument, TokenExchangeResponse
from store.scope import TenantScope
from store.secrets import SECRETS_DIR
from tests.factories import state_input
from tests.live import JWT_SECRET, LiveService, live_service, service_settings

GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TYPE = "urn:ietf:params:oauth:token-type:jwt"
SESSION = "/v1/tenants/{t}/workspaces/{w}/sessions/{s}"


def bot_token(service: LiveService, **overrides: Any) -> str:
    """A model service's token for tenant-a's ws-1, and no session: a bot's."""
    return service.token(**{"sub": "bot-1", "session": None, **overrides})


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
    """The decision's entry, as the tenant's auditor lists the log."""
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


def test_the_absolute_url_of_a_session_is_a_resource_too(service: LiveService) -> None:
    answer = exchange(service, bot_token(service), service.url + session_of("user-42"))
    assert answer.status_code == 200, answer.text


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
    "forged": (
        FORGED,
        session_of("user-42"),
        "invalid_request",
        "token_exchange_subject_token_invalid",
        "tenant-a",
    ),
    "expired": (
        EXPIRED,
        session_of("user-42"),
        "invalid_request",
        "token_exchange_subject_token_expired",
        "tenant-a",
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
    assert entry["target"]["tenant_id"] == tenant
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


# --- unauthenticated callers and the denial budget -------------------------------------


@pytest.fixture
def tight(sidecar: OpaSidecar, tmp_path: Path) -> Iterator[LiveService]:
    settings = service_settings(tmp_path / "var", denial_rate_limit="2/minute")
    with live_service(sidecar, settings) as live:
        yield live


def test_unauthenticated_exchanges_share_one_denial_budget(tight: LiveService) -> None:
    for _ in range(2):
        assert exchange(tight, FORGED, session_of("user-42")).status_code == 400
    limited = exchange(tight, FORGED, session_of("user-42"))
    assert limited.status_code == 429
    assert (limited.json()["error"], limited.json()["reason"]) == ("slow_down", "rate_limited")
    assert int(limited.headers["Retry-After"]) >= 1
    # A caller whose token verifies has budgets of its own.
    assert exchange(tight, bot_token(tight), session_of("user-42")).status_code == 200


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
    issued = issuer.issue(subject, scope, token_id="d-1", now=int(time.time()))
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
