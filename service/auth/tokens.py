"""Bearer-token authentication: a verified JWT becomes an `Actor`, or fails with a reason.

The key is chosen by the token's `alg` from a fixed table (HS256 -> the shared
secret, RS256 -> the configured public key) and PyJWT is told to accept that
one algorithm only. With an identity provider's JWKS URL, an RS256 or ES256
token naming a `kid` is verified with that key of the provider's set
(`service.auth.provider_keys`: one fetch at a time, bounded, at most one per
cooldown, no request thread waiting behind another's fetch), and only if the
key's own algorithm is the token's; such tokens (and those verified with the
key file) must carry the configured `iss` and `aud`, when set. A token
verified with a provider's key is remembered only as long as the provider's
current set holds that same key under its `kid`: a key withdrawn from the set
stops its tokens once the set it was in has expired. The session
tokens the service issues itself (`service.auth.session_tokens`) are ES256 with a
`kid` of its own key: that key verifies them (a dictionary lookup, before any
JWKS), and they must name the service's own issuer as `iss` and `aud`.

Letting the token pick both the algorithm and how a key is
read is the classic algorithm-confusion hole: an HS256 token "signed" with the
public key as its secret would then verify.

The dates (`exp`, `nbf`, `iat`) are checked here rather than by PyJWT, which
takes `int()` of whatever it finds: `"1234"` passes as a date there. Here they
must be JSON numbers, and a token may live at most the configured maximum, so
a leaked token with `exp` 10^30 is not good forever.

Failures carry a reason from a fixed vocabulary and a message built from it
alone: never the token, never a claim value, never PyJWT's own message.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import jwt
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from jwt import PyJWK
from jwt import exceptions as jwt_errors
from jwt.algorithms import HMACAlgorithm
from jwt.types import Options
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.api.reasons import Reason
from service.auth.provider_keys import KeysUnavailable, ProviderKeys, UnknownKey
from service.policy.activation import OperatorIdentity
from service.policy.input import PolicyActor
from store.scope import ScopeId, is_scope_id

MIN_HS256_SECRET_BYTES = 32  # RFC 7518 §3.2: at least the size of the hash output
MIN_RSA_KEY_BITS = 2048
MAX_ROLES = 16  # as many as `PolicyActor` admits
MAX_SUB_CHARS = 128  # claim values reach the decision log: bounded well below a page
MAX_ROLE_CHARS = 64
MAX_TTL_SECONDS = 31_536_000
DEFAULT_MAX_LIFETIME_SECONDS = 86_400
# Clock skew allowed between the token's issuer and this service when judging how far
# ahead `exp` lies. Not applied to `exp - iat`, which both come from the issuer.
LIFETIME_LEEWAY_SECONDS = 60

# RFC 6750 §2.1: one space, then a b64token; no other scheme, no extra parts.
_BEARER_RE = re.compile(r"Bearer ([A-Za-z0-9\-._~+/]+=*)")

# Token claim name -> `Actor` field.
SCOPE_CLAIMS = {"tenant": "tenant_id", "workspace": "workspace_id", "session": "session_id"}


class AuthenticationFailed(Exception):
    """The request is not authenticated. The message names the reason and nothing else."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(f"authentication failed: {reason.value}")
        self.reason = reason


class Actor(BaseModel):
    """Who a verified token says is asking: its subject, roles and scope."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, hide_input_in_errors=True)

    sub: str = Field(min_length=1, max_length=MAX_SUB_CHARS)
    roles: tuple[Annotated[str, Field(max_length=MAX_ROLE_CHARS)], ...] = Field(
        max_length=MAX_ROLES
    )
    tenant_id: ScopeId | None = None
    workspace_id: ScopeId | None = None
    session_id: ScopeId | None = None

    def to_policy(self) -> PolicyActor:
        """The actor as the policy input names it."""
        return PolicyActor(
            sub=self.sub,
            roles=list(self.roles),
            tenant_id=self.tenant_id,
            workspace_id=self.workspace_id,
            session_id=self.session_id,
        )


# PyJWT errors that mean "the signature held, a claim did not".
_CLAIM_ERRORS = (
    jwt_errors.MissingRequiredClaimError,
    jwt_errors.InvalidSubjectError,
    jwt_errors.InvalidAudienceError,
    jwt_errors.InvalidIssuerError,
    jwt_errors.InvalidJTIError,
)
# PyJWT checks everything but the dates, which `_check_dates` does with stricter types.
_DECODE_OPTIONS: Options = {
    "require": ["exp"],
    "verify_exp": False,
    "verify_nbf": False,
    "verify_iat": False,
}


# Algorithms an identity provider's keys (JWKS) may verify; never a shared-secret one.
PROVIDER_ALGORITHMS = frozenset({"RS256", "ES256"})


class ProviderSettings(BaseModel):
    """The identity provider: where its keys are, and the issuer and audience its tokens
    must name (each unset: not checked)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    jwks_url: str | None = None
    issuer: str | None = None
    audience: str | None = None
    jwks_cache_seconds: int = 300
    jwks_refresh_cooldown_seconds: int = 30
    jwks_timeout_seconds: float = 2.0


