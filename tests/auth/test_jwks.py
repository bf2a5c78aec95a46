"""Tokens from an identity provider (issue 16): keys from a JWKS URL, chosen by `kid`,
refreshed on rotation, with `iss` and `aud` checked. A slow or broken provider costs one
fetch at a time and stalls nothing else, and a withdrawn key stops its remembered tokens
(issue 27). Real HTTP, real OPA; the provider is a local JWKS endpoint whose keys the tests
rotate, which can hang or answer something that is no key set."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
import requests
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from service.auth.tokens import mint_token
from service.policy.sidecar import OpaSidecar
from tests.support.factories import state_input
from tests.support.live import JWT_SECRET, LiveService, live_service, service_settings
from tests.support.served import start

ISSUER = "https://idp.example.test"
AUDIENCE = "sessionstate"
PREVIEW = "/v1/tenants/tenant-a/workspaces/ws-1/sessions/chat-1/state/preview"


@dataclass
class Provider:
    """A JWKS endpoint serving whichever public keys `keys` holds now; counts its fetches.

    With `body` set it answers that instead of the key set; while `held` is clear it holds
    every fetch unanswered (`entered` is set once one is held)."""

    keys: dict[str, Any] = field(default_factory=dict)  # kid -> private key
    fetches: int = 0
    down: bool = False
    body: bytes | None = None
    trickle: bool = False  # while held, send the headers and then a byte now and then
    held: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)
    url: str = ""
    guard: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.held.set()  # not holding

    def add(self, kid: str, alg: str = "RS256") -> Any:
        key = (
            rsa.generate_private_key(public_exponent=65537, key_size=2048)
            if alg == "RS256"
            else ec.generate_private_key(ec.SECP256R1())
        )
        self.keys[kid] = key
        return key

    def jwks(self) -> bytes:
        found = []
        for kid, key in self.keys.items():
            if isinstance(key, rsa.RSAPrivateKey):
                jwk = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
                jwk["alg"] = "RS256"
            else:
                jwk = json.loads(ECAlgorithm.to_jwk(key.public_key()))
                jwk["alg"] = "ES256"
            found.append({**jwk, "kid": kid, "use": "sig"})
        return json.dumps({"keys": found}).encode()

    def token(
        self, kid: str, *, alg: str | None = None, omit: tuple[str, ...] = (), **claims: Any
    ) -> str:
        key = self.keys[kid]
        algorithm = alg or ("RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256")
        now = int(time.time())
        body: dict[str, Any] = {
            "sub": "support-bot",
            "roles": ["model-service"],
            "tenant": "tenant-a",
            "workspace": "ws-1",
            "session": "chat-1",
            "iss": ISSUER,
            "aud": AUDIENCE,
            "iat": now,
            "exp": now + 300,
            # a different text each time, so no token is already known to the verifier
            "jti": f"{kid}-{time.monotonic_ns()}",
            **claims,
        }
        for name in omit:
            body.pop(name)
        return jwt.encode(body, key, algorithm=algorithm, headers={"kid": kid})


@pytest.fixture
def provider() -> Iterator[Provider]:
    state = Provider()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with state.guard:
                state.fetches += 1
            if not state.held.is_set() and state.trickle:
                state.entered.set()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                while not state.held.wait(0.05):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                return
            if not state.held.is_set():
                state.entered.set()
                state.held.wait()
            if state.down:
                self.send_response(503)
                self.end_headers()
                return
            body = state.jwks() if state.body is None else state.body
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_port}/.well-known/jwks.json"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    state.held.set()
    server.shutdown()


def _service(sidecar: OpaSidecar, tmp_path: Path, provider: Provider, **overrides: Any) -> Any:
    settings = service_settings(
        tmp_path / "var",
        jwt_jwks_url=provider.url,
        jwt_issuer=ISSUER,
        jwt_audience=AUDIENCE,
        **({"jwt_jwks_refresh_cooldown_seconds": 0} | overrides),
    )
    return live_service(sidecar, settings)


def _preview(service: LiveService, token: str) -> tuple[int, str | None]:
    answer = service.call("POST", PREVIEW, token, json=state_input())
    reason = None if answer.ok else answer.json().get("reason")
    return answer.status_code, reason


def test_provider_tokens_verify_by_kid_and_follow_key_rotation(
    sidecar: OpaSidecar, tmp_path: Path, provider: Provider
) -> None:
    provider.add("key-1")
    provider.add("ec-1", "ES256")
    with _service(sidecar, tmp_path, provider) as service:
        assert _preview(service, provider.token("key-1")) == (200, None)
        assert _preview(service, provider.token("ec-1")) == (200, None)
        # Rotation: the provider publishes key-2 and withdraws key-1.
        provider.add("key-2")
        del provider.keys["key-1"]
        assert _preview(service, provider.token("key-2")) == (200, None)
        old = jwt.encode(
            {"sub": "x", "roles": ["model-service"], "exp": int(time.time()) + 60},
            rsa.generate_private_key(public_exponent=65537, key_size=2048),
            algorithm="RS256",
            headers={"kid": "key-1"},
        )
        assert _preview(service, old) == (401, "token_invalid")
        # The service's own HS256 tokens still verify beside the provider's.
        assert _preview(service, service.token()) == (200, None)


def test_issuer_and_audience_are_required_and_checked(
    sidecar: OpaSidecar, tmp_path: Path, provider: Provider
) -> None:
    provider.add("key-1")
    with _service(sidecar, tmp_path, provider) as service:
        assert _preview(service, provider.token("key-1")) == (200, None)
        for bad in (
            provider.token("key-1", aud="another-service"),
            provider.token("key-1", iss="https://evil.example"),
            provider.token("key-1", omit=("aud",)),
            provider.token("key-1", omit=("iss",)),
        ):
            assert _preview(service, bad) == (401, "token_claims_invalid")


def test_a_key_is_used_only_for_its_own_algorithm(
    sidecar: OpaSidecar, tmp_path: Path, provider: Provider
) -> None:
    provider.add("rsa-1")
    provider.add("ec-1", "ES256")
    with _service(sidecar, tmp_path, provider) as service:
        assert _preview(service, provider.token("rsa-1"))[0] == 200
        # An ES256 token naming the RSA key: refused, whatever its signature.
        swapped = jwt.encode(
            {"sub": "x", "roles": ["model-service"], "exp": int(time.time()) + 60},
            provider.keys["ec-1"],
            algorithm="ES256",
            headers={"kid": "rsa-1"},
        )
        assert _preview(service, swapped) == (401, "token_invalid")
        # HS256 with a provider's kid is the service's own secret's business: a wrong one fails.
        hs = jwt.encode(
            {"sub": "x", "roles": ["model-service"], "exp": int(time.time()) + 60},
            b"a-secret-that-is-not-the-service-s-own-0123",
            algorithm="HS256",
            headers={"kid": "rsa-1"},
        )
        assert _preview(service, hs) == (401, "token_invalid")


def test_unknown_kids_fetch_the_keys_at_most_once_per_cooldown(
    sidecar: OpaSidecar, tmp_path: Path, provider: Provider
) -> None:
    provider.add("key-1")
    with _service(sidecar, tmp_path, provider, jwt_jwks_refresh_cooldown_seconds=3600) as service:
        assert _preview(service, provider.token("key-1")) == (200, None)
        fetched = provider.fetches
        for index in range(20):
            provider.keys[f"junk-{index}"] = provider.keys["key-1"]
            token = provider.token(f"junk-{index}")
            del provider.keys[f"junk-{index}"]
            assert _preview(service, token) == (401, "token_invalid")
        assert provider.fetches - fetched <= 1


def test_a_provider_that_cannot_be_reached_fails_closed_with_503(
    sidecar: OpaSidecar, tmp_path: Path, provider: Provider
) -> None:
    provider.add("key-1")
    provider.down = True
    with _service(sidecar, tmp_path, provider) as service:
        service.approve()
        state = PREVIEW.removesuffix("/preview")
        answer = service.call("PUT", state, provider.token("key-1"), json=state_input())
        assert answer.status_code == 503
        assert answer.json()["reason"] == "token_keys_unavailable"
        assert answer.headers["Retry-After"] == "5"
        assert service.call("GET", state, service.token()).status_code == 404  # nothing written
        provider.down = False
        assert _preview(service, provider.token("key-1")) == (200, None)


def test_a_provider_answering_anything_but_a_key_set_is_503_never_500(
    sidecar: OpaSidecar, tmp_path: Path, provider: Provider
) -> None:
    provider.add("key-1")
    with _service(sidecar, tmp_path, provider) as service:
        for body in (
            b"<html>502 Bad Gateway</html>",  # not JSON
            b"\xff\xfe not even text",
            b"[]",  # JSON, not an object
            b'{"keys": "none"}',
            b'{"keys": []}',
            b'{"keys": [{"kty": "RSA", "kid": "key-1", "n": 5, "e": []}]}',  # no usable key
            b'{"keys": [{"kty": "oct", "kid": "key-1", "k": "c2VjcmV0", "use": "enc"}]}',
        ):
            provider.body = body
            answer = service.call("POST", PREVIEW, provider.token("key-1"), json=state_input())
            assert answer.status_code == 503, body
            assert answer.json()["reason"] == "token_keys_unavailable"
            assert answer.headers["Retry-After"] == "5"
        provider.body = None
        assert _preview(service, provider.token("key-1")) == (200, None)


def test_a_key_withdrawn_from_the_set_stops_its_remembered_tokens_after_the_cache_seconds(
    sidecar: OpaSidecar, tmp_path: Path, provider: Provider
) -> None:
    provider.add("key-1")
    provider.add("key-2")
    provider.add("key-3")
    withdrawn, kept, replaced = (provider.token(kid) for kid in ("key-1", "key-2", "key-3"))
    # The cooldown is long: only the set's expiry makes the service fetch it again.
    with _service(
        sidecar,
        tmp_path,
        provider,
        jwt_jwks_cache_seconds=1,
        jwt_jwks_refresh_cooldown_seconds=3600,
    ) as service:
        for token in (withdrawn, kept, replaced) * 2:  # the second time from what it remembers
            assert _preview(service, token) == (200, None)
        fetched = provider.fetches
        del provider.keys["key-1"]
        provider.add("key-3")  # the same kid, another key
        time.sleep(1.2)  # past SESSIONSTATE_JWT_JWKS_CACHE_SECONDS
        assert _preview(service, withdrawn) == (401, "token_invalid")
        assert _preview(service, replaced) == (401, "token_invalid")
        assert _preview(service, kept) == (200, None)
        assert provider.fetches > fetched


def _forged(kid: str, key: rsa.RSAPrivateKey) -> str:
    """An RS256 token naming a `kid` the provider never had, signed with a key of no one's."""
    claims = {"sub": "x", "roles": ["model-service"], "iss": ISSUER, "aud": AUDIENCE}
    return jwt.encode(
        {**claims, "tenant": "tenant-a", "workspace": "ws-1", "session": "chat-1"}
        | {"exp": int(time.time()) + 300},
        key,
        algorithm="RS256",
        headers={"kid": kid},
    )


