"""Bearer-token authentication: only tokens signed with the key their algorithm is tied to."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from service.auth.tokens import Actor, AuthenticationFailed, TokenVerifier, mint_token

SECRET = b"s" * 32
SUB = "sub-canary-5e1f"
TENANT = "tenant-canary-77"


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def public_pem(rsa_key: rsa.RSAPrivateKey) -> bytes:
    return rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@pytest.fixture
def verifier(public_pem: bytes) -> TokenVerifier:
    return TokenVerifier(SECRET, public_pem)


def claims(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "sub": SUB,
        "roles": ["model-service"],
        "exp": int(time.time()) + 300,
        "tenant": TENANT,
        "workspace": "ws-1",
        "session": "chat-1",
    }
    body.update(overrides)
    return {name: value for name, value in body.items() if value is not ...}


def hs256(body: dict[str, Any], secret: bytes = SECRET) -> str:
    return jwt.encode(body, secret, algorithm="HS256")


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def hand_signed(header: dict[str, Any], body: dict[str, Any], secret: bytes | None) -> str:
    """A token built by hand: what an attacker sends, past any library's encode checks."""
    signing_input = b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(body).encode())
    if secret is None:
        return signing_input + "."
    mac = hmac.new(secret, signing_input.encode("ascii"), hashlib.sha256).digest()
    return signing_input + "." + b64url(mac)


def bearer(token: str) -> str:
    return "Bearer " + token


def failure_of(verifier: TokenVerifier, header: str | None) -> AuthenticationFailed:
    with pytest.raises(AuthenticationFailed) as caught:
        verifier.verify(header)
    return caught.value


def test_hs256_token_yields_its_actor(verifier: TokenVerifier) -> None:
    actor = verifier.verify(bearer(hs256(claims())))
    assert actor == Actor(
        sub=SUB,
        roles=("model-service",),
        tenant_id=TENANT,
        workspace_id="ws-1",
        session_id="chat-1",
    )


def test_rs256_token_verifies_with_the_configured_public_key(
    verifier: TokenVerifier, rsa_key: rsa.RSAPrivateKey
) -> None:
    token = jwt.encode(claims(roles=["operator"], session=...), rsa_key, algorithm="RS256")
    actor = verifier.verify(bearer(token))
    assert actor.roles == ("operator",)
    assert actor.session_id is None


def test_minted_token_round_trips(verifier: TokenVerifier) -> None:
    token = mint_token(
        SECRET, sub=SUB, roles=["auditor", "operator"], tenant=TENANT, ttl_seconds=60
    )
    actor = verifier.verify(bearer(token))
    assert actor.sub == SUB
    assert actor.roles == ("auditor", "operator")
    assert (actor.tenant_id, actor.workspace_id, actor.session_id) == (TENANT, None, None)


def test_minted_token_carries_exp_and_iat_from_now() -> None:
    token = mint_token(SECRET, sub=SUB, roles=[], ttl_seconds=90, now=1_000)
    body = jwt.decode(token, SECRET, algorithms=["HS256"], options={"verify_exp": False})
    assert body == {"sub": SUB, "roles": [], "iat": 1_000, "exp": 1_090}
    assert jwt.get_unverified_header(token)["alg"] == "HS256"


@pytest.mark.parametrize("ttl", [0, -1, 31_536_001])
def test_mint_token_rejects_ttl_out_of_bounds(ttl: int) -> None:
    with pytest.raises(ValueError):
        mint_token(SECRET, sub=SUB, roles=[], ttl_seconds=ttl)


def test_empty_roles_authenticate_and_leave_the_denial_to_policy(verifier: TokenVerifier) -> None:
    assert verifier.verify(bearer(hs256(claims(roles=[])))).roles == ()


def test_alg_none_is_rejected(verifier: TokenVerifier) -> None:
    token = hand_signed({"alg": "none", "typ": "JWT"}, claims(), secret=None)
    assert failure_of(verifier, bearer(token)).reason == "token_invalid"


def test_wrong_signature_is_rejected(verifier: TokenVerifier) -> None:
    token = hs256(claims(), secret=b"x" * 32)
    assert failure_of(verifier, bearer(token)).reason == "token_invalid"


def test_hs256_signed_with_the_public_key_is_rejected(
    verifier: TokenVerifier, public_pem: bytes
) -> None:
    """Algorithm confusion: the public key is public, so it must never act as an HMAC secret."""
    token = hand_signed({"alg": "HS256", "typ": "JWT"}, claims(), secret=public_pem)
    assert failure_of(verifier, bearer(token)).reason == "token_invalid"


def test_rs256_is_rejected_when_no_public_key_is_configured(rsa_key: rsa.RSAPrivateKey) -> None:
    token = jwt.encode(claims(), rsa_key, algorithm="RS256")
    assert failure_of(TokenVerifier(SECRET), bearer(token)).reason == "token_invalid"


def test_other_hmac_algorithms_are_rejected_even_with_the_right_secret(
    verifier: TokenVerifier,
) -> None:
    token = jwt.encode(claims(), SECRET * 2, algorithm="HS512")
    assert failure_of(verifier, bearer(token)).reason == "token_invalid"