VERIFIED_TOKENS_KEPT = 4096  # verified tokens remembered, the least recently used dropped


@dataclass(frozen=True)
class _Verified:
    """A token that verified: its actor, its claims, and the provider's key that verified it
    (None: one of the service's own keys, which do not change while it runs)."""

    actor: Actor
    claims: dict[str, Any]
    provider_key: PyJWK | None


class TokenVerifier:
    """Verifies `Authorization: Bearer <JWT>` headers against the configured keys."""

    def __init__(
        self,
        hs256_secret: bytes,
        rs256_public_key_pem: bytes | None = None,
        *,
        max_token_bytes: int = 8192,
        max_lifetime_seconds: int = DEFAULT_MAX_LIFETIME_SECONDS,
        clock: Callable[[], float] = time.time,
        provider: ProviderSettings | None = None,
        own_keys: Mapping[str, EllipticCurvePublicKey] | None = None,
        own_issuer: str | None = None,
    ) -> None:
        # The service's own ES256 keys by `kid`, for the session tokens it issues.
        self._own_keys = dict(own_keys or {})
        self._own_issuer = own_issuer
        if self._own_keys and not own_issuer:
            raise ValueError("the service's own keys need its issuer")
        self._keys: dict[str, bytes | RSAPublicKey] = {"HS256": _hs256_secret(hs256_secret)}
        self._provider = provider or ProviderSettings()
        self._jwks = (
            None
            if self._provider.jwks_url is None
            else ProviderKeys(
                self._provider.jwks_url,
                cache_seconds=self._provider.jwks_cache_seconds,
                cooldown_seconds=self._provider.jwks_refresh_cooldown_seconds,
                timeout_seconds=self._provider.jwks_timeout_seconds,
            )
        )
        if rs256_public_key_pem is not None:
            self._keys["RS256"] = _rs256_public_key(rs256_public_key_pem)
        self._max_token_bytes = max_token_bytes
        self._max_lifetime = max_lifetime_seconds
        self._clock = clock
        # Tokens whose signature and claims verified, by their exact text: a model service
        # sends the same token with every turn. Dates are checked again on every use, and
        # the provider's key again against the provider's current set.
        self._verified: OrderedDict[str, _Verified] = OrderedDict()
        self._verified_guard = threading.Lock()

    def verify(self, authorization_header: str | None) -> Actor:
        """The actor of a valid bearer token; raises `AuthenticationFailed` otherwise."""
        token = self._bearer_token(authorization_header)
        with self._verified_guard:
            known = self._verified.get(token)
            if known is not None:
                self._verified.move_to_end(token)
        if known is None or not self._key_still_current(known):
            claims, provider_key = self._verified_claims(token)
            known = _Verified(_actor(claims), claims, provider_key)
        _check_dates(known.claims, now=self._clock(), max_lifetime=self._max_lifetime)
        with self._verified_guard:
            self._verified[token] = known
            if len(self._verified) > VERIFIED_TOKENS_KEPT:
                self._verified.popitem(last=False)
        return known.actor

    def _key_still_current(self, known: _Verified) -> bool:
        """Whether the provider's current set still holds the key `known` was verified with
        (a key withdrawn: `AuthenticationFailed`); always, for the service's own keys."""
        verified_with = known.provider_key
        if verified_with is None:
            return True
        kid = verified_with.key_id
        assert isinstance(kid, str)  # `ProviderKeys` holds only keys with a `kid`
        current = self._provider_key(kid, verified_with.algorithm_name)
        return bool(current.key == verified_with.key)

    def operator(self, token: str) -> str:
        """Who a valid token with the `operator` role names (a `policy reload`'s); raises
        `ValueError` naming the reason, never the token, otherwise."""
        return self.operator_actor(token).sub

    def operator_actor(self, token: str) -> PolicyActor:
        """The actor a valid token with the `operator` role names (a `policy reload`'s or
        `policy approve`'s), as the policy input names it; `ValueError` otherwise."""
        return self.operator_identity(token).actor

    def operator_identity(self, token: str) -> OperatorIdentity:
        """The operator a valid token with the `operator` role names, and whether this host
        could have minted it (its HS256 secret, or its own exchange keys) or only an identity
        provider (a key of the JWKS, or of SESSIONSTATE_JWT_PUBLIC_KEY_FILE) could."""
        try:
            actor = self.verify("Bearer " + token)
        except AuthenticationFailed as failed:
            raise ValueError(failed.reason.value) from None
        if "operator" not in actor.roles:
            raise ValueError("the token has no operator role")
        header = jwt.get_unverified_header(token)  # it verified: the header is well formed
        here = header.get("alg") == "HS256" or header.get("kid") in self._own_keys
        return OperatorIdentity(actor.to_policy(), minted_here=here)

    def _bearer_token(self, header: str | None) -> str:
        if not header:
            raise AuthenticationFailed(Reason.TOKEN_MISSING)
        match = _BEARER_RE.fullmatch(header)
        if match is None or len(match.group(1)) > self._max_token_bytes:
            raise AuthenticationFailed(Reason.TOKEN_INVALID)
        return match.group(1)

    def _verified_claims(self, token: str) -> tuple[dict[str, Any], PyJWK | None]:
        """The token's claims, and the provider's key that verified them (None: a key of
        the service's own)."""
        try:
            header = jwt.get_unverified_header(token)
            algorithm, kid = header.get("alg"), header.get("kid")
            if not isinstance(algorithm, str):
                raise AuthenticationFailed(Reason.TOKEN_INVALID)
            key, issuer, audience = self._key_for(algorithm, kid)
            options: Options = {
                **_DECODE_OPTIONS,
                "require": [
                    "exp",
                    *(["iss"] if issuer is not None else []),
                    *(["aud"] if audience is not None else []),
                ],
            }
            claims = jwt.decode(
                token,
                key.key if isinstance(key, PyJWK) else key,
                algorithms=[algorithm],
                options=options,
                issuer=issuer,
                audience=audience,
            )
            return claims, key if isinstance(key, PyJWK) else None
        except _CLAIM_ERRORS:
            raise AuthenticationFailed(Reason.TOKEN_CLAIMS_INVALID) from None
        except jwt_errors.PyJWTError:  # bad encoding, bad signature
            raise AuthenticationFailed(Reason.TOKEN_INVALID) from None

    def _key_for(self, algorithm: str, kid: object) -> tuple[Any, str | None, str | None]:
        """The key that verifies a token of `algorithm` naming `kid` (the provider's: a
        `PyJWK`), and the `iss` and `aud` the token must then carry (None: not checked; a
        token with `aud` is then refused)."""
        if algorithm == "ES256" and isinstance(kid, str) and kid in self._own_keys:
            return self._own_keys[kid], self._own_issuer, self._own_issuer  # issued here
        if self._jwks is not None and isinstance(kid, str) and algorithm in PROVIDER_ALGORITHMS:
            key: Any = self._provider_key(kid, algorithm)
        elif algorithm in self._keys:
            key = self._keys[algorithm]
        else:
            raise AuthenticationFailed(Reason.TOKEN_INVALID)
        if algorithm == "HS256":  # the service's own secret: no issuer or audience
            return key, None, None
        return key, self._provider.issuer, self._provider.audience

    def _provider_key(self, kid: str, algorithm: str) -> PyJWK:
        """The provider's key `kid`, if its algorithm is the token's; fetched when unknown."""
        assert self._jwks is not None
        try:
            signing_key = self._jwks.key(kid)
        except KeysUnavailable:  # none fetched in time, or a fetch under way
            raise AuthenticationFailed(Reason.TOKEN_KEYS_UNAVAILABLE) from None
        except UnknownKey:
            raise AuthenticationFailed(Reason.TOKEN_INVALID) from None
        if signing_key.algorithm_name != algorithm:
            raise AuthenticationFailed(Reason.TOKEN_INVALID)
        return signing_key


