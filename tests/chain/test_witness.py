"""A real witness nobody here wrote cosigns the log's checkpoints, and refuses a rewritten log.

torchwood's litewitness (tests/support/witness.py) speaks c2sp.org/tlog-witness: POST
/add-checkpoint with the size it last signed, a consistency proof and the new signed
checkpoint. It answers its c2sp.org/tlog-cosignature line, which the Python verifier
(store.chain.cosignature) accepts under the key litewitness printed, and which leaves
the note readable by Go's note package (`logcheck`). A head of a rewritten tree (same
size or larger, another root) it refuses: 422 `bad consistency proof` when the proof
does not hold, 409 with the size it knows (text/x.tlog.size) when the old size is not
the one it signed, and its database still holds the honest head.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_ssh_public_key

from store.chain.cosignature import (
    COSIGNATURE_V1,
    CosignatureError,
    parse_cosignature_lines,
    verify_cosignature,
    witness_cosignature,
)
from store.chain.note import (
    NoteError,
    NoteSignature,
    NoteSigner,
    SignedNote,
    VerifierKey,
    open_note,
)
from store.chain.tlog_checkpoint import TreeHead
from tests.support import rfc6962_reference as rfc6962
from tests.support.go_tools import run_go_tool
from tests.support.witness import Witness, litewitness

ORIGIN = "sessionstate.example/decisions/tenant-a"
LEAVES = [f'{{"seq":{i + 1}}}'.encode() for i in range(9)]
# The same seqs, the first decision rewritten: what an operator with the data dir can make.
REWRITTEN = [b'{"seq":1,"allowed":true}', *LEAVES[1:]]


@pytest.fixture
def log_signer() -> NoteSigner:
    return NoteSigner(ORIGIN, Ed25519PrivateKey.generate())


@pytest.fixture
def witness(tmp_path: Path, log_signer: NoteSigner) -> Iterator[Witness]:
    with litewitness(tmp_path / "witness", {ORIGIN: str(log_signer.verifier_key)}) as running:
        yield running


def signed(signer: NoteSigner, leaves: list[bytes]) -> bytes:
    return signer.sign(TreeHead(ORIGIN, len(leaves), rfc6962.mth(leaves)).text())


def cosign(witness: Witness, old: int, proof: list[bytes], note: bytes) -> NoteSignature:
    """The one cosignature line the witness answers, verified under its key."""
    answer = witness.add_checkpoint(old, proof, note)
    assert answer.status_code == 200, answer.text
    (line,) = parse_cosignature_lines(answer.content)
    cosignature = verify_cosignature(
        line, SignedNote.parse(note).text, VerifierKey.parse(witness.vkey)
    )
    assert cosignature.witness == witness.name
    return line


def test_the_witness_key_is_its_ssh_key_as_a_cosignature_vkey(tmp_path: Path) -> None:
    with litewitness(tmp_path / "witness") as running:
        vkey = VerifierKey.parse(running.vkey)
        key = (tmp_path / "witness" / "witness_ed25519.pub").read_bytes()
        public = load_ssh_public_key(key)
        assert isinstance(public, Ed25519PublicKey)
        assert vkey.public_key == public.public_bytes(Encoding.Raw, PublicFormat.Raw)
        assert (vkey.name, vkey.signature_type) == ("witness.test/w1", COSIGNATURE_V1)
        processes = running.processes
    assert all(p.returncode is not None for p in processes)
    assert not running.agent_socket.exists()


def test_the_witness_cosigns_a_first_and_a_grown_head(
    witness: Witness, log_signer: NoteSigner, tmp_path: Path
) -> None:
    first = signed(log_signer, LEAVES[:3])
    before = int(time.time())
    line = cosign(witness, 0, [], first)
    after = int(time.time())
    stamp = verify_cosignature(line, SignedNote.parse(first).text, VerifierKey.parse(witness.vkey))
    assert before <= stamp.timestamp <= after

    grown = signed(log_signer, LEAVES[:7])
    line = cosign(witness, 3, rfc6962.proof(3, LEAVES[:7]), grown)
    cosigned = grown + line.line().encode()
    assert open_note(cosigned, log_signer.verifier_key).text == SignedNote.parse(grown).text
    assert witness_cosignature(cosigned, VerifierKey.parse(witness.vkey)).line == line.line()
    assert witness.logs()[ORIGIN]["size"] == 7
    assert witness.logs()[ORIGIN]["root_hash"] == base64.b64encode(rfc6962.mth(LEAVES[:7])).decode()

    # Go's note package reads the log's signature and ignores the witness's line.
    note_file = tmp_path / "cosigned"
    note_file.write_bytes(cosigned)
    vkey = str(log_signer.verifier_key)
    done = run_go_tool("logcheck", "checkpoint", "--vkey", vkey, "--origin", ORIGIN, note_file)
    assert done.returncode == 0, done.stderr


def test_a_cosignature_is_refused_once_a_bit_of_it_or_of_the_head_changes(
    witness: Witness, log_signer: NoteSigner
) -> None:
    note = signed(log_signer, LEAVES[:3])
    line = cosign(witness, 0, [], note)
    text, vkey = SignedNote.parse(note).text, VerifierKey.parse(witness.vkey)
    raw = line.signature
    damaged = [
        (NoteSignature(line.name, line.key_id, raw[:7] + bytes([raw[7] ^ 1]) + raw[8:]), text),
        (NoteSignature(line.name, line.key_id, raw[:-1] + bytes([raw[-1] ^ 1])), text),
        (line, TreeHead(ORIGIN, 3, rfc6962.mth(REWRITTEN[:3])).text()),
        (NoteSignature(line.name, line.key_id ^ 1, raw), text),
        (NoteSignature(line.name, line.key_id, raw[:-1]), text),
    ]
    for signature, checkpoint_text in damaged:
        with pytest.raises(CosignatureError):
            verify_cosignature(signature, checkpoint_text, vkey)
    with pytest.raises(NoteError, match="signature type"):
        verify_cosignature(line, text, log_signer.verifier_key)


def test_the_witness_refuses_a_rewritten_log(witness: Witness, log_signer: NoteSigner) -> None:
    cosign(witness, 0, [], signed(log_signer, LEAVES[:3]))
    cosign(witness, 3, rfc6962.proof(3, LEAVES[:7]), signed(log_signer, LEAVES[:7]))

    # The same size, another root: no proof can hold.
    same_size = witness.add_checkpoint(7, [], signed(log_signer, REWRITTEN[:7]))
    assert (same_size.status_code, same_size.text) == (422, "bad consistency proof\n")
    # Larger, with a proof that holds in the rewritten tree only.
    rewritten = signed(log_signer, REWRITTEN)
    larger = witness.add_checkpoint(7, rfc6962.proof(7, REWRITTEN), rewritten)
    assert (larger.status_code, larger.text) == (422, "bad consistency proof\n")
    # From an old size it did not sign last (a log that starts over, or goes back).
    for old, proof in ((0, []), (3, rfc6962.proof(3, REWRITTEN))):
        conflict = witness.add_checkpoint(old, proof, rewritten)
        assert (conflict.status_code, conflict.text) == (409, "7\n")
        assert conflict.headers["Content-Type"] == "text/x.tlog.size"
    # A smaller tree than the old size it names.
    shrunk = witness.add_checkpoint(7, [], signed(log_signer, LEAVES[:6]))
    assert (shrunk.status_code, shrunk.text) == (400, "invalid input\n")

    known = witness.logs()[ORIGIN]
    assert (known["size"], known["root_hash"]) == (
        7,
        base64.b64encode(rfc6962.mth(LEAVES[:7])).decode(),
    )
    cosign(witness, 7, rfc6962.proof(7, LEAVES), signed(log_signer, LEAVES))


def test_the_witness_refuses_another_key_or_an_unknown_log(
    witness: Witness, log_signer: NoteSigner
) -> None:
    impostor = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    refused = witness.add_checkpoint(0, [], signed(impostor, LEAVES[:3]))
    assert (refused.status_code, refused.text) == (403, "invalid signature\n")
    stranger = NoteSigner("other.example/log", Ed25519PrivateKey.generate())
    unknown = witness.add_checkpoint(
        0, [], stranger.sign(TreeHead("other.example/log", 1, rfc6962.mth(LEAVES[:1])).text())
    )
    assert (unknown.status_code, unknown.text) == (403, "unknown log\n")
    assert witness.logs()[ORIGIN]["size"] == 0
