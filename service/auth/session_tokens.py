"""Session tokens: the service's own signing key, the tokens it issues by exchange, its JWKS.

`POST /v1/token` (service.http.token) issues a session-scoped token once the
`sessionstate.token` policy allows the exchange. The token is an ES256 JWT
signed with a P-256 key of the service's own: `SESSIONSTATE_TOKEN_SIGNING_KEY_FILE`
(a PEM private key), or one generated once into the data dir
(`secrets/token-signing-key.pem`), as the HS256 secret and the digest key are.
Its public half is published at `/.well-known/jwks.json` under a `kid` that is
its RFC 7638 thumbprint, so any verifier can check the tokens; the service's own
`TokenVerifier` is given the same key and accepts them like any other token.

An issued token names what the exchange decided and nothing more: the subject's
`sub`, the role `model-service`, the target session's `tenant`, `workspace` and
`session`, `iss` and `aud` (both `SESSIONSTATE_TOKEN_ISSUER`), `iat` and `exp`
(`SESSIONSTATE_TOKEN_EXCHANGE_TTL_SECONDS` later, and never later than the subject
token's own `exp`: a token about to expire cannot be stretched), `act` (RFC 8693 section 4.1:
the service that asked, by its `sub`), and `jti`, the id of the decision that
allowed it, so the log names the decision behind every token.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm
from jwt.utils import base64url_encode
from pydantic import BaseModel, ConfigDict, Field

from service.auth.tokens import Actor
from store.scope import TenantScope
from store.secrets import SecretsHome

SIGNING_KEY_NAME = "token-signing-key.pem"
ALGORITHM = "ES256"
ISSUED_ROLE = "model-service"


class JsonWebKey(BaseModel):
    """One public key of the service (RFC 7517, an EC P-256 key for ES256)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kty: str = Field(default="EC", pattern="^EC$")
    crv: str = Field(default="P-256", pattern="^P-256$")
    x: str = Field(description="base64url, 32 bytes")
    y: str = Field(description="base64url, 32 bytes")
    kid: str = Field(description="the key's RFC 7638 thumbprint (base64url SHA-256)")
    use: str = Field(default="sig", pattern="^sig$")
    alg: str = Field(default=ALGORITHM, pattern="^ES256$")


class JsonWebKeySet(BaseModel):
    """`GET /.well-known/jwks.json`: the keys that verify the session tokens it issues."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: list[JsonWebKey]


class SigningKeyInvalid(ValueError):
    """The signing key is not an EC P-256 private key in PEM (the message holds no key bytes)."""


class SigningKey:
    """An ES256 private key, its public JWK and its `kid`."""

    def __init__(self, pem: bytes) -> None:
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError):
            raise SigningKeyInvalid("is not a PEM private key without a password") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(
            key.curve, ec.SECP256R1
        ):
            raise SigningKeyInvalid("must be an EC P-256 (secp256r1) private key, for ES256")
        self._private = key
        self.public_key = key.public_key()
        public = ECAlgorithm.to_jwk(self.public_key, as_dict=True)
        x, y = public["x"], public["y"]
        # RFC 7638: the required members, in lexicographic order, without whitespace.
        thumbprint = json.dumps(
            {"crv": "P-256", "kty": "EC", "x": x, "y": y}, separators=(",", ":"), sort_keys=True
        )
        self.kid = base64url_encode(hashlib.sha256(thumbprint.encode()).digest()).decode()
        self.jwk = JsonWebKey(x=x, y=y, kid=self.kid)

    @classmethod
    def generated(cls) -> bytes:
        """A new P-256 private key, as PEM (PKCS#8, unencrypted)."""
        return ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def sign(self, claims: Mapping[str, object]) -> str:
        return jwt.encode(
            dict(claims), self._private, algorithm=ALGORITHM, headers={"kid": self.kid}
        )

    def __repr__(self) -> str:  # never the key
        return f"SigningKey(kid={self.kid!r})"


def signing_key(secrets: SecretsHome, key_file: Path | None) -> SigningKey:
    """The configured key file's key, or the deployment's (provisioned, or generated into the
    data dir on first use)."""
    pem = (
        key_file.read_bytes()
        if key_file is not None
        else secrets.key_file(SIGNING_KEY_NAME, SigningKey.generated)
    )
    return SigningKey(pem)


@dataclass(frozen=True)
class IssuedToken:
    access_token: str
    expires_in: int


class SessionTokenIssuer:
    """Signs session tokens for the exchanges the policy allowed; publishes their key."""

    def __init__(self, key: SigningKey, *, issuer: str, ttl_seconds: int) -> None:
        self.key = key
        self.issuer = issuer
        self.ttl_seconds = ttl_seconds

    def issue(
        self,
        subject: Actor,
        session: TenantScope,
        *,
        token_id: str,
        now: int,
        not_after: int,
    ) -> IssuedToken:
        """A token for `session`, for the subject that asked (its `sub`, and in `act`),
        ending at `not_after` (the subject token's `exp`) if that comes before the TTL."""
        expires_at = min(now + self.ttl_seconds, not_after)
        if expires_at <= now:
            raise ValueError("the subject token has expired: nothing can be issued")
        claims = {
            "iss": self.issuer,
            "aud": self.issuer,
            "sub": subject.sub,
            "act": {"sub": subject.sub},
            "roles": [ISSUED_ROLE],
            "tenant": session.tenant_id,
            "workspace": session.workspace_id,
            "session": session.session_id,
            "iat": now,
            "exp": expires_at,
            "jti": token_id,
        }
        return IssuedToken(self.key.sign(claims), expires_at - now)

    def key_set(self) -> JsonWebKeySet:
        return JsonWebKeySet(keys=[self.key.jwk])

    def verification_keys(self) -> dict[str, ec.EllipticCurvePublicKey]:
        """The public keys `TokenVerifier` accepts the service's own tokens with, by `kid`."""
        return {self.key.kid: self.key.public_key}
