"""Signed checkpoints: a reviewer can verify them, and nothing else verifies."""

from __future__ import annotations

import base64
import json
import stat
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import ValidationError

from service.cli import main
from store.backends.leveldb import LevelDBLaneStore
from store.canonical import canonical_digest, canonical_json
from store.chain.checkpoints import (
    KEY_FILE,
    Checkpoint,
    CheckpointSigner,
    CheckpointVerifier,
    checkpoint_payload,
)
from store.chain.evidence import EvidenceChain
from store.chain.head import GENESIS_HASH, ChainHead, format_timestamp
from store.chain.keys import entry_key
from store.chain.signed_head import ChainUnverified, verified_checkpoint
from store.secrets import SECRETS_DIR, SecretsHome

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
    """A reviewer can check a checkpoint with any Ed25519 library and the public key alone
    (one that names no tenant, as checkpoints signed before per-tenant chains)."""
    checkpoint = signer.sign(HEAD, ISSUED, None)
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
    first = CheckpointSigner.of(SecretsHome.local(tmp_path))
    again = CheckpointSigner.of(SecretsHome.local(tmp_path))
    assert again.key_id == first.key_id
    assert again.public_key_pem == first.public_key_pem
    assert again.verifier().verify(first.sign(HEAD, ISSUED)) is True
    key_file = tmp_path / SECRETS_DIR / KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_data_dirs_do_not_share_keys(tmp_path: Path) -> None:
    one = CheckpointSigner.of(SecretsHome.local(tmp_path / "one"))
    two = CheckpointSigner.of(SecretsHome.local(tmp_path / "two"))
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


# --- a checkpoint vouches only for a chain that verified -----------------------------------


def _data_dir_with_chain(tmp_path: Path, entries: int = 8) -> Path:
    """A stopped service's data dir, as far as the chain goes: `entries` decisions-like bodies."""
    data_dir = tmp_path / "var"
    lanes = LevelDBLaneStore(data_dir / "leveldb")
    EvidenceChain(lanes).append(
        [
            {"recorded_at": format_timestamp(ISSUED + timedelta(seconds=n)), "n": n}
            for n in range(entries)
        ]
    )
    lanes.close()
    return data_dir


def _edit_entry(data_dir: Path, seq: int) -> None:
    """Change an entry's content under its old hash, as an editor of the data dir would."""
    lanes = LevelDBLaneStore(data_dir / "leveldb")
    entry = EvidenceChain(lanes).get(seq)
    assert entry is not None
    lanes.put(entry_key(seq), canonical_json({**entry, "n": "edited"}))
    lanes.close()


def test_the_offline_checkpoint_refuses_a_chain_that_does_not_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = _data_dir_with_chain(tmp_path)
    _edit_entry(data_dir, 5)
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    assert main(["decisions", "verify"]) == 1
    verified = json.loads(capsys.readouterr().out)
    assert (verified["problem"], verified["first_invalid_seq"]) == ("hash_mismatch", 5)

    assert main(["decisions", "checkpoint"]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # nothing a reviewer could keep
    (line,) = err.splitlines()
    assert "does not verify (hash_mismatch at seq 5)" in line
    assert "no checkpoint is signed" in line
    assert not (data_dir / SECRETS_DIR / KEY_FILE).exists()  # nothing was signed


def test_the_offline_checkpoint_signs_the_head_that_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = _data_dir_with_chain(tmp_path)
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    assert main(["decisions", "checkpoint"]) == 0
    checkpoint = Checkpoint.model_validate_json(capsys.readouterr().out)
    assert checkpoint.seq == 8
    assert CheckpointSigner.of(SecretsHome.local(data_dir)).verifier().verify(checkpoint)


def test_every_path_to_a_checkpoint_shares_one_rule(tmp_path: Path) -> None:
    """The API's verify and the offline command both sign through `verified_checkpoint`."""
    data_dir = _data_dir_with_chain(tmp_path)
    lanes = LevelDBLaneStore(data_dir / "leveldb")
    try:
        result, checkpoint = verified_checkpoint(
            EvidenceChain(lanes), SecretsHome.local(data_dir), ISSUED
        )
        assert result.ok and checkpoint is not None
        assert (checkpoint.seq, checkpoint.head_hash) == (result.head_seq, result.head_hash)
        entry = EvidenceChain(lanes).get(3)
        assert entry is not None
        lanes.put(entry_key(3), canonical_json({**entry, "n": "edited"}))
        result, checkpoint = verified_checkpoint(
            EvidenceChain(lanes), SecretsHome.local(data_dir), ISSUED
        )
        assert checkpoint is None
        assert (result.problem, result.first_invalid_seq) == ("hash_mismatch", 3)
        assert "(hash_mismatch at seq 3)" in str(ChainUnverified.of(result, "checkpoint"))
    finally:
        lanes.close()