def test_forged_tokens_against_a_hanging_provider_cost_one_fetch_and_stall_nothing_else(
    opa_bin: str, tmp_path: Path, provider: Provider
) -> None:
    """Issue 27, finding 1, against `sessionstate serve` (hypercorn, 16 request threads)."""
    provider.add("key-1")
    provider.held.clear()
    served = start(
        opa_bin,
        tmp_path / "var",
        tmp_path,
        extra_env={
            "SESSIONSTATE_JWT_JWKS_URL": provider.url,
            "SESSIONSTATE_JWT_ISSUER": ISSUER,
            "SESSIONSTATE_JWT_AUDIENCE": AUDIENCE,
            "SESSIONSTATE_JWT_JWKS_REFRESH_COOLDOWN_SECONDS": "3600",
            # Long enough that the fetch is still held while everything below is asked.
            "SESSIONSTATE_JWT_JWKS_TIMEOUT_MS": "30000",
        },
    )
    nobody = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def preview(token: str) -> tuple[int, str | None]:
        answer = requests.post(
            served.url + PREVIEW,
            json=state_input(),
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        )
        return answer.status_code, None if answer.ok else answer.json().get("reason")

    try:
        with ThreadPoolExecutor(40) as pool:
            forged = [pool.submit(preview, _forged(f"made-up-{n}", nobody)) for n in range(40)]
            answered: list[Future[tuple[int, str | None]]] = []
            for future in as_completed(forged):
                answered.append(future)
                if len(answered) == 39:
                    break
            # One request waits for the one fetch; the other 39 were refused at once.
            assert Counter(f.result() for f in answered) == {(503, "token_keys_unavailable"): 39}
            assert provider.entered.is_set()
            waiting = next(f for f in forged if f not in answered)
            # While that fetch is held: probes, the service's own tokens, an exchange.
            assert requests.get(served.url + "/healthz", timeout=60).status_code == 200
            own = mint_token(
                JWT_SECRET.encode(),
                sub="svc-1",
                roles=["model-service"],
                tenant="tenant-a",
                workspace="ws-1",
                session="chat-1",
                ttl_seconds=600,
            )
            assert preview(own) == (200, None)
            assert preview(_exchanged(served.url)) == (200, None)
            assert not waiting.done()
            assert provider.fetches == 1
            provider.held.set()
            # The set came, without the made-up kid.
            assert waiting.result() == (401, "token_invalid")
        # Made-up kids within the cooldown: refused, with no fetch of their own.
        for n in range(40, 50):
            assert preview(_forged(f"made-up-{n}", nobody)) == (401, "token_invalid")
        assert preview(provider.token("key-1")) == (200, None)
        assert provider.fetches == 1
    finally:
        provider.held.set()
        served.process.terminate()
        served.process.wait(20)