def _numeric_date(claims: Mapping[str, Any], name: str) -> int | float | None:
    """RFC 7519's NumericDate: a JSON number. Not a string of digits, not a bool, not NaN."""
    if name not in claims:
        return None
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AuthenticationFailed(Reason.TOKEN_CLAIMS_INVALID)
    if isinstance(value, float) and not math.isfinite(value):
        raise AuthenticationFailed(Reason.TOKEN_CLAIMS_INVALID)
    return value


def _check_dates(claims: Mapping[str, Any], *, now: float, max_lifetime: int) -> None:
    """Expired, not yet valid, or living longer than allowed: refused.

    Only comparisons: `exp` may be an integer too large to subtract a float from.
    """
    exp = _numeric_date(claims, "exp")
    nbf = _numeric_date(claims, "nbf")
    iat = _numeric_date(claims, "iat")
    if exp is None:  # `require` has already refused this; kept for the type checker
        raise AuthenticationFailed(Reason.TOKEN_CLAIMS_INVALID)
    if exp <= now:
        raise AuthenticationFailed(Reason.TOKEN_EXPIRED)
    if (nbf is not None and nbf > now) or (iat is not None and iat > now):
        raise AuthenticationFailed(Reason.TOKEN_CLAIMS_INVALID)
    if exp > now + max_lifetime + LIFETIME_LEEWAY_SECONDS or (
        iat is not None and exp > iat + max_lifetime
    ):
        raise AuthenticationFailed(Reason.TOKEN_LIFETIME_TOO_LONG)


