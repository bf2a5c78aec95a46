"""Verify a sessionstate evidence bundle with Python's standard library and openssl alone.

(In the repository this imports `store.chain.rfc9162`; the `verify.py` shipped is this
file with that module's code in place of the import line: `service.decisions.shipped_verifier`.)

This file is shipped in every bundle as `verify.py`, and `sessionstate decisions
verifier` prints it. Run it with no sessionstate installed, on the directory the
bundle was unpacked to (by default, the directory this file is in):

    python3 -I verify.py [--public-key YOUR-PINNED-KEY.pem] [--tsa-ca TSA-CA.pem] [BUNDLE_DIR]

A verifier shipped inside the bundle it checks can be replaced with the bundle:
run one you obtained separately, on the bundle's directory. It checks, and says,
exactly this:

1. `checkpoint.json` and `manifest.json` are signed by the Ed25519 key (checked by
   `openssl pkeyutl`), both name that key, the same head and the same time.
2. Every line of `entries.ndjson` is an entry in RFC 8785 canonical JSON, byte for
   byte, whose `hash` is the sha256 of the canonical JSON of the rest of it.
3. The entries are in chain order, at or below the signed head, and are exactly the
   seqs and hashes the signed manifest lists: none edited, added, removed or moved.
4. Entries with consecutive seqs link by content (`prev_hash`); an entry at seq 1
   links to the genesis hash, and one at the head's seq has the head's hash.
5. Every entry fits the selection the manifest states (tenant, action, time range).
6. The chain's Merkle tree (RFC 6962 / RFC 9162), as the signed manifest's `log` states
   it: `checkpoint.note` (a C2SP tlog-checkpoint in a signed note) is signed by the log's
   note key `log-key.vkey`, whose Ed25519 key is the checkpoint key; its origin, tree
   size (the signed head's seq) and root are the manifest's; each entry's leaf hash is
   SHA-256(0x00 || its line's bytes) and its inclusion proof (`proofs.ndjson`, one a line,
   in the order of the entries) leads to the note's root; each witness's tlog-cosignature
   v1 on the note verifies (Ed25519 over "cosignature/v1", "time <its time>" and the note's
   text) and how many of the listed witnesses cosigned against the quorum; when the
   witnesses cosigned an older head (`witnessed.note`), that the note's tree extends it
   (`consistency.json`). When a time-stamping authority timestamped a note of the chain,
   that `timestamp.tsr` names the SHA-256 of the signed text of the note it is over
   (`checkpoint.note`, or an older `timestamped.note` the note's tree extends, by
   `timestamp-consistency.json`), and with `--tsa-ca` that `openssl ts -verify` accepts
   it under that CA. A bundle of a chain without a tree says why none is here.
7. Every other file of the bundle (`entries.ndjson`, `checkpoint.json`,
   `public-key.pem`, `verify.py`, `README.md`, and the tree's files) has the sha256 the
   signed manifest lists for it: a bundle's own `verify.py` or README that was replaced
   fails here. Files the manifest does not list are named, not refused: no signature
   covers them.

Entries of other tenants, or outside the selection, are not in the bundle: the
links across them cannot be recomputed here, and rest on the manifest's signature.
Without `--public-key`, the key shipped in the bundle is used, which proves only
that the bundle is consistent: compare its key_id with the key you pinned. The
witnesses' keys are the ones the manifest lists: compare them with the witnesses' own.

Exit 0: every check held. 1: a check failed. 2: it could not check (a file is
missing, openssl is missing or older than 3.0). Needs Python 3.8 or later.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from store.chain.rfc9162 import leaf_hash, verify_consistency, verify_inclusion

MANIFEST_KIND = "sessionstate.evidence_bundle.v3"
# Manifests of bundles made before the manifest stated the chain's Merkle tree (`log`).
UNPROVEN_MANIFEST_KIND = "sessionstate.evidence_bundle.v2"
# Manifests of bundles made before the manifest listed the files' sha256.
UNHASHED_MANIFEST_KIND = "sessionstate.evidence_bundle.v1"
SIGNED_FILES = ("entries.ndjson", "checkpoint.json", "public-key.pem", "verify.py", "README.md")
# With the chain's Merkle tree (the manifest's `log` not `absent`), and an older witnessed note.
LOG_FILES = ("checkpoint.note", "proofs.ndjson", "log-key.vkey")
WITNESSED_FILES = ("witnessed.note", "consistency.json")
# With a kept timestamp: of the note itself, or of an older note the note's tree extends.
TIMESTAMP_FILES = ("timestamp.tsr",)
TIMESTAMPED_FILES = ("timestamped.note", "timestamp-consistency.json")
# The DER of an OCTET STRING of 32 bytes: how a reply's message imprint holds the digest.
_IMPRINT_PREFIX = bytes([0x04, 0x20])
MANIFEST_FILES = ("manifest.json", "manifest.sig")
GENESIS_HASH = "sha256:" + "0" * 64
MAX_SAFE_INTEGER = 2**53 - 1  # RFC 8785 numbers are IEEE 754 doubles
CHECKPOINT_FIELDS = ("head_hash", "issued_at", "key_id", "seq")
# The DER of an Ed25519 SubjectPublicKeyInfo is these 12 bytes, then the 32-byte key.
ED25519_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
_HASH = re.compile(r"sha256:[0-9a-f]{64}")
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?Z")


class Failed(Exception):
    """A check that did not hold: the bundle is not what its signatures say."""


class CannotCheck(Exception):
    """A check that could not run here."""


# --- RFC 8785 (JCS) canonical JSON, for the values JSON parsing gives ----------------------


def canonical(value: Any) -> bytes:
    """RFC 8785 bytes of a parsed JSON value; ValueError for what has no canonical form."""
    return _canonical(value).encode("utf-8")  # a lone surrogate raises here


def _canonical(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise ValueError("an integer beyond 2**53 has no canonical form")
        return str(value)
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, str):
        # json escapes exactly what RFC 8785 does: " \ \b \f \n \r \t, else \u00xx below 0x20.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ",".join(_canonical(item) for item in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value, key=lambda key: key.encode("utf-16-be"))  # by UTF-16 code units
        members = (
            json.dumps(key, ensure_ascii=False) + ":" + _canonical(value[key]) for key in keys
        )
        return "{" + ",".join(members) + "}"
    raise ValueError("not a JSON value")


def _number(value: float) -> str:
    """ECMAScript's Number::toString, as RFC 8785 prescribes: the shortest digits that
    round-trip (Python's repr finds the same), placed as JavaScript places them."""
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("NaN and Infinity are not JSON")
    if value == 0:
        return "0"
    if value < 0:
        return "-" + _number(-value)
    mantissa, _, exponent = repr(value).partition("e")
    whole, _, fraction = mantissa.partition(".")
    figures = whole + fraction
    significant = figures.lstrip("0")
    # value == 0.<significant> * 10**point
    point = len(whole) + int(exponent or 0) - (len(figures) - len(significant))
    digits = significant.rstrip("0")
    if len(digits) <= point <= 21:
        return digits + "0" * (point - len(digits))
    if 0 < point <= 21:
        return digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return "0." + "0" * -point + digits
    power = point - 1
    sign = "+" if power >= 0 else "-"
    head = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{head}e{sign}{abs(power)}"


def parse(data: bytes, what: str) -> Any:
    """One JSON document, strictly: UTF-8, no duplicate keys, no NaN or Infinity."""
    try:
        return json.loads(
            data.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant
        )
    except ValueError:
        raise Failed(f"{what} is not one well-formed JSON document") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        raise ValueError("duplicate key")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError("NaN and Infinity are not JSON")


def entry_hash(entry: dict[str, Any]) -> str:
    """What an entry's `hash` must be: sha256 of the canonical JSON of the rest of it."""
    body = {name: value for name, value in entry.items() if name != "hash"}
    return "sha256:" + hashlib.sha256(canonical(body)).hexdigest()


# --- signatures, with openssl --------------------------------------------------------------


def raw_public_key(public_key_pem: bytes) -> bytes:
    """The 32 bytes of an Ed25519 public key in PEM (SubjectPublicKeyInfo)."""
    text = public_key_pem.decode("ascii", "replace")
    body = re.search(r"-----BEGIN PUBLIC KEY-----(.*?)-----END PUBLIC KEY-----", text, re.S)
    try:
        der = base64.b64decode("".join(body.group(1).split()), validate=True) if body else b""
    except binascii.Error:
        der = b""
    if len(der) != 44 or not der.startswith(ED25519_SPKI_PREFIX):
        raise CannotCheck("the public key is not an Ed25519 public key in PEM")
    return der[12:]


def key_id_of(public_key_pem: bytes) -> str:
    """`ed25519:` and 16 hex of the sha256 of the raw key, as sessionstate names keys."""
    return "ed25519:" + hashlib.sha256(raw_public_key(public_key_pem)).hexdigest()[:16]


def openssl_verify(
    public_key: Path, payload: bytes, signature: bytes, what: str, whose: str = "the public key"
) -> None:
    """Check an Ed25519 signature with `openssl pkeyutl -verify -rawin` (OpenSSL 3.0+)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise CannotCheck("openssl is not on PATH, so no signature can be checked here")
    with tempfile.TemporaryDirectory() as scratch:
        payload_file, signature_file = Path(scratch, "payload"), Path(scratch, "signature")
        payload_file.write_bytes(payload)
        signature_file.write_bytes(signature)
        command = [openssl, "pkeyutl", "-verify", "-pubin", "-inkey", str(public_key)]
        command += ["-rawin", "-in", str(payload_file), "-sigfile", str(signature_file)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603
    if "Signature Verified Successfully" in done.stdout:
        return
    if "Signature Verification Failure" in done.stdout:
        raise Failed(f"{what}: the signature does not verify with {whose}")
    said = (done.stderr.strip().splitlines() or ["no output"])[0]
    raise CannotCheck(f"openssl could not check {what} (OpenSSL 3.0 or later is needed): {said}")


# --- the bundle ----------------------------------------------------------------------------


def read(bundle: Path, name: str) -> bytes:
    try:
        return (bundle / name).read_bytes()
    except OSError:
        raise CannotCheck(f"{name} is missing from {bundle}") from None


def check_checkpoint(bundle: Path, key_file: Path, key_id: str) -> dict[str, Any]:
    checkpoint = parse(read(bundle, "checkpoint.json"), "checkpoint.json")
    return checked(checkpoint, "checkpoint.json", key_file, key_id)


def checked(checkpoint: Any, what: str, key_file: Path, key_id: str) -> dict[str, Any]:
    """A checkpoint (`what` names where it is) whose fields and signature hold."""
    if not isinstance(checkpoint, dict):
        raise Failed(f"{what} is not a sessionstate checkpoint")
    # A checkpoint names the tenant whose chain it is of; only older ones name none.
    fields = (*CHECKPOINT_FIELDS, "tenant_id") if "tenant_id" in checkpoint else CHECKPOINT_FIELDS
    if sorted(checkpoint) != sorted((*fields, "signature")):
        raise Failed(f"{what} is not a sessionstate checkpoint")
    if not isinstance(checkpoint.get("tenant_id", ""), str):
        raise Failed(f"{what} is not a sessionstate checkpoint")
    seq, head_hash = checkpoint["seq"], checkpoint["head_hash"]
    if type(seq) is not int or seq < 0 or not isinstance(head_hash, str):
        raise Failed(f"{what} is not a sessionstate checkpoint")
    if _HASH.fullmatch(head_hash) is None or not isinstance(checkpoint["issued_at"], str):
        raise Failed(f"{what} is not a sessionstate checkpoint")
    if checkpoint["key_id"] != key_id:
        raise Failed(f"{what} was signed by {checkpoint['key_id']}, not by {key_id}")
    try:
        signature = base64.urlsafe_b64decode(str(checkpoint["signature"]) + "==")
    except (binascii.Error, ValueError):
        raise Failed(f"{what}'s signature is not base64url") from None
    # The signed bytes: RFC 8785 canonical JSON of every field but the signature.
    payload = canonical({name: checkpoint[name] for name in fields})
    openssl_verify(key_file, payload, signature, what)
    return checkpoint


def check_manifest(bundle: Path, key_file: Path, checkpoint: dict[str, Any]) -> dict[str, Any]:
    signed = read(bundle, "manifest.json")
    openssl_verify(key_file, signed, read(bundle, "manifest.sig"), "manifest.json")
    parsed = parse(signed, "manifest.json")
    manifest: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
    kind = manifest.get("kind")
    if kind not in (MANIFEST_KIND, UNPROVEN_MANIFEST_KIND, UNHASHED_MANIFEST_KIND):
        raise Failed(f"manifest.json is not a {MANIFEST_KIND} manifest")
    head = manifest.get("head")
    if kind == MANIFEST_KIND:
        check_log_member(manifest.get("log"), checkpoint["seq"])
    files = signed_files(manifest)
    if kind != UNHASHED_MANIFEST_KIND and not _lists_every_file(manifest.get("sha256"), files):
        raise Failed("manifest.json's sha256 does not list every file of the bundle")
    same = (
        manifest.get("key_id") == checkpoint["key_id"]
        and manifest.get("issued_at") == checkpoint["issued_at"]
        and head == {"seq": checkpoint["seq"], "hash": checkpoint["head_hash"]}
    )
    if not same:
        raise Failed("manifest.json and checkpoint.json name different heads, times or keys")
    listed = manifest.get("entries")
    if not isinstance(listed, list) or not all(_is_link(item) for item in listed):
        raise Failed("manifest.json's entries are not [seq, hash] pairs")
    if not isinstance(manifest.get("selection"), dict):
        raise Failed("manifest.json states no selection")
    if type(manifest.get("verified_from_seq")) is not int:
        raise Failed("manifest.json states no verified_from_seq")
    return manifest


def signed_files(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The files whose sha256 the manifest lists: the bundle's, and its tree's."""
    return SIGNED_FILES + log_files(manifest)


def _lists_every_file(listed: Any, names: tuple[str, ...]) -> bool:
    return (
        isinstance(listed, dict)
        and sorted(listed) == sorted(names)
        and all(
            isinstance(digest, str) and _HEX_DIGEST.fullmatch(digest) for digest in listed.values()
        )
    )


def _is_link(item: Any) -> bool:
    return (
        isinstance(item, list)
        and len(item) == 2
        and type(item[0]) is int
        and isinstance(item[1], str)
    )


def recorded_loss(
    entry: dict[str, Any], previous: dict[str, Any] | None, key_file: Path, key_id: str
) -> list[int] | None:
    """The seqs [first, last] a loss entry (`sessionstate decisions record-loss`) says are
    gone before it, when it records exactly the gap after `previous`: it follows that entry,
    takes the seq after the signed head it names (whose signature must hold) and links to
    that head's hash. None for any other entry: its gap is then an ordinary one."""
    loss = entry.get("loss")
    if previous is None or not isinstance(loss, dict):
        return None
    seq, after = entry["seq"], previous["seq"]
    head = checked(loss.get("signed_head"), f"seq {seq}'s signed head", key_file, key_id)
    follows = {"seq": after, "hash": previous["hash"]}
    if (
        loss.get("follows") != follows
        or loss.get("lost_from_seq") != after + 1
        or loss.get("lost_to_seq") != seq - 1
        or head["seq"] != seq - 1
        or entry.get("prev_hash") != head["head_hash"]
    ):
        return None
    return [after + 1, seq - 1]


def check_entries(
    bundle: Path, manifest: dict[str, Any], key_file: Path, key_id: str
) -> dict[str, Any]:
    """Each line's bytes, hash, order, links and selection; then the list against the manifest."""
    data = read(bundle, "entries.ndjson")
    if data and not data.endswith(b"\n"):
        raise Failed("entries.ndjson does not end with a newline: it was cut")
    head_seq, head_hash = manifest["head"]["seq"], manifest["head"]["hash"]
    selection = manifest["selection"]
    found: list[list[Any]] = []
    linked = 0
    losses: list[list[int]] = []
    previous: dict[str, Any] | None = None
    # Each entry is its canonical bytes and one LF: split on LF alone, so a CR is a byte
    # of the line and fails the canonical-bytes check below.
    for number, line in enumerate(data.split(b"\n")[:-1], start=1):
        if line.endswith(b"\r"):
            raise Failed(f"entries.ndjson line {number} ends with CR LF: not the bytes stored")
        entry = parse(line, f"entries.ndjson line {number}")
        if not isinstance(entry, dict):
            raise Failed(f"entries.ndjson line {number} is not an entry")
        seq, claimed = entry.get("seq"), entry.get("hash")
        if type(seq) is not int or not isinstance(claimed, str) or _HASH.fullmatch(claimed) is None:
            raise Failed(f"entries.ndjson line {number} is not an entry")
        try:
            exact = canonical(entry) == line
            recomputed = entry_hash(entry)
        except ValueError:
            raise Failed(f"seq {seq}: its content has no canonical JSON form") from None
        if not exact:
            raise Failed(f"seq {seq}: not the canonical bytes the service stored")
        if recomputed != claimed:
            raise Failed(f"seq {seq}: its content does not hash to its hash (hash_mismatch)")
        if previous is not None and seq <= previous["seq"]:
            raise Failed(f"seq {seq}: out of chain order after seq {previous['seq']}")
        if seq > head_seq or (seq == head_seq and claimed != head_hash):
            raise Failed(f"seq {seq}: not on the chain up to the signed head")
        if seq < manifest["verified_from_seq"]:
            raise Failed(f"seq {seq}: below where the service verified the chain from")
        if previous is not None and seq == previous["seq"] + 1:
            if entry.get("prev_hash") != previous["hash"]:
                raise Failed(f"seq {seq}: does not link to seq {seq - 1} (prev_hash_mismatch)")
            linked += 1
        elif previous is not None:
            lost = recorded_loss(entry, previous, key_file, key_id)
            losses.extend([] if lost is None else [lost])
        if seq == 1 and entry.get("prev_hash") != GENESIS_HASH:
            raise Failed("seq 1: does not link to the genesis hash (prev_hash_mismatch)")
        why = outside(entry, selection)
        if why is not None:
            raise Failed(f"seq {seq}: outside the bundle's selection ({why})")
        found.append([seq, claimed])
        previous = entry
    compare(found, manifest["entries"])
    return {"entries": len(found), "linked": linked, "losses": losses}


def outside(entry: dict[str, Any], selection: dict[str, Any]) -> str | None:
    """Why an entry does not fit the selection, or None when it does."""
    decision, target = _member(entry, "decision"), _member(entry, "target")
    tenant = selection.get("tenant_id")
    if tenant is not None and target.get("tenant_id") != tenant:
        return "another tenant"
    if selection.get("action") is not None and decision.get("action") != selection["action"]:
        return "another action"
    if selection.get("allow") is not None and decision.get("allow") is not selection["allow"]:
        return "another decision"
    since, until = selection.get("since"), selection.get("until")
    if since is None and until is None:
        return None
    evaluated = moment(decision.get("evaluated_at"))
    if evaluated is None:
        return "no evaluated_at to compare"
    if since is not None and evaluated < _moment_of(since):
        return "evaluated before since"
    if until is not None and evaluated >= _moment_of(until):
        return "evaluated at or after until"
    return None


def _member(entry: dict[str, Any], name: str) -> dict[str, Any]:
    value = entry.get(name)
    return value if isinstance(value, dict) else {}


def moment(text: Any) -> tuple[int, ...] | None:
    """An RFC 3339 UTC time ending in Z as comparable numbers (nanoseconds last)."""
    match = _TIME.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        return None
    *fields, fraction = match.groups()
    return (*(int(field) for field in fields), int((fraction or "").ljust(9, "0")))


def _moment_of(text: Any) -> tuple[int, ...]:
    value = moment(text)
    if value is None:
        raise Failed("manifest.json's selection has a time that is not RFC 3339 UTC")
    return value


def check_files(bundle: Path, manifest: dict[str, Any]) -> str:
    """Each file's sha256 against the manifest's; what the listing said, as one line."""
    listed = manifest.get("sha256")
    if manifest["kind"] == UNHASHED_MANIFEST_KIND or not isinstance(listed, dict):
        return (
            "not listed in this (v1) manifest: no signature covers verify.py or README.md; "
            "run a verifier you obtained separately"
        )
    names = signed_files(manifest)
    for name in names:
        if hashlib.sha256(read(bundle, name)).hexdigest() != listed[name]:
            raise Failed(f"{name}: its sha256 is not the one the signed manifest lists")
    try:
        present = sorted(path.name for path in bundle.iterdir())
    except OSError:
        raise CannotCheck(f"cannot list {bundle}") from None
    unlisted = [name for name in present if name not in (*names, *MANIFEST_FILES)]
    said = f"{len(names)}, each with the sha256 the signed manifest lists"
    if unlisted:
        said += "; not in the manifest, so covered by no signature: " + ", ".join(unlisted)
    return said


def compare(found: list[list[Any]], listed: list[list[Any]]) -> None:
    """The entries must be exactly the manifest's list: name the first difference."""
    for index in range(max(len(found), len(listed))):
        have = found[index] if index < len(found) else None
        want = listed[index] if index < len(listed) else None
        if have == want:
            continue
        if want is None or (have is not None and have[0] < want[0]):
            raise Failed(f"seq {have[0] if have else '?'}: in entries.ndjson, not in the manifest")
        if have is None or have[0] > want[0]:
            raise Failed(f"seq {want[0]}: in the manifest, missing from entries.ndjson")
        raise Failed(f"seq {have[0]}: its hash is not the one the manifest lists")


def verify(bundle: Path, pinned: Path | None, tsa_ca: Path | None = None) -> list[str]:
    """Every check, in order; what was shown, as lines. Raises Failed or CannotCheck."""
    key_file = pinned if pinned is not None else bundle / "public-key.pem"
    key_id = key_id_of(read(key_file.parent, key_file.name))
    checkpoint = check_checkpoint(bundle, key_file, key_id)
    manifest = check_manifest(bundle, key_file, checkpoint)
    counts = check_entries(bundle, manifest, key_file, key_id)
    tree = (
        check_log(bundle, manifest, key_file, tsa_ca) if manifest["kind"] == MANIFEST_KIND else []
    )
    files = check_files(bundle, manifest)
    entries, linked, losses = counts["entries"], counts["linked"], counts["losses"]
    seqs = [item[0] for item in manifest["entries"]]
    gaps = sum(1 for index in range(1, len(seqs)) if seqs[index] != seqs[index - 1] + 1)
    gaps -= len(losses)
    head_seq = checkpoint["seq"]
    if not seqs:
        tail = f"no entries here; the signed head is seq {head_seq}"
    elif seqs[-1] == head_seq:
        tail = "the last entry here is the signed head"
    elif seqs[-1] + 1 == head_seq:
        tail = f"seq {head_seq} (the signed head) is not in this bundle"
    else:
        tail = f"seq {seqs[-1] + 1} to {head_seq} (the signed head) are not in this bundle"
    selection = ", ".join(
        f"{k} {v}" for k, v in sorted(manifest["selection"].items()) if v is not None
    )
    whose = (
        "your pinned key" if pinned else "shipped in the bundle: compare with the key you pinned"
    )
    lines = [
        f"key        {key_id}  ({whose})",
        f"checkpoint head seq {checkpoint['seq']} {checkpoint['head_hash']}, issued "
        f"{checkpoint['issued_at']}: signature verified",
        "manifest   signature verified; same key, head and time as the checkpoint",
        f"selection  {selection or 'every entry of the chain'}",
        f"entries    {entries}: canonical bytes, each hash recomputed, exactly the manifest's list",
        f"links      {linked} between consecutive seqs checked by prev_hash; {gaps} gaps cross "
        "entries not in this bundle, and rest on the manifest's signature alone",
        f"head       {tail}",
        *(
            f"loss       seqs {first} to {last} are gone: the chain's own entry at seq "
            f"{last + 1} says so, under the signed head at seq {last} (signature verified)"
            for first, last in losses
        ),
        *(tree or ["proofs     none: this bundle was made before bundles carried Merkle proofs"]),
        f"files      {files}",
    ]
    return lines


# --- the Merkle tree: checkpoint notes, proofs and cosignatures (C2SP, RFC 9162) ----------

NOTE_SIGNATURE = "\u2014 "  # an em dash and a space start each signature line of a note
NOTE_ED25519 = 0x01  # the log's note key: Ed25519 over the note's text
COSIGNATURE_V1 = 0x04  # a witness's key: Ed25519 over "cosignature/v1", its time and the text
_NOTE_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f]")
_KEY_ID = re.compile(r"[0-9a-f]{8}")
_TREE_SIZE = re.compile(r"0|[1-9][0-9]{0,18}")
PROOF_FIELDS = ["hashes", "leaf_hash", "leaf_index", "tree_size"]
CONSISTENCY_FIELDS = ["first", "hashes", "second"]


