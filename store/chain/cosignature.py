"""C2SP tlog-cosignature v1 (https://c2sp.org/tlog-cosignature): a witness's word on a head.

A witness (a tlog-witness such as litewitness) that checked a checkpoint is consistent
with every one it signed before answers a note signature line of signature type 0x04:
the key ID, an 8-byte big-endian POSIX timestamp, then an Ed25519 signature over

    cosignature/v1
    time <timestamp>
    <the checkpoint's note text>

The timestamp is the witness's clock, signed: as of then, this was the largest
consistent head it had seen of that log. Verifying one needs only the witness's
verifier key (`<name>+<key ID>+base64(0x04 || public key)`).
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature

from store.chain.note import (
    NoteError,
    NoteSignature,
    SignedNote,
    VerifierKey,
    decode_note,
    parse_signature_lines,
)
from store.chain.tlog_checkpoint import TreeHead

COSIGNATURE_V1 = 0x04
"""The signature type of a timestamped Ed25519 checkpoint cosignature."""
_TIMESTAMP_BYTES = 8
_ED25519_SIGNATURE_BYTES = 64
_MAX_TIMESTAMP = 2**63 - 1


class CosignatureError(NoteError):
    """A cosignature that is not the witness's, or does not hold on the checkpoint."""


@dataclass(frozen=True)
class Cosignature:
    """A verified cosignature: which witness, when (its clock), and its signature line."""

    witness: str
    timestamp: int
    line: str


def cosigned_message(timestamp: int, checkpoint_text: str) -> bytes:
    """The bytes a v1 cosignature signs."""
    return f"cosignature/v1\ntime {timestamp}\n{checkpoint_text}".encode()


def verify_cosignature(
    signature: NoteSignature, checkpoint_text: str, witness: VerifierKey
) -> Cosignature:
    """The cosignature in `signature`, once it is `witness`'s and holds on the checkpoint."""
    TreeHead.parse(checkpoint_text)
    public = witness.ed25519_key(COSIGNATURE_V1)
    if (signature.name, signature.key_id) != (witness.name, witness.key_id):
        raise CosignatureError("the signature line is not the witness's")
    raw = signature.signature
    if len(raw) != _TIMESTAMP_BYTES + _ED25519_SIGNATURE_BYTES:
        raise CosignatureError("a v1 cosignature is a timestamp and an Ed25519 signature")
    timestamp = int.from_bytes(raw[:_TIMESTAMP_BYTES], "big")
    if timestamp > _MAX_TIMESTAMP:
        raise CosignatureError("a cosignature's timestamp is out of range")
    try:
        public.verify(raw[_TIMESTAMP_BYTES:], cosigned_message(timestamp, checkpoint_text))
    except InvalidSignature:
        raise CosignatureError("the cosignature does not verify under the witness's key") from None
    return Cosignature(witness.name, timestamp, signature.line())


def witness_cosignature(note: bytes, witness: VerifierKey) -> Cosignature:
    """The one cosignature of `witness` on a signed checkpoint note (the log's own
    signature is not checked here: `store.chain.note.open_note` does that)."""
    parsed = SignedNote.parse(note)
    claimed = parsed.signatures_of(witness)
    if len(claimed) != 1:
        raise CosignatureError("the note carries no single cosignature of the witness")
    return verify_cosignature(claimed[0], parsed.text, witness)


def parse_cosignature_lines(answer: bytes) -> tuple[NoteSignature, ...]:
    """The signature lines of a tlog-witness's answer to add-checkpoint (one or more
    lines, each `— <name> <base64>`, nothing else)."""
    return parse_signature_lines(decode_note(answer))