def _exchanged(url: str) -> str:
    """A session token from `POST /v1/token` for a bot's own HS256 token."""
    bot = mint_token(
        JWT_SECRET.encode(),
        sub="bot-1",
        roles=["model-service"],
        tenant="tenant-a",
        workspace="ws-1",
        ttl_seconds=600,
    )
    form = {
        "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "subject_token": bot,
        "resource": PREVIEW.removesuffix("/state/preview"),
    }
    answer = requests.post(url + "/v1/token", data=form, timeout=60)
    assert answer.status_code == 200, answer.text
    token: str = answer.json()["access_token"]
    return token


def test_a_failed_fetch_starts_the_cooldown_as_a_successful_one_does(
    sidecar: OpaSidecar, tmp_path: Path, provider: Provider
) -> None:
    provider.add("key-1")
    provider.down = True
    with _service(sidecar, tmp_path, provider, jwt_jwks_refresh_cooldown_seconds=3600) as service:
        for _ in range(10):
            assert _preview(service, provider.token("key-1")) == (503, "token_keys_unavailable")
        assert provider.fetches == 1
        # Tokens of the service's own keys never needed the provider.
        assert _preview(service, service.token()) == (200, None)


def test_a_set_getting_old_is_fetched_again_while_requests_go_on_with_it(
    sidecar: OpaSidecar, tmp_path: Path, provider: Provider
) -> None:
    provider.add("key-1")
    with _service(sidecar, tmp_path, provider, jwt_jwks_cache_seconds=4) as service:
        assert _preview(service, provider.token("key-1")) == (200, None)
        time.sleep(2.1)  # past half the cache seconds
        provider.held.clear()
        # The set is old enough to be fetched again: this request starts that fetch, and
        # is answered with the set at hand while the provider holds the fetch.
        assert _preview(service, provider.token("key-1")) == (200, None)
        assert provider.entered.wait(10)
        assert provider.fetches == 2
        provider.held.set()


def test_a_provider_that_trickles_bytes_holds_one_fetch_never_more(
    sidecar: OpaSidecar, tmp_path: Path, provider: Provider
) -> None:
    """urllib bounds each read, not the whole fetch: a fetch given up goes on while the
    provider trickles; no other starts beside it."""
    provider.add("key-1")
    provider.trickle = True
    provider.held.clear()
    overrides = {"jwt_jwks_timeout_ms": 200, "jwt_jwks_refresh_cooldown_seconds": 0}
    with _service(sidecar, tmp_path, provider, **overrides) as service:
        try:
            for _ in range(5):
                assert _preview(service, provider.token("key-1")) == (503, "token_keys_unavailable")
                time.sleep(0.3)  # past the fetch's time: before, each of these started one
            assert provider.fetches == 1
        finally:
            provider.held.set()