def b64(text: Any, what: str) -> bytes:
    """Standard, padded base64 in its one canonical form."""
    try:
        raw = base64.b64decode(text, validate=True) if isinstance(text, str) else None
    except (binascii.Error, ValueError):
        raw = None
    if raw is None or base64.b64encode(raw).decode() != text:
        raise Failed(f"{what} is not canonical base64")
    return raw


def parse_vkey(text: Any, what: str, signature_type: int) -> dict[str, Any]:
    """A note verifier key `<name>+<hex key ID>+base64(type || Ed25519 key)`, its ID checked."""
    parts = text.split("+", 2) if isinstance(text, str) else []
    if len(parts) != 3 or not parts[0] or _KEY_ID.fullmatch(parts[1]) is None:
        raise Failed(f"{what} is not a note verifier key")
    name, material = parts[0], b64(parts[2], what)
    if len(material) != 33 or material[0] != signature_type or any(c.isspace() for c in name):
        raise Failed(f"{what} is not an Ed25519 note key of type 0x{signature_type:02x}")
    key_id = hashlib.sha256(name.encode() + b"\n" + material[:1] + material[1:]).digest()[:4]
    if key_id.hex() != parts[1]:
        raise Failed(f"{what}: its key ID does not match its name and key")
    return {"name": name, "key_id": key_id, "public_key": material[1:], "text": text}


