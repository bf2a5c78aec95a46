"""C2SP signed notes (https://c2sp.org/signed-note): text signed by named keys.

A note is a text ending in a newline, a blank line, then signature lines
`— <key name> base64(key ID || signature)`. A key is known to a reader by its
verifier key (vkey), `<name>+<hex key ID>+base64(type || public key)`, the form
Go's `golang.org/x/mod/sumdb/note` reads; the key ID is the first four bytes of
SHA-256(name || "\\n" || type || public key). This is the envelope of the log's
tree heads (`store.chain.tlog_checkpoint`) and of the witnesses' cosignatures
(`store.chain.cosignature`), so that tools nobody here wrote can check them.

Parsing is strict (canonical base64, lowercase hex, no control characters) and
errors never repeat the input: what a reviewer or a witness hands us is untrusted.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

ED25519 = 0x01
"""The signature type of a plain Ed25519 note signature over the note text."""
SIGNATURE_PREFIX = "\u2014 "
# What a verifier must accept (the spec says at least 16); Go's note reads up to 100.
MAX_SIGNATURES = 100
_KEY_ID_RE = re.compile(r"[0-9a-f]{8}")
# Any ASCII control character but the newline (the spec forbids them in a note).
_CONTROL_RE = re.compile(r"[\x00-\x09\x0b-\x1f]")
_ED25519_KEY_BYTES = 32


class NoteError(ValueError):
    """A note, a signature line or a verifier key that does not hold. The message says
    what is wrong, never what the input was."""


def valid_key_name(name: str) -> bool:
    """A key name is non-empty, with no Unicode space and no plus."""
    return name != "" and "+" not in name and not any(c.isspace() for c in name)


def key_id(name: str, signature_type: int, public_key: bytes) -> int:
    """SHA-256(name || "\\n" || type || public key)[:4], big-endian: the key ID."""
    material = name.encode() + b"\n" + bytes([signature_type]) + public_key
    return int.from_bytes(hashlib.sha256(material).digest()[:4], "big")


def strict_b64decode(text: str) -> bytes:
    """Standard base64 (RFC 4648 section 4), padded and in its one canonical form."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise NoteError("not canonical base64") from None
    if base64.b64encode(raw).decode() != text:
        raise NoteError("not canonical base64")
    return raw


@dataclass(frozen=True)
class VerifierKey:
    """A parsed vkey: the name and ID a signature line must carry, and the public key."""

    name: str
    key_id: int
    signature_type: int
    public_key: bytes

    @classmethod
    def parse(cls, vkey: str) -> VerifierKey:
        parts = vkey.split("+", 2)  # the base64 key may hold pluses of its own
        if len(parts) != 3 or not valid_key_name(parts[0]) or not _KEY_ID_RE.fullmatch(parts[1]):
            raise NoteError("a verifier key is <name>+<8 hex digits>+<base64 key>")
        name, hex_id, material = parts[0], int(parts[1], 16), strict_b64decode(parts[2])
        if len(material) < 2:
            raise NoteError("a verifier key carries a signature type and a public key")
        signature_type, public_key = material[0], material[1:]
        if key_id(name, signature_type, public_key) != hex_id:
            raise NoteError("a verifier key's ID does not match its name and key")
        return cls(name, hex_id, signature_type, public_key)

    def __str__(self) -> str:
        material = base64.b64encode(bytes([self.signature_type]) + self.public_key).decode()
        return f"{self.name}+{self.key_id:08x}+{material}"

    def ed25519_key(self, signature_type: int) -> Ed25519PublicKey:
        """The Ed25519 public key, when this vkey is of `signature_type` (whose signatures
        are Ed25519); a key of another type is refused, not reinterpreted."""
        if self.signature_type != signature_type or len(self.public_key) != _ED25519_KEY_BYTES:
            raise NoteError("the verifier key is not of the expected signature type")
        return Ed25519PublicKey.from_public_bytes(self.public_key)


@dataclass(frozen=True)
class NoteSignature:
    """One signature line: the key's name and ID, and the signature bytes after the ID."""

    name: str
    key_id: int
    signature: bytes

    def line(self) -> str:
        encoded = base64.b64encode(self.key_id.to_bytes(4, "big") + self.signature).decode()
        return f"{SIGNATURE_PREFIX}{self.name} {encoded}\n"


