"""Signed checkpoints: a reviewer's proof of how far the evidence chain reached.

A hash chain shows edits, insertions and gaps, but not a cut tail: delete the
newest entries and what remains still links, and an attacker who rewrites an
entry can recompute every hash after it. A checkpoint is the chain head (seq and
hash) signed with an Ed25519 key kept in the data dir. A reviewer who keeps
checkpoints and the public key can later show the chain still reaches each one
with the same hash, or that it was cut or rewritten.

The same key signs evidence bundles' manifests and retention anchors (where
retention left a chain's start), and the Merkle tree heads of the C2SP
tlog-checkpoint notes (`store.chain.log_note`). Each kind of document is told
apart by its signed bytes, so a signature on one never passes as another: the
JSON ones are canonical JSON objects, a note's text is its origin line, its
tree size and its root, which no JSON object is.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_public_key,
)
from pydantic import BaseModel, ConfigDict, Field

from store.canonical import canonical_json
from store.chain.head import (
    CHAIN_NAME_PATTERN,
    HASH_PATTERN,
    NO_TENANT_CHAIN,
    TIMESTAMP_PATTERN,
    ChainHead,
    format_timestamp,
)
from store.chain.note import NoteSigner
from store.secrets import SecretsHome

KEY_FILE = "checkpoint.key"
KEY_ID_PATTERN = r"^ed25519:[0-9a-f]{16}$"
# An Ed25519 signature is 64 bytes: 86 base64url characters, unpadded.
SIGNATURE_PATTERN = r"^[A-Za-z0-9_-]{86}$"
_SIGNATURE_RE = re.compile(SIGNATURE_PATTERN)
_SEED_BYTES = 32
# What an evidence bundle's manifest says it is. The key signs manifests as well as
# checkpoints; a manifest always carries this field, so its signed bytes are never the
# payload of a checkpoint (four or five other fields, no `kind`), nor the reverse.
# v2: the manifest lists the sha256 of every other file of the bundle (v1 did not).
# v3: and states the chain's Merkle tree (`log`): its note, proofs and keys, or why absent.
BUNDLE_MANIFEST_KIND = "sessionstate.evidence_bundle.v3"
# What a retention anchor says it is: never a checkpoint's payload, nor a manifest's kind.
RETENTION_ANCHOR_KIND: Literal["sessionstate.retention_anchor.v1"] = (
    "sessionstate.retention_anchor.v1"
)
AnchorOrigin = Literal["retention", "db_upgrade"]


class Checkpoint(BaseModel):
    """A signed chain head, as a reviewer keeps it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    tenant_id: str | None = Field(
        default=None,
        pattern=CHAIN_NAME_PATTERN,
        description="the chain (tenant) whose head this is; absent on checkpoints signed "
        "before chains were per tenant, which speak of the one global chain",
    )
    seq: int = Field(ge=0)
    head_hash: str = Field(pattern=HASH_PATTERN)
    issued_at: str = Field(pattern=TIMESTAMP_PATTERN, description="RFC 3339 UTC")
    key_id: str = Field(pattern=KEY_ID_PATTERN, description="names the signing key")
    signature: str = Field(
        pattern=SIGNATURE_PATTERN, description="base64url Ed25519 over the checkpoint payload"
    )

    @classmethod
    def stored(cls, value: bytes) -> Checkpoint | None:
        """The checkpoint a store key holds; None when it does not hold one (never raises:
        a validation error quotes its input)."""
        try:
            return cls.model_validate_json(value)
        except ValueError:
            return None


