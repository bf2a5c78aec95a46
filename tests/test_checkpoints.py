"""Signed checkpoints: a reviewer can verify them, and nothing else verifies."""

from __future__ import annotations

import base64
import stat
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import ValidationError

from store.canonical import canonical_digest
from store.chain_head import GENESIS_HASH, ChainHead
from store.checkpoints import (
    KEY_FILE,
    Checkpoint,
    CheckpointSigner,
    CheckpointVerifier,
    checkpoint_payload,
)
from store.secrets import SECRETS_DIR

ISSUED = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
HEAD = ChainHead(seq=7, hash=canonical_digest({"entry": 7}))
OTHER_HASH = canonical_digest({"entry": "other"})


@pytest.fixture
def signer() -> CheckpointSigner:
    return CheckpointSigner(b"\x01" * 32)


def test_a_signed_checkpoint_verifies(signer: CheckpointSigner) -> None:
    checkpoint = signer.sign(HEAD, ISSUED)
    assert (checkpoint.seq, checkpoint.head_hash) == (HEAD.seq, HEAD.hash)
    assert checkpoint.issued_at == "2025-03-01T12:00:00.000000Z"
    assert checkpoint.key_id == signer.key_id
    assert signer.verifier().verify(checkpoint) is True


def test_a_checkpoint_of_a_new_chain_verifies(signer: CheckpointSigner) -> None:
    checkpoint = signer.sign(ChainHead(seq=0, hash=GENESIS_HASH), ISSUED)
    assert signer.verifier().verify(checkpoint) is True


def test_issued_at_is_written_in_utc(signer: CheckpointSigner) -> None:
    local = ISSUED.astimezone(timezone(timedelta(hours=-5)))
    assert signer.sign(HEAD, local).issued_at == "2025-03-01T12:00:00.000000Z"


def test_signing_needs_an_aware_time(signer: CheckpointSigner) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        signer.sign(HEAD, ISSUED.replace(tzinfo=None))


def test_the_signature_covers_the_canonical_payload(signer: CheckpointSigner) -> None:
    """A reviewer can check a checkpoint with any Ed25519 library and the public key alone."""
    checkpoint = signer.sign(HEAD, ISSUED)
    public_key = signer._key.public_key()
    signature = base64.urlsafe_b64decode(checkpoint.signature + "==")
    payload = checkpoint_payload(
        checkpoint.seq, checkpoint.head_hash, checkpoint.issued_at, checkpoint.key_id
    )
    assert payload == (
        b'{"head_hash":"' + HEAD.hash.encode() + b'","issued_at":"2025-03-01T12:00:00.000000Z",'
        b'"key_id":"' + signer.key_id.encode() + b'","seq":7}'
    )
    public_key.verify(signature, payload)  # raises if it does not verify


def test_key_id_names_the_public_key(signer: CheckpointSigner) -> None:
    assert signer.key_id.startswith("ed25519:") and len(signer.key_id) == len("ed25519:") + 16
    assert CheckpointSigner(b"\x02" * 32).key_id != signer.key_id
    assert CheckpointVerifier(signer.public_key_pem).key_id == signer.key_id


def test_a_checkpoint_survives_a_json_round_trip(signer: CheckpointSigner) -> None:
    checkpoint = signer.sign(HEAD, ISSUED)
    kept = Checkpoint.model_validate_json(checkpoint.model_dump_json())
    assert kept == checkpoint
    assert CheckpointVerifier(signer.public_key_pem).verify(kept) is True


def test_the_key_persists_in_the_data_dir(tmp_path: Path) -> None:
    first = CheckpointSigner.from_data_dir(tmp_path)
    again = CheckpointSigner.from_data_dir(tmp_path)
    assert again.key_id == first.key_id
    assert again.public_key_pem == first.public_key_pem
    assert again.verifier().verify(first.sign(HEAD, ISSUED)) is True
    key_file = tmp_path / SECRETS_DIR / KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_data_dirs_do_not_share_keys(tmp_path: Path) -> None:
    one = CheckpointSigner.from_data_dir(tmp_path / "one")
    two = CheckpointSigner.from_data_dir(tmp_path / "two")
    assert one.key_id != two.key_id
    assert two.verifier().verify(one.sign(HEAD, ISSUED)) is False