def test_expired_token_is_rejected(verifier: TokenVerifier) -> None:
    token = hs256(claims(exp=int(time.time()) - 1))
    assert failure_of(verifier, bearer(token)).reason == "token_expired"


def test_not_yet_valid_token_is_rejected(verifier: TokenVerifier) -> None:
    token = hs256(claims(nbf=int(time.time()) + 300))
    assert failure_of(verifier, bearer(token)).reason == "token_claims_invalid"


@pytest.mark.parametrize(
    "overrides",
    [
        {"exp": ...},
        {"exp": None},
        {"sub": ...},
        {"sub": ""},
        {"sub": 42},
        {"sub": "s" * 129},
        {"roles": ["r" * 65]},
        {"roles": ...},
        {"roles": "model-service"},
        {"roles": [1]},
        {"roles": {"model-service": True}},
        {"roles": ["r"] * 17},
        {"tenant": "Tenant A"},
        {"tenant": "t\n"},
        {"workspace": " ws-1"},
        {"session": None},
        {"session": 7},
    ],
    ids=repr,
)
def test_missing_or_malformed_claims_are_rejected(
    verifier: TokenVerifier, overrides: dict[str, Any]
) -> None:
    token = hs256(claims(**overrides))
    assert failure_of(verifier, bearer(token)).reason == "token_claims_invalid"


# --- dates and lifetime, against a fixed clock ---------------------------------------------

NOW = 1_700_000_000
DAY = 86_400


def at_now(**overrides: Any) -> dict[str, Any]:
    """Claims of a token issued at NOW for five minutes, with overrides."""
    return claims(**({"iat": NOW, "exp": NOW + 300} | overrides))


@pytest.fixture
def fixed(public_pem: bytes) -> TokenVerifier:
    return TokenVerifier(SECRET, public_pem, clock=lambda: NOW)


def test_sub_and_role_names_at_their_bounds_authenticate(fixed: TokenVerifier) -> None:
    token = hs256(at_now(sub="s" * 128, roles=["r" * 64, "model-service"]))
    actor = fixed.verify(bearer(token))
    assert (len(actor.sub), len(actor.roles[0])) == (128, 64)


@pytest.mark.parametrize(
    "overrides",
    [
        {"exp": str(NOW + 300)},  # PyJWT alone takes int() of this
        {"exp": "tomorrow"},
        {"exp": True},
        {"exp": [NOW + 300]},
        {"exp": {"at": NOW + 300}},
        {"exp": float("nan")},
        {"exp": float("inf")},
        {"nbf": str(NOW - 10)},
        {"nbf": False},
        {"nbf": float("nan")},
        {"iat": str(NOW)},
        {"iat": True},
        {"iat": None},
        {"iat": float("-inf")},
    ],
    ids=repr,
)
def test_dates_must_be_json_numbers(fixed: TokenVerifier, overrides: dict[str, Any]) -> None:
    token = hand_signed({"alg": "HS256", "typ": "JWT"}, at_now(**overrides), SECRET)
    assert failure_of(fixed, bearer(token)).reason == "token_claims_invalid"


def test_fractional_dates_are_numbers_too(fixed: TokenVerifier) -> None:
    token = hs256(at_now(iat=NOW - 0.5, nbf=NOW - 1.5, exp=NOW + 300.25))
    assert fixed.verify(bearer(token)).sub == SUB


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"exp": NOW}, "token_expired"),
        ({"exp": NOW - 0.5}, "token_expired"),
        ({"nbf": NOW + 1}, "token_claims_invalid"),
        ({"iat": NOW + 1}, "token_claims_invalid"),
    ],
    ids=repr,
)
def test_the_validity_window_is_judged_on_the_clock(
    fixed: TokenVerifier, overrides: dict[str, Any], reason: str
) -> None:
    assert failure_of(fixed, bearer(hs256(at_now(**overrides)))).reason == reason


def test_a_token_verified_before_still_expires_on_time(public_pem: bytes) -> None:
    now = [time.time()]
    verifier = TokenVerifier(SECRET, public_pem, clock=lambda: now[0])
    token = bearer(hs256(claims(exp=int(now[0]) + 300, iat=int(now[0]))))
    for _ in range(3):  # remembered after the first: the same actor each time
        assert verifier.verify(token).sub == SUB
    now[0] += 301
    assert failure_of(verifier, token).reason == "token_expired"
    tampered = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
    assert failure_of(verifier, tampered).reason == "token_invalid"


@pytest.mark.parametrize(
    "overrides",
    [
        {"iat": ..., "exp": NOW + DAY + 61},  # beyond the maximum and the 60 s leeway
        {"iat": ..., "exp": 10**30},
        {"iat": ..., "exp": 10**400},  # too large to subtract a float from
        {"iat": ..., "exp": 1e300},
        {"iat": NOW - 100, "exp": NOW - 100 + DAY + 1},  # within reach of now, but too long
        {"iat": 0, "exp": NOW + 300},
    ],
    ids=repr,
)
def test_tokens_living_longer_than_the_maximum_are_refused(
    fixed: TokenVerifier, overrides: dict[str, Any]
) -> None:
    token = hand_signed({"alg": "HS256", "typ": "JWT"}, at_now(**overrides), SECRET)
    failure = failure_of(fixed, bearer(token))
    assert failure.reason == "token_lifetime_too_long"
    assert str(failure) == "authentication failed: token_lifetime_too_long"


