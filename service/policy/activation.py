"""How a policy set became the one OPA decides with: what an activation entry records of it.

The sidecar that loads a policy set (`service.policy.sidecar`) knows how it came to load
it (its start, `sessionstate policy reload`, a bare SIGHUP, the watcher of a policy
directory, or of a signed bundle file), who asked (the operator a reload's token names,
else `system`), the key its signed bundle verified with, and the commit its manifest
names. It hands that on as an `Activated` to whoever records activations
(`service.decisions.activation_log`), on the `~system` chain of the decision log.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_public_key,
)

from service.policy.input import PolicyActor

ActivationHow = Literal["start", "reload", "sighup", "watcher", "bundle_poll"]
PolicySet = Literal["live", "shadow"]
SYSTEM_ACTOR = "system"  # who, when no operator named themselves
_HS256_KEY_ID = b"sessionstate policy bundle signer"


@dataclass(frozen=True)
class OperatorIdentity:
    """The operator a reload's or an approval's token names, and whether this host could have
    minted that token (`sessionstate policy reload --operator`: the data dir's HS256 secret),
    or only an identity provider could (a JWKS key, SESSIONSTATE_JWT_PUBLIC_KEY_FILE's)."""

    actor: PolicyActor
    minted_here: bool

    @property
    def stands_alone(self) -> bool:
        """Whether they count as one person behind a revision (two people for production):
        an identity provider vouches for them, and no tenant bounds them."""
        return not self.minted_here and self.actor.tenant_id is None


SYSTEM_IDENTITY = OperatorIdentity(PolicyActor(sub=SYSTEM_ACTOR, roles=[]), minted_here=True)


@dataclass(frozen=True)
class Activated:
    """A policy set OPA decides with now: which, how it got there, who asked."""

    revision: str
    how: ActivationHow
    who: str = SYSTEM_ACTOR
    policy_set: PolicySet = "live"
    signer_key_id: str | None = None  # a signed bundle's: `signer_key_id`
    commit: str | None = None  # the commit the bundle's manifest names
    approved_by: tuple[str, ...] = ()  # the operators who approved it, where a deployment asks
    approvals_required: int = 1  # SESSIONSTATE_POLICY_ACTIVATION_APPROVALS when it went live


def signer_key_id(verification_key: Path, alg: str) -> str:
    """An id of the key a signed bundle verified with, which names no secret: the sha256 of
    its public key (DER SubjectPublicKeyInfo, as `openssl pkey -pubin -outform DER` writes
    it) for RS256 and ES256; for HS256 an HMAC of a fixed text under the secret."""
    content = verification_key.read_bytes()
    if alg == "HS256":
        tag = hmac.new(content, _HS256_KEY_ID, hashlib.sha256).hexdigest()
        return "hmac-sha256:" + tag
    public = load_pem_public_key(content).public_bytes(
        Encoding.DER, PublicFormat.SubjectPublicKeyInfo
    )
    return "sha256:" + hashlib.sha256(public).hexdigest()
