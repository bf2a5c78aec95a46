"""Signed notes and checkpoints in the C2SP formats, as Python writes and reads them, and
as a tool nobody here wrote reads them: `logcheck` (examples/logcheck), built from Go's
`golang.org/x/mod/sumdb/note`, `transparency-dev/formats/log` and `transparency-dev/merkle`.

Python signs; the Go tool opens the note with the Python-made verifier key; one flipped
bit in the note, the signature or the key, and both sides refuse it. The proofs come
from the tests' own RFC 6962 reference tree (tests/support/rfc6962_reference.py).
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from store.chain.note import (
    ED25519,
    NoteError,
    NoteSignature,
    NoteSigner,
    SignedNote,
    VerifierKey,
    key_id,
    open_note,
)
from store.chain.tlog_checkpoint import CheckpointFormatError, TreeHead
from tests.support import rfc6962_reference as rfc6962
from tests.support.go_tools import run_go_tool

ORIGIN = "sessionstate.example/decisions/tenant-a"
LEAVES = [f'{{"seq":{i + 1}}}'.encode() for i in range(7)]
# The example of https://c2sp.org/signed-note, "Verifier keys".
SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SPEC_NOTE = (
    "This is an example message.\n\n\u2014 example.com/foo "
    "Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n"
).encode()
# Put into every malformed input below: no error message may repeat it.
MARKER = "MARKER-9f3c"


@pytest.fixture
def signer() -> NoteSigner:
    return NoteSigner(ORIGIN, Ed25519PrivateKey.generate())


def flip(data: bytes, index: int, bit: int = 0) -> bytes:
    return data[:index] + bytes([data[index] ^ (1 << bit)]) + data[index + 1 :]


def checkpoint(signer: NoteSigner, leaves: list[bytes]) -> bytes:
    return signer.sign(TreeHead(ORIGIN, len(leaves), rfc6962.mth(leaves)).text())


def logcheck(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_go_tool("logcheck", *args)


def write(path: Path, content: bytes | dict[str, Any]) -> Path:
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return path


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_the_specs_example_note_opens_under_its_verifier_key() -> None:
    vkey = VerifierKey.parse(SPEC_VKEY)
    assert (vkey.name, vkey.key_id, vkey.signature_type) == ("example.com/foo", 0x530D903A, 1)
    assert str(vkey) == SPEC_VKEY
    assert open_note(SPEC_NOTE, vkey).text == "This is an example message.\n"


def test_a_signers_verifier_key_is_name_key_id_and_typed_public_key(signer: NoteSigner) -> None:
    vkey = signer.verifier_key
    name, hex_id, material = str(vkey).split("+", 2)
    raw = base64.b64decode(material)
    assert (name, raw[0], len(raw)) == (ORIGIN, ED25519, 33)
    assert hex_id == f"{key_id(ORIGIN, ED25519, raw[1:]):08x}"
    assert VerifierKey.parse(str(vkey)) == vkey


def test_a_verifier_key_whose_base64_holds_a_plus_reads_back() -> None:
    seeds = (bytes([i]) * 32 for i in range(256))
    keys = (NoteSigner(ORIGIN, Ed25519PrivateKey.from_private_bytes(s)) for s in seeds)
    signer = next(k for k in keys if "+" in str(k.verifier_key).split("+", 2)[2])
    assert VerifierKey.parse(str(signer.verifier_key)) == signer.verifier_key
    assert open_note(signer.sign("text\n"), signer.verifier_key).text == "text\n"


def test_a_note_with_several_signatures_opens_under_each_key_and_ignores_the_others(
    signer: NoteSigner,
) -> None:
    other = NoteSigner("other.example/log", Ed25519PrivateKey.generate())
    text = TreeHead(ORIGIN, 3, rfc6962.mth(LEAVES[:3])).text()
    ours, theirs = SignedNote.parse(signer.sign(text)), SignedNote.parse(other.sign(text))
    both = SignedNote(text, theirs.signatures + ours.signatures).render()
    assert open_note(both, signer.verifier_key).signatures == theirs.signatures + ours.signatures
    assert open_note(both, other.verifier_key).text == text
    stranger = NoteSigner(ORIGIN, Ed25519PrivateKey.generate()).verifier_key
    with pytest.raises(NoteError, match="no signature of the key"):
        open_note(both, stranger)


def test_a_forged_line_under_the_keys_name_and_id_rejects_the_whole_note(
    signer: NoteSigner,
) -> None:
    note = checkpoint(signer, LEAVES[:2])
    parsed = SignedNote.parse(note)
    genuine = parsed.signatures[0]
    forged = NoteSignature(genuine.name, genuine.key_id, bytes(64))
    with pytest.raises(NoteError, match="does not verify"):
        open_note(SignedNote(parsed.text, (genuine, forged)).render(), signer.verifier_key)


@pytest.mark.parametrize(
    "vkey",
    [
        f"{MARKER}+530d903a",
        f"{MARKER}+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k+x",
        f"{MARKER}+530D903A+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",
        f"{MARKER}+530d903+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",
        f"example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k{MARKER}",
        "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2l",
        f"{MARKER} x+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",
        f"{MARKER}+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",
        f"{MARKER}+00000000+",
    ],
)
def test_a_malformed_or_mismatched_verifier_key_is_refused_without_echo(vkey: str) -> None:
    with pytest.raises(NoteError) as refused:
        VerifierKey.parse(vkey)
    assert MARKER not in str(refused.value) and "AekyeRrm" not in str(refused.value)


def test_a_verifier_key_of_another_signature_type_opens_no_note(signer: NoteSigner) -> None:
    note = checkpoint(signer, LEAVES[:1])
    vkey = signer.verifier_key
    cosigner = VerifierKey(vkey.name, key_id(vkey.name, 0x04, vkey.public_key), 4, vkey.public_key)
    with pytest.raises(NoteError, match="signature type"):
        open_note(note, cosigner)


@pytest.mark.parametrize(
    "note",
    [
        f"{MARKER}\n\u2014 a AAAAAAA=\n".encode(),  # no blank line
        f"{MARKER}\n\n".encode(),  # no signature line
        f"{MARKER}\n\n\u2014 a AAAAAAA=".encode(),  # no final newline
        f"{MARKER}\t\n\n\u2014 a AAAAAAA=\n".encode(),  # a control character
        f"{MARKER}\n".encode() + b"\xff\n\n\xe2\x80\x94 a AAAAAAA=\n",  # not UTF-8
        f"{MARKER}\n\n- a AAAAAAA=\n".encode(),  # a hyphen, not an em dash
        f"{MARKER}\n\n\u2014 a+b AAAAAAA=\n".encode(),  # a plus in the name
        f"{MARKER}\n\n\u2014 a AAAA\n".encode(),  # no signature bytes after the ID
        f"{MARKER}\n\n\u2014 a AAAAAAA\n".encode(),  # unpadded base64
        f"{MARKER}\n\n\u2014 a AAAAAAB=\n".encode(),  # non-canonical base64
        f"{MARKER}\n\n\u2014 a AAAAAAA=\u2028\n".encode(),  # a line separator
        f"{MARKER}\n\n".encode() + "\u2014 a AAAAAAA=\n".encode() * 101,  # too many
    ],
)
def test_a_malformed_note_is_refused_without_echo(note: bytes) -> None:
    with pytest.raises(NoteError) as refused:
        SignedNote.parse(note)
    assert MARKER not in str(refused.value)


def test_a_note_text_is_signed_only_when_it_is_one(signer: NoteSigner) -> None:
    for text in ("no final newline", "a\x00b\n"):
        with pytest.raises(NoteError):
            signer.sign(text)
    with pytest.raises(NoteError):
        NoteSigner("a name", Ed25519PrivateKey.generate())


def test_a_checkpoint_text_is_origin_size_and_root() -> None:
    head = TreeHead(ORIGIN, 7, rfc6962.mth(LEAVES))
    assert head.text() == f"{ORIGIN}\n7\n{b64(rfc6962.mth(LEAVES))}\n"
    assert TreeHead.parse(head.text()) == head
    empty = TreeHead.parse(f"{ORIGIN}\n0\n{b64(rfc6962.mth([]))}\n")
    assert empty.root_hash == bytes.fromhex(
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )


@pytest.mark.parametrize(
    "text",
    [
        f"{MARKER}\n07\n{b64(bytes(32))}\n",  # a leading zero
        f"{MARKER}\n-1\n{b64(bytes(32))}\n",
        f"{MARKER}\n+7\n{b64(bytes(32))}\n",
        f"{MARKER}\n{2**63}\n{b64(bytes(32))}\n",  # beyond an int64
        f"{MARKER}\n{'9' * 5000}\n{b64(bytes(32))}\n",
        f"{MARKER}\n7\n{b64(bytes(31))}\n",  # not a SHA-256 hash
        f"{MARKER}\n7\n{b64(bytes(32))[:-1]}\n",  # unpadded
        f"{MARKER}\n7\n{b64(bytes(32))}",  # no final newline
        f"{MARKER}\n7\n{b64(bytes(32))}\nextension {MARKER}\n",  # an extension line
        f"\n7\n{b64(bytes(32))}\n",  # no origin
        f"{MARKER}\n7\n",
    ],
)
def test_a_malformed_checkpoint_text_is_refused_without_echo(text: str) -> None:
    with pytest.raises(CheckpointFormatError) as refused:
        TreeHead.parse(text)
    assert MARKER not in str(refused.value)


def test_logcheck_opens_a_python_signed_checkpoint(signer: NoteSigner, tmp_path: Path) -> None:
    note = write(tmp_path / "checkpoint", checkpoint(signer, LEAVES))
    done = logcheck("checkpoint", "--vkey", str(signer.verifier_key), "--origin", ORIGIN, note)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"ok checkpoint {ORIGIN} size 7 root {b64(rfc6962.mth(LEAVES))}\n"
    other_origin = logcheck("checkpoint", "--vkey", str(signer.verifier_key), "--origin", "x", note)
    assert other_origin.returncode == 1 and "Origin" in other_origin.stderr


def _flipped_text(note: bytes, vkey: str) -> tuple[bytes, str]:
    return flip(note, len(ORIGIN) + 1), vkey  # the size's digit: 7 becomes 6


def _flipped_signature(note: bytes, vkey: str) -> tuple[bytes, str]:
    parsed = SignedNote.parse(note)
    (line,) = parsed.signatures
    bad = NoteSignature(line.name, line.key_id, flip(line.signature, 10, 3))
    return SignedNote(parsed.text, (bad,)).render(), vkey


def _flipped_key(note: bytes, vkey: str) -> tuple[bytes, str]:
    key = VerifierKey.parse(vkey)
    public = flip(key.public_key, 5, 1)
    return note, str(VerifierKey(key.name, key_id(key.name, ED25519, public), ED25519, public))


def _flipped_key_id(note: bytes, vkey: str) -> tuple[bytes, str]:
    name, hex_id, material = vkey.split("+", 2)
    return note, f"{name}+{int(hex_id, 16) ^ 1:08x}+{material}"


@pytest.mark.parametrize(
    "damage", [_flipped_text, _flipped_signature, _flipped_key, _flipped_key_id]
)
def test_one_flipped_bit_in_the_note_signature_or_key_fails_in_go_and_python(
    signer: NoteSigner, tmp_path: Path, damage: Any
) -> None:
    note, vkey = damage(checkpoint(signer, LEAVES), str(signer.verifier_key))
    done = logcheck("checkpoint", "--vkey", vkey, "--origin", ORIGIN, write(tmp_path / "n", note))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("logcheck: ")
    with pytest.raises(NoteError):
        open_note(note, VerifierKey.parse(vkey))


def _inclusion(index: int, leaves: list[bytes]) -> dict[str, Any]:
    return {
        "leaf_index": index,
        "tree_size": len(leaves),
        "leaf_hash": b64(rfc6962.leaf_hash(leaves[index])),
        "hashes": [b64(h) for h in rfc6962.path(index, leaves)],
    }


@pytest.mark.parametrize("index", [0, 3, 6])
def test_logcheck_accepts_an_inclusion_proof_and_refuses_a_flipped_bit(
    signer: NoteSigner, tmp_path: Path, index: int
) -> None:
    note = write(tmp_path / "checkpoint", checkpoint(signer, LEAVES))
    leaf = write(tmp_path / "leaf", LEAVES[index])
    good = _inclusion(index, LEAVES)

    def check(proof: dict[str, Any], leaf_file: Path = leaf) -> subprocess.CompletedProcess[str]:
        return logcheck(
            "inclusion", "--vkey", str(signer.verifier_key), "--origin", ORIGIN,
            "--checkpoint", note, "--proof", write(tmp_path / "proof.json", proof),
            "--leaf", leaf_file,
        )  # fmt: skip

    done = check(good)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"ok inclusion leaf {index} in tree size 7\n"
    first_hash = base64.b64decode(good["hashes"][0])
    refusals = [
        check({**good, "hashes": [b64(flip(first_hash, 0)), *good["hashes"][1:]]}),
        check({**good, "leaf_index": index ^ 1}),
        check({**good, "tree_size": 6}),
        check(good, write(tmp_path / "other-leaf", flip(LEAVES[index], 2))),
        check({**good, "leaf_hash": b64(flip(base64.b64decode(good["leaf_hash"]), 31, 7))}),
    ]
    assert [r.returncode for r in refusals] == [1] * len(refusals)
    assert all(r.stderr.startswith("logcheck: ") for r in refusals)


@pytest.mark.parametrize("first", [1, 3, 4, 6])
def test_logcheck_accepts_a_consistency_proof_and_refuses_a_flipped_bit(
    signer: NoteSigner, tmp_path: Path, first: int
) -> None:
    old = write(tmp_path / "old", checkpoint(signer, LEAVES[:first]))
    new = write(tmp_path / "new", checkpoint(signer, LEAVES))
    hashes = rfc6962.proof(first, LEAVES)
    good = {"first": first, "second": 7, "hashes": [b64(h) for h in hashes]}

    def check(proof: dict[str, Any], older: Path = old) -> subprocess.CompletedProcess[str]:
        return logcheck(
            "consistency", "--vkey", str(signer.verifier_key), "--origin", ORIGIN,
            "--old", older, "--new", new, "--proof", write(tmp_path / "proof.json", proof),
        )  # fmt: skip

    done = check(good)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"ok consistency from size {first} to 7\n"
    rewritten = [flip(LEAVES[0], 0), *LEAVES[1:first]]
    refusals = [
        check({**good, "hashes": [b64(flip(hashes[0], 4)), *good["hashes"][1:]]}),
        check({**good, "hashes": [*good["hashes"][:-1], b64(flip(hashes[-1], 4))]}),
        check(good, write(tmp_path / "rewritten", checkpoint(signer, rewritten))),
        check({**good, "first": first + 1}),
    ]
    assert [r.returncode for r in refusals] == [1] * len(refusals)
    assert all(r.stderr.startswith("logcheck: ") for r in refusals)


def test_logcheck_refuses_a_missing_flag_or_an_unknown_command(tmp_path: Path) -> None:
    for args in (["checkpoint"], ["inclusion", "--vkey", "v", "--origin", "o"], ["verify"], []):
        done = logcheck(*args)
        assert done.returncode == 1 and done.stdout == ""