class RetentionAnchor(BaseModel):
    """Where retention left a chain's start (the last pruned entry's seq and hash), signed,
    naming the chain, so it cannot be forged without the key nor moved to another chain."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    kind: Literal["sessionstate.retention_anchor.v1"] = RETENTION_ANCHOR_KIND
    chain: str = Field(pattern=CHAIN_NAME_PATTERN, description="the chain (tenant) it starts")
    seq: int = Field(ge=1, description="the last pruned entry's seq")
    hash: str = Field(pattern=HASH_PATTERN, description="and its hash")
    origin: AnchorOrigin = Field(
        description="`retention`: signed as retention pruned up to it; `db_upgrade`: an anchor "
        "an older release left unsigned, signed by `sessionstate db upgrade` after the chain "
        "from it verified, so it vouches only that the rest was intact then, not that what "
        "went before was removed by retention"
    )
    signed_at: str = Field(pattern=TIMESTAMP_PATTERN, description="RFC 3339 UTC")
    key_id: str = Field(pattern=KEY_ID_PATTERN, description="names the signing key")
    signature: str = Field(
        pattern=SIGNATURE_PATTERN, description="base64url Ed25519 over the anchor's payload"
    )

    @property
    def head(self) -> ChainHead:
        return ChainHead(seq=self.seq, hash=self.hash)

    def payload(self) -> bytes:
        """The signed bytes: canonical JSON of every field but the signature (`kind` too)."""
        return canonical_json(self.model_dump(exclude={"signature"}))


def checkpoint_payload(
    seq: int, head_hash: str, issued_at: str, key_id: str, tenant_id: str | None = None
) -> bytes:
    """The signed bytes: canonical JSON of every field but the signature.

    A checkpoint without `tenant_id` (signed before chains were per tenant) is signed
    without the field, so old checkpoints keep verifying.
    """
    payload: dict[str, object] = {
        "seq": seq,
        "head_hash": head_hash,
        "issued_at": issued_at,
        "key_id": key_id,
    }
    if tenant_id is not None:
        payload["tenant_id"] = tenant_id
    return canonical_json(payload)


def key_id_of(public_key: Ed25519PublicKey) -> str:
    """`ed25519:` and 16 hex of the sha256 of the raw public key."""
    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


class CheckpointSigner:
    """Signs chain heads with the store's checkpoint key."""

    def __init__(self, private_key_bytes: bytes) -> None:
        if len(private_key_bytes) != _SEED_BYTES:
            raise ValueError("a checkpoint key is 32 raw Ed25519 seed bytes")
        self._key = Ed25519PrivateKey.from_private_bytes(private_key_bytes)
        public_key = self._key.public_key()
        self.key_id = key_id_of(public_key)
        self.public_key_pem = public_key.public_bytes(
            Encoding.PEM, PublicFormat.SubjectPublicKeyInfo
        )

    @classmethod
    def of(cls, secrets: SecretsHome) -> CheckpointSigner:
        """The deployment's checkpoint key: provisioned, or created in the data dir (mode
        0600) on first use."""
        return cls(secrets.secret(KEY_FILE, nbytes=_SEED_BYTES))

    @classmethod
    def existing(cls, secrets: SecretsHome) -> CheckpointSigner | None:
        """The deployment's checkpoint key if there is one; None (and none created) if not."""
        if not secrets.holds(KEY_FILE):
            return None
        return cls.of(secrets)

    def sign(
        self, head: ChainHead, issued_at: datetime, tenant_id: str | None = NO_TENANT_CHAIN
    ) -> Checkpoint:
        """Sign the head of the chain `tenant_id` names (None: the legacy global chain)."""
        stamp = format_timestamp(issued_at)
        payload = checkpoint_payload(head.seq, head.hash, stamp, self.key_id, tenant_id)
        return Checkpoint(
            tenant_id=tenant_id,
            seq=head.seq,
            head_hash=head.hash,
            issued_at=stamp,
            key_id=self.key_id,
            signature=_encode(self._key.sign(payload)),
        )

    def sign_manifest(self, manifest: Mapping[str, Any]) -> tuple[bytes, bytes]:
        """An evidence bundle's manifest as canonical JSON, and the Ed25519 signature of it."""
        if manifest.get("kind") != BUNDLE_MANIFEST_KIND or manifest.get("key_id") != self.key_id:
            raise ValueError("a manifest names its kind and this key")
        payload = canonical_json(manifest)
        return payload, self._key.sign(payload)

    def sign_anchor(
        self, chain: str, start: ChainHead, origin: AnchorOrigin, signed_at: datetime
    ) -> RetentionAnchor:
        """A retention anchor of `chain` at `start` (the last pruned entry), signed."""
        fields: dict[str, object] = {
            "kind": RETENTION_ANCHOR_KIND,
            "chain": chain,
            "seq": start.seq,
            "hash": start.hash,
            "origin": origin,
            "signed_at": format_timestamp(signed_at),
            "key_id": self.key_id,
        }
        signature = _encode(self._key.sign(canonical_json(fields)))
        return RetentionAnchor.model_validate({**fields, "signature": signature})

    def verifier(self) -> CheckpointVerifier:
        return CheckpointVerifier(self.public_key_pem)

    def note_signer(self, name: str) -> NoteSigner:
        """This key as a signed-note key named `name` (`store.chain.note`): what signs the
        log's tlog checkpoints."""
        return NoteSigner(name, self._key)


class CheckpointVerifier:
    """Checks checkpoints against one public key, as a reviewer would."""

    def __init__(self, public_key_pem: bytes) -> None:
        public_key = load_pem_public_key(public_key_pem)
        if not isinstance(public_key, Ed25519PublicKey):
            raise ValueError("checkpoint keys are Ed25519")
        self._key = public_key
        self.key_id = key_id_of(public_key)

    def verify(self, checkpoint: Checkpoint) -> bool:
        """True only for a well-formed checkpoint signed by this key; never raises."""
        if not isinstance(checkpoint, Checkpoint):
            return False
        try:
            # Re-validate: model_construct and model_copy let malformed values through.
            valid = Checkpoint.model_validate(dict(checkpoint))
            payload = checkpoint_payload(
                valid.seq, valid.head_hash, valid.issued_at, valid.key_id, valid.tenant_id
            )
        except Exception:  # ValidationError: never re-raised
            return False
        return self._signed(valid.key_id, valid.signature, payload)

    def verify_of(self, checkpoint: Checkpoint | None, chain: str) -> bool:
        """`verify`, and the checkpoint names `chain` (none names the legacy global chain,
        `""`): a head the service keeps for a chain is trusted only then."""
        return (
            checkpoint is not None
            and (checkpoint.tenant_id or "") == chain
            and self.verify(checkpoint)
        )

    def verify_anchor(self, anchor: RetentionAnchor, chain: str) -> bool:
        """True only for a well-formed anchor of `chain` signed by this key; never raises."""
        if not isinstance(anchor, RetentionAnchor):
            return False
        try:
            valid = RetentionAnchor.model_validate(dict(anchor))
        except Exception:  # ValidationError: never re-raised
            return False
        return valid.chain == chain and self._signed(valid.key_id, valid.signature, valid.payload())

    def _signed(self, key_id: str, signature: str, payload: bytes) -> bool:
        raw = _decode(signature)
        if key_id != self.key_id or raw is None:
            return False
        try:
            self._key.verify(raw, payload)
        except Exception:  # InvalidSignature: never re-raised
            return False
        return True


def _encode(signature: bytes) -> str:
    return base64.urlsafe_b64encode(signature).rstrip(b"=").decode("ascii")


def _decode(text: str) -> bytes | None:
    """The signature bytes, for the one canonical spelling of them only."""
    if _SIGNATURE_RE.fullmatch(text) is None:
        return None
    raw = base64.urlsafe_b64decode(text + "==")
    # Non-zero spare bits decode to the same bytes; accept one spelling per signature.
    return raw if _encode(raw) == text else None