@dataclass(frozen=True)
class SignedNote:
    """A note split into its text (with its final newline) and its signature lines."""

    text: str
    signatures: tuple[NoteSignature, ...]

    @classmethod
    def parse(cls, note: bytes) -> SignedNote:
        decoded = decode_note(note)
        split = decoded.rfind("\n\n")
        if split < 0:
            raise NoteError("a note is a text, a blank line and signature lines")
        return cls(decoded[: split + 1], parse_signature_lines(decoded[split + 2 :]))

    def render(self) -> bytes:
        """The note's bytes: text, blank line, one line per signature."""
        return (self.text + "\n" + "".join(s.line() for s in self.signatures)).encode()

    def signatures_of(self, vkey: VerifierKey) -> list[NoteSignature]:
        """The signature lines that claim to be `vkey`'s (same name and key ID); a line
        with only one of the two is another key's and is ignored, as the spec says."""
        return [s for s in self.signatures if (s.name, s.key_id) == (vkey.name, vkey.key_id)]


def decode_note(data: bytes) -> str:
    """The bytes of a note, or of signature lines, as text: UTF-8 with no control
    character but the newline."""
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError:
        raise NoteError("a note is UTF-8") from None
    if _CONTROL_RE.search(decoded):
        raise NoteError("a note holds no control character but newlines")
    return decoded


def parse_signature_lines(block: str) -> tuple[NoteSignature, ...]:
    """One signature line or more (at most MAX_SIGNATURES), each ending in a newline."""
    # Split on newlines alone: str.splitlines would also cut at U+2028 and the like.
    lines = block.split("\n")
    if lines[-1] != "" or not 1 < len(lines) <= MAX_SIGNATURES + 1:
        raise NoteError("a note carries one signature line or more (at most 100)")
    return tuple(_parse_signature_line(line) for line in lines[:-1])


def _parse_signature_line(line: str) -> NoteSignature:
    if not line.startswith(SIGNATURE_PREFIX):
        raise NoteError("a signature line starts with an em dash and a space")
    name, space, encoded = line[len(SIGNATURE_PREFIX) :].partition(" ")
    if not space or not valid_key_name(name):
        raise NoteError("a signature line names a valid key")
    raw = strict_b64decode(encoded)
    if len(raw) < 5:
        raise NoteError("a signature carries a key ID and signature bytes")
    return NoteSignature(name, int.from_bytes(raw[:4], "big"), raw[4:])


class NoteSigner:
    """Signs note texts with an Ed25519 key under a key name (type 0x01)."""

    def __init__(self, name: str, key: Ed25519PrivateKey) -> None:
        if not valid_key_name(name):
            raise NoteError("a key name is non-empty, with no space and no plus")
        self._key = key
        public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.verifier_key = VerifierKey(name, key_id(name, ED25519, public), ED25519, public)

    def sign(self, text: str) -> bytes:
        """The signed note: `text` (which must end in a newline), a blank line, and
        this key's signature line."""
        _check_text(text)
        signature = self._key.sign(text.encode())
        vkey = self.verifier_key
        return SignedNote(text, (NoteSignature(vkey.name, vkey.key_id, signature),)).render()


def _check_text(text: str) -> None:
    if not text.endswith("\n") or _CONTROL_RE.search(text):
        raise NoteError("a note text ends in a newline and holds no other control character")


def open_note(note: bytes, vkey: VerifierKey) -> SignedNote:
    """The note, once a signature of `vkey` (an Ed25519 note key) holds on its text.
    Raises NoteError when the key did not sign it, or when any line claiming to be
    that key's does not verify (the spec's SHOULD: reject the whole note)."""
    parsed = SignedNote.parse(note)
    public = vkey.ed25519_key(ED25519)
    claimed = parsed.signatures_of(vkey)
    if not claimed:
        raise NoteError("the note carries no signature of the key")
    for signature in claimed:
        try:
            public.verify(signature.signature, parsed.text.encode())
        except InvalidSignature:
            raise NoteError("the note's signature does not verify under the key") from None
    return parsed