def parse_note(data: bytes, what: str) -> tuple[str, list[tuple[str, bytes, bytes]]]:
    """A signed note: its text (ending in a newline) and its (name, key ID, signature) lines."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Failed(f"{what} is not UTF-8 text") from None
    split = text.rfind("\n\n")
    if _NOTE_CONTROL.search(text) or split < 0:
        raise Failed(f"{what} is not a signed note")
    lines = text[split + 2 :].split("\n")
    if lines[-1] != "" or len(lines) < 2:
        raise Failed(f"{what} is not a signed note")
    signatures = []
    for line in lines[:-1]:
        name, space, encoded = line[len(NOTE_SIGNATURE) :].partition(" ")
        if not line.startswith(NOTE_SIGNATURE) or not space or not name:
            raise Failed(f"{what} has a line that is not a note signature")
        raw = b64(encoded, f"{what}'s signature of {name}")
        if len(raw) < 5:
            raise Failed(f"{what}'s signature of {name} is cut")
        signatures.append((name, raw[:4], raw[4:]))
    return text[: split + 1], signatures


def tree_head(text: str, what: str) -> tuple[str, int, bytes]:
    """A C2SP tlog-checkpoint's origin, tree size and root hash."""
    lines = text.split("\n")
    if len(lines) != 4 or _TREE_SIZE.fullmatch(lines[1]) is None:
        raise Failed(f"{what} is not a checkpoint: origin, tree size and root hash")
    root = b64(lines[2], f"{what}'s root hash")
    if len(root) != 32:
        raise Failed(f"{what}'s root hash is not 32 bytes")
    return lines[0], int(lines[1]), root