@pytest.mark.parametrize(
    "change",
    [
        {"seq": 8},
        {"seq": 6},
        {"head_hash": OTHER_HASH},
        {"issued_at": "2025-03-01T12:00:01.000000Z"},
        {"key_id": "ed25519:0123456789abcdef"},
    ],
    ids=["seq_up", "seq_down", "head_hash", "issued_at", "key_id"],
)
def test_a_tampered_field_fails(signer: CheckpointSigner, change: dict[str, object]) -> None:
    tampered = signer.sign(HEAD, ISSUED).model_copy(update=change)
    assert signer.verifier().verify(tampered) is False


def test_another_key_fails_even_under_the_right_key_id(signer: CheckpointSigner) -> None:
    impostor = CheckpointSigner(b"\x02" * 32)
    forged = impostor.sign(HEAD, ISSUED)
    assert signer.verifier().verify(forged) is False
    relabelled = forged.model_copy(update={"key_id": signer.key_id})
    assert signer.verifier().verify(relabelled) is False


def _flip_spare_bits(signature: str) -> str:
    """The same signature bytes spelled differently: the last character's 4 spare bits set."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    return signature[:-1] + alphabet[alphabet.index(signature[-1]) | 0b1111]


@pytest.mark.parametrize(
    "spoil",
    [
        lambda s: "",
        lambda s: "not a signature",
        lambda s: s[:-1],
        lambda s: s + "A",
        lambda s: s + "==",
        lambda s: s.replace(s[0], "+", 1),
        lambda s: "A" * 86,
        lambda s: ("B" if s[0] != "B" else "C") + s[1:],
        _flip_spare_bits,
    ],
    ids=[
        "empty",
        "text",
        "short",
        "long",
        "padded",
        "std_alphabet",
        "zeros",
        "one_char",
        "spare_bits",
    ],
)
def test_malformed_signatures_fail(signer: CheckpointSigner, spoil: object) -> None:
    checkpoint = signer.sign(HEAD, ISSUED)
    assert callable(spoil)
    spoiled = checkpoint.model_copy(update={"signature": spoil(checkpoint.signature)})
    assert spoiled.signature != checkpoint.signature
    assert signer.verifier().verify(spoiled) is False


def test_spare_bits_really_decode_to_the_same_signature(signer: CheckpointSigner) -> None:
    """Why the spelling check matters: base64 alone would accept this second spelling."""
    signature = signer.sign(HEAD, ISSUED).signature
    assert base64.urlsafe_b64decode(_flip_spare_bits(signature) + "==") == (
        base64.urlsafe_b64decode(signature + "==")
    )


@pytest.mark.parametrize(
    "change",
    [
        {"seq": -1},
        {"seq": "7"},
        {"seq": True},
        {"head_hash": None},
        {"head_hash": "sha256:xyz"},
        {"issued_at": "2025-03-01 12:00:00"},
        {"key_id": 7},
        {"signature": None},
        {"signature": b"\x00" * 64},
    ],
)
def test_malformed_values_fail_without_raising(
    signer: CheckpointSigner, change: dict[str, object]
) -> None:
    fields = signer.sign(HEAD, ISSUED).model_dump() | change
    assert signer.verifier().verify(Checkpoint.model_construct(**fields)) is False


def test_something_that_is_not_a_checkpoint_fails(signer: CheckpointSigner) -> None:
    assert signer.verifier().verify(signer.sign(HEAD, ISSUED).model_dump()) is False  # type: ignore[arg-type]


def test_the_model_refuses_malformed_checkpoints_at_the_boundary(
    signer: CheckpointSigner,
) -> None:
    fields = signer.sign(HEAD, ISSUED).model_dump()
    for bad in (fields | {"extra": 1}, fields | {"seq": "7"}, fields | {"issued_at": "today"}):
        with pytest.raises(ValidationError):
            Checkpoint.model_validate(bad)


def test_a_signer_needs_a_32_byte_seed() -> None:
    with pytest.raises(ValueError, match="32"):
        CheckpointSigner(b"\x01" * 31)


def test_a_verifier_needs_an_ed25519_key() -> None:
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    with pytest.raises(ValueError, match="Ed25519"):
        CheckpointVerifier(other.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