@pytest.mark.parametrize(
    "overrides",
    [
        {"iat": ..., "exp": NOW + DAY + 60},  # the leeway, without iat to bound it
        {"iat": NOW - 100, "exp": NOW - 100 + DAY},
        {"iat": NOW, "exp": NOW + DAY},
    ],
    ids=repr,
)
def test_tokens_at_the_maximum_lifetime_authenticate(
    fixed: TokenVerifier, overrides: dict[str, Any]
) -> None:
    assert fixed.verify(bearer(hs256(at_now(**overrides)))).sub == SUB


def test_the_maximum_lifetime_is_configurable(public_pem: bytes) -> None:
    short = TokenVerifier(SECRET, max_lifetime_seconds=600, clock=lambda: NOW)
    assert short.verify(bearer(hs256(at_now(exp=NOW + 600)))).sub == SUB
    assert failure_of(short, bearer(hs256(at_now(exp=NOW + 601)))).reason == (
        "token_lifetime_too_long"
    )


def test_a_minted_token_of_the_maximum_lifetime_authenticates(fixed: TokenVerifier) -> None:
    token = mint_token(SECRET, sub=SUB, roles=["auditor"], ttl_seconds=DAY, now=NOW)
    assert fixed.verify(bearer(token)).roles == ("auditor",)


def test_rs256_tokens_are_held_to_the_same_lifetime(
    fixed: TokenVerifier, rsa_key: rsa.RSAPrivateKey
) -> None:
    token = jwt.encode(at_now(exp=10**30), rsa_key, algorithm="RS256")
    assert failure_of(fixed, bearer(token)).reason == "token_lifetime_too_long"


@pytest.mark.parametrize("header", [None, ""])
def test_absent_header_is_token_missing(verifier: TokenVerifier, header: str | None) -> None:
    assert failure_of(verifier, header).reason == "token_missing"


@pytest.mark.parametrize(
    "header",
    ["Basic x", "Bearer", "Bearer ", "Bearer a b", "bearer abc", "Bearer  abc", "Bearer abc\n"],
)
def test_malformed_header_is_token_invalid(verifier: TokenVerifier, header: str) -> None:
    assert failure_of(verifier, header).reason == "token_invalid"


@pytest.mark.parametrize("token", ["abc", "a.b.c", "....", "e30.e30.x"])
def test_undecodable_token_is_token_invalid(verifier: TokenVerifier, token: str) -> None:
    assert failure_of(verifier, bearer(token)).reason == "token_invalid"


def test_oversize_token_is_rejected_before_decoding() -> None:
    token = hs256(claims(padding="p" * 400))
    assert TokenVerifier(SECRET, max_token_bytes=len(token)).verify(bearer(token)).sub == SUB
    small = TokenVerifier(SECRET, max_token_bytes=len(token) - 1)
    assert failure_of(small, bearer(token)).reason == "token_invalid"


def test_failures_never_reveal_the_token_or_a_claim(verifier: TokenVerifier) -> None:
    cases = [
        hs256(claims(exp=int(time.time()) - 1)),
        hs256(claims(tenant="Tenant A")),
        hs256(claims(roles="role-canary-0b2d")),
        hs256(claims(exp=10**30)),
        hs256(claims(sub=SUB * 20)),
        hs256(claims(), secret=b"x" * 32),
        hand_signed({"alg": "none"}, claims(), secret=None),
    ]
    for token in cases:
        failure = failure_of(verifier, bearer(token))
        shown = str(failure) + repr(failure) + repr(failure.args)
        parts = [part for part in token.split(".") if part]
        for secret_text in (token, *parts, SUB, TENANT, "Tenant A", "role-canary"):
            assert secret_text not in shown
        # Nothing chained either: a logged traceback shows only this exception.
        assert failure.__cause__ is None
        assert failure.__context__ is None or failure.__suppress_context__


@pytest.mark.parametrize("secret", [b"", b"short", b"s" * 31])
def test_short_hs256_secrets_are_refused(secret: bytes) -> None:
    with pytest.raises(ValueError):
        TokenVerifier(secret)


def test_a_public_key_is_refused_as_the_hs256_secret(public_pem: bytes) -> None:
    with pytest.raises(ValueError):
        TokenVerifier(public_pem)


def test_actor_converts_to_the_policy_actor() -> None:
    actor = Actor(sub=SUB, roles=("operator",), tenant_id=TENANT)
    assert actor.to_policy().model_dump() == {
        "sub": SUB,
        "roles": ["operator"],
        "tenant_id": TENANT,
        "workspace_id": None,
        "session_id": None,
    }