def ed25519_verify(
    public_key: bytes, payload: bytes, signature: bytes, what: str, whose: str = "the public key"
) -> None:
    """`openssl_verify` with a raw Ed25519 key (a note key), written out as PEM."""
    der = ED25519_SPKI_PREFIX + public_key
    pem = "-----BEGIN PUBLIC KEY-----\n" + base64.b64encode(der).decode()
    with tempfile.TemporaryDirectory() as scratch:
        key_file = Path(scratch, "key.pem")
        key_file.write_text(pem + "\n-----END PUBLIC KEY-----\n")
        openssl_verify(key_file, payload, signature, what, whose)


def open_log_note(bundle: Path, name: str, log_key: dict[str, Any]) -> dict[str, Any]:
    """A note of the log: its log signature verified, its head, and its other signatures."""
    text, signatures = parse_note(read(bundle, name), name)
    mine = [s for s in signatures if (s[0], s[1]) == (log_key["name"], log_key["key_id"])]
    if not mine:
        raise Failed(f"{name} carries no signature of the log key")
    for signature in mine:
        ed25519_verify(log_key["public_key"], text.encode(), signature[2], name)
    origin, size, root = tree_head(text, name)
    return {"text": text, "origin": origin, "size": size, "root": root, "lines": signatures}


def cosigners(note: dict[str, Any], witnesses: list[dict[str, Any]], what: str) -> list[str]:
    """The witnesses whose tlog-cosignature v1 on the note verifies; one that does not fails."""
    names = []
    for witness in witnesses:
        claimed = [s for s in note["lines"] if (s[0], s[1]) == (witness["name"], witness["key_id"])]
        for _, _, raw in claimed:
            if len(raw) != 72:
                raise Failed(f"{what}: {witness['name']}'s cosignature is not a v1 cosignature")
            stamp = int.from_bytes(raw[:8], "big")
            message = f"cosignature/v1\ntime {stamp}\n{note['text']}".encode()
            ed25519_verify(
                witness["public_key"],
                message,
                raw[8:],
                f"{what} cosigned by {witness['name']}",
                "the witness's key",
            )
        if claimed:
            names.append(witness["name"])
    return names