def _actor(claims: Mapping[str, Any]) -> Actor:
    roles = claims.get("roles")
    if not isinstance(roles, list) or not all(isinstance(role, str) for role in roles):
        raise AuthenticationFailed(Reason.TOKEN_CLAIMS_INVALID)
    scope: dict[str, str] = {}
    for claim, field in SCOPE_CLAIMS.items():
        if claim not in claims:
            continue
        if not is_scope_id(claims[claim]):  # exactly as given: never trimmed or case-folded
            raise AuthenticationFailed(Reason.TOKEN_CLAIMS_INVALID)
        scope[field] = claims[claim]
    try:
        return Actor.model_validate({"sub": claims.get("sub"), "roles": tuple(roles), **scope})
    except ValidationError:
        raise AuthenticationFailed(Reason.TOKEN_CLAIMS_INVALID) from None


def _hs256_secret(secret: bytes) -> bytes:
    if len(secret) < MIN_HS256_SECRET_BYTES:
        raise ValueError(f"the HS256 secret must be at least {MIN_HS256_SECRET_BYTES} bytes")
    try:
        # PyJWT refuses PEM or SSH keys as HMAC secrets; say so now, not on every request.
        HMACAlgorithm(HMACAlgorithm.SHA256).prepare_key(secret)
    except jwt_errors.InvalidKeyError:
        raise ValueError("the HS256 secret must not be a public key") from None
    return secret


def _rs256_public_key(pem: bytes) -> RSAPublicKey:
    key = load_pem_public_key(pem)
    if not isinstance(key, RSAPublicKey):
        raise ValueError("the RS256 public key must be an RSA key")
    if key.key_size < MIN_RSA_KEY_BITS:
        raise ValueError(f"the RS256 public key must have at least {MIN_RSA_KEY_BITS} bits")
    return key


def mint_token(
    secret: bytes,
    *,
    sub: str,
    roles: Sequence[str],
    tenant: str | None = None,
    workspace: str | None = None,
    session: str | None = None,
    ttl_seconds: int,
    now: int | None = None,
) -> str:
    """An HS256 token with the claims `TokenVerifier` reads (for operators' tooling and tests)."""
    if not 1 <= ttl_seconds <= MAX_TTL_SECONDS:
        raise ValueError(f"ttl_seconds must be 1..{MAX_TTL_SECONDS}")
    if isinstance(roles, str):
        raise ValueError("roles must be a sequence of role names, not one string")
    issued_at = int(time.time()) if now is None else now
    claims: dict[str, Any] = {
        "sub": sub,
        "roles": list(roles),
        "iat": issued_at,
        "exp": issued_at + ttl_seconds,
    }
    scope = {"tenant": tenant, "workspace": workspace, "session": session}
    claims.update({name: value for name, value in scope.items() if value is not None})
    return jwt.encode(claims, _hs256_secret(secret), algorithm="HS256")