def check_log_member(log: Any, head_seq: int) -> None:
    """The manifest's `log`: `absent` and why, or the tree, its keys and its witnesses."""
    if isinstance(log, dict) and sorted(log) == ["absent"] and isinstance(log["absent"], str):
        return
    fields = ["origin", "quorum", "root_hash", "tree_size", "verifier_key", "witnesses"]
    sizes = ["timestamped_size", "witnessed_size"]
    if not isinstance(log, dict) or sorted(log) != sorted([*fields, *sizes]):
        raise Failed("manifest.json's log is not a Merkle tree's statement")
    witnesses = log["witnesses"]
    if log["tree_size"] != head_seq or not isinstance(witnesses, list):
        raise Failed("manifest.json's log is not of the signed head's tree")
    for name in sizes:
        size = log[name]
        if size is not None and (type(size) is not int or not 0 < size <= head_seq):
            raise Failed(f"manifest.json's log names a {name.split('_')[0]} size beyond its tree")
    quorum = log["quorum"]
    if type(quorum) is not int or not (
        0 < quorum <= len(witnesses) or quorum == len(witnesses) == 0
    ):
        raise Failed("manifest.json's log states no quorum of its witnesses")


def log_files(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The files the manifest's `log` says the bundle holds."""
    log = manifest.get("log")
    if manifest["kind"] != MANIFEST_KIND or not isinstance(log, dict) or "absent" in log:
        return ()
    witnessed, stamped = log["witnessed_size"], log["timestamped_size"]
    return (
        LOG_FILES
        + (WITNESSED_FILES if witnessed not in (None, log["tree_size"]) else ())
        + (TIMESTAMP_FILES if stamped is not None else ())
        + (TIMESTAMPED_FILES if stamped not in (None, log["tree_size"]) else ())
    )


def check_log(
    bundle: Path, manifest: dict[str, Any], key_file: Path, tsa_ca: Path | None = None
) -> list[str]:
    """The note, the inclusion proofs, the witnesses' cosignatures and the quorum, and the
    timestamp."""
    log = manifest["log"]
    if "absent" in log:
        return [
            f"proofs     absent: {log['absent']} (this chain has no Merkle tree that holds); "
            "the entries rest on the hash chain and the signatures above"
        ]
    log_key = parse_vkey(log["verifier_key"], "the manifest's log verifier_key", NOTE_ED25519)
    if read(bundle, "log-key.vkey") != (log["verifier_key"] + "\n").encode():
        raise Failed("log-key.vkey is not the verifier key the manifest names")
    if log_key["public_key"] != raw_public_key(read(key_file.parent, key_file.name)):
        raise Failed("the log's note key is not the checkpoint key: the notes are another's")
    note = open_log_note(bundle, "checkpoint.note", log_key)
    same = (note["origin"], note["size"]) == (log["origin"], log["tree_size"])
    if not same or base64.b64encode(note["root"]).decode() != log["root_hash"]:
        raise Failed("checkpoint.note is not the tree head the manifest states")
    proved = check_inclusion(bundle, note)
    lines = [
        f"log key    {log['verifier_key']}  (the checkpoint key, as a note key)",
        f"note       {note['origin']}, tree size {note['size']} (the signed head's seq), "
        f"root {log['root_hash']}: signature verified",
        f"proofs     {proved} inclusion proofs: each entry's leaf is SHA-256(0x00 || its line), "
        "its audit path verified against the note's root",
    ]
    lines += check_witnesses(bundle, log, log_key, note)
    return lines + check_timestamp(bundle, log, log_key, note, tsa_ca)


def check_inclusion(bundle: Path, note: dict[str, Any]) -> int:
    """Each entry's inclusion proof, in the order of entries.ndjson."""
    entries = read(bundle, "entries.ndjson").split(b"\n")[:-1]
    proofs = read(bundle, "proofs.ndjson").split(b"\n")
    if proofs[-1] != b"" or len(proofs) - 1 != len(entries):
        raise Failed("proofs.ndjson does not hold one proof a line for each entry")
    for number, line in enumerate(entries, start=1):
        data = proofs[number - 1]
        seq = json.loads(line)["seq"]  # check_entries parsed every line already
        proof = parse(data, f"proofs.ndjson line {number}")
        if not isinstance(proof, dict) or sorted(proof) != PROOF_FIELDS:
            raise Failed(f"proofs.ndjson line {number} is not an inclusion proof")
        hashes = proof["hashes"] if isinstance(proof["hashes"], list) else [None]
        path = [b64(item, f"seq {seq}'s inclusion proof") for item in hashes]
        if (proof["leaf_index"], proof["tree_size"]) != (seq - 1, note["size"]):
            raise Failed(f"seq {seq}: its inclusion proof is not of its leaf in the note's tree")
        if b64(proof["leaf_hash"], f"seq {seq}'s leaf hash") != leaf_hash(line):
            raise Failed(f"seq {seq}: its proof's leaf hash is not SHA-256(0x00 || its line)")
        if not verify_inclusion(seq - 1, note["size"], leaf_hash(line), path, note["root"]):
            raise Failed(f"seq {seq}: its inclusion proof does not verify against the note's root")
    return len(entries)


def check_witnesses(
    bundle: Path, log: dict[str, Any], log_key: dict[str, Any], note: dict[str, Any]
) -> list[str]:
    """Whose cosignatures the note (or the older witnessed note) carries, and the quorum."""
    witnesses = [
        parse_vkey(text, f"the manifest's witness {n + 1}", COSIGNATURE_V1)
        for n, text in enumerate(log["witnesses"])
    ]
    if not witnesses:
        return ["witnesses  none configured: the note is the log's own word"]
    keys = "; keys (compare with the witnesses' own): " + ", ".join(log["witnesses"])
    cosigned, quorum, size = (
        cosigners(note, witnesses, "checkpoint.note"),
        log["quorum"],
        note["size"],
    )
    extends = ""
    if log["witnessed_size"] not in (None, size):
        older = open_log_note(bundle, "witnessed.note", log_key)
        if (older["origin"], older["size"]) != (note["origin"], log["witnessed_size"]):
            raise Failed("witnessed.note is not the witnessed head the manifest states")
        check_consistency(bundle, older, note)
        cosigned, size = cosigners(older, witnesses, "witnessed.note"), older["size"]
        extends = (
            f"; the note's tree extends it (consistency proof {size} to {note['size']} verified)"
        )
    if log["witnessed_size"] is None or not cosigned:
        return [
            f"witnesses  none of {len(witnesses)} has cosigned a head here (quorum {quorum}: not met){keys}"
        ]
    met = "met" if len(cosigned) >= quorum else "not met"
    return [
        f"witnesses  {len(cosigned)} of {len(witnesses)} cosigned tree size {size} "
        f"({', '.join(cosigned)}; quorum {quorum}: {met}){extends}{keys}"
    ]


def check_consistency(
    bundle: Path,
    older: dict[str, Any],
    note: dict[str, Any],
    name: str = "consistency.json",
    older_name: str = "witnessed.note",
) -> None:
    """`name` proves the note's tree extends the older note's (`older_name`)."""
    proof = parse(read(bundle, name), name)
    if not isinstance(proof, dict) or sorted(proof) != CONSISTENCY_FIELDS:
        raise Failed(f"{name} is not a consistency proof")
    if (proof["first"], proof["second"]) != (older["size"], note["size"]):
        raise Failed(f"{name} is not between {older_name} and checkpoint.note")
    hashes = proof["hashes"] if isinstance(proof["hashes"], list) else [None]
    path = [b64(item, f"{name}'s hashes") for item in hashes]
    if not verify_consistency(older["size"], note["size"], older["root"], note["root"], path):
        raise Failed(f"{name}: checkpoint.note's tree does not extend {older_name}'s")


def check_timestamp(
    bundle: Path,
    log: dict[str, Any],
    log_key: dict[str, Any],
    note: dict[str, Any],
    tsa_ca: Path | None,
) -> list[str]:
    """`timestamp.tsr` is over the signed text of the note (or of the older timestamped
    note the note's tree extends); with `tsa_ca`, `openssl ts -verify` accepts it."""
    stamped = log["timestamped_size"]
    if stamped is None:
        return ["timestamp  none: no time-stamping authority timestamped a note of this chain"]
    name, stamped_note, extends = "checkpoint.note", note, ""
    if stamped != note["size"]:
        name = "timestamped.note"
        stamped_note = open_log_note(bundle, name, log_key)
        if (stamped_note["origin"], stamped_note["size"]) != (note["origin"], stamped):
            raise Failed("timestamped.note is not the timestamped head the manifest states")
        check_consistency(bundle, stamped_note, note, "timestamp-consistency.json", name)
        extends = f"; the note's tree extends it (consistency proof {stamped} to {note['size']})"
    reply = read(bundle, "timestamp.tsr")
    text = stamped_note["text"].encode()
    if _IMPRINT_PREFIX + hashlib.sha256(text).digest() not in reply:
        raise Failed(f"timestamp.tsr does not name the SHA-256 of {name}'s signed text")
    checked = "; its signature not checked: pass --tsa-ca with the TSA's CA certificate"
    if tsa_ca is not None:
        openssl_ts_verify(reply, text, tsa_ca)
        checked = f"; openssl ts -verify: OK under {tsa_ca.name}"
    return [f"timestamp  over {name}'s signed text (tree size {stamped}){extends}{checked}"]


def openssl_ts_verify(reply: bytes, text: bytes, tsa_ca: Path) -> None:
    """`openssl ts -verify -data` of the text, the reply and the TSA's CA."""
    if not tsa_ca.is_file():
        raise CannotCheck(f"no TSA CA certificate at {tsa_ca}")
    with tempfile.TemporaryDirectory() as scratch:
        data, tsr = Path(scratch, "signed.txt"), Path(scratch, "timestamp.tsr")
        data.write_bytes(text)
        tsr.write_bytes(reply)
        openssl = shutil.which("openssl")
        if openssl is None:
            raise CannotCheck("openssl is not on PATH, so the timestamp cannot be checked here")
        command = [openssl, "ts", "-verify", "-data", str(data), "-in", str(tsr)]
        command += ["-CAfile", str(tsa_ca)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode != 0:
        raise Failed("timestamp.tsr: openssl ts -verify does not accept it under the TSA's CA")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Verify a sessionstate evidence bundle.")
    parser.add_argument(
        "bundle",
        nargs="?",
        type=Path,
        default=Path(__file__).resolve().parent,
        help="the unpacked bundle's directory (default: the one this file is in)",
    )
    parser.add_argument(
        "--public-key", type=Path, help="the checkpoint key's PEM you pinned (else the bundle's)"
    )
    parser.add_argument(
        "--tsa-ca", type=Path, help="the time-stamping authority's CA certificate (PEM)"
    )
    args = parser.parse_args(argv)
    try:
        lines = verify(args.bundle, args.public_key, args.tsa_ca)
    except Failed as failure:
        print(f"FAILED: {failure}", file=sys.stderr)
        return 1
    except CannotCheck as reason:
        print(f"NOT CHECKED: {reason}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    print("VERIFIED (README.md says what this proves and what it does not)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
