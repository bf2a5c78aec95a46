"""The RFC 3161 timestamps of a chain's checkpoint notes, kept beside the notes.

A time-stamping authority's `TimeStampResp` (DER, as it answered) over a note's signed
text (`TreeHead.text()`: the origin, size and root lines the log key signs, without
signature lines), hashed with SHA-256, is kept under the chain in `trace_meta`,
`timestamp_key(chain, size)`, beside the note of that size
(`store.chain.log_note.note_key`). A kept reply is trusted only when it still covers
the note as read (`covered`: it parses, its status is granted, its message imprint is
the SHA-256 of that text), so a reply over another note of the same size (a rewritten
log) is not served. The signature is the reviewer's to check (`openssl ts -verify`);
the service checks it before keeping when `SESSIONSTATE_TSA_CA_FILE` is set.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from cryptography import x509
from rfc3161_client import PKIStatus, TimeStampResponse, decode_timestamp_response

from store.backends.contract import Lanes, LaneView
from store.chain.keys import meta_newest_first
from store.chain.log_note import LogSigner, SignedTreeHead
from store.chain.note import VerifierKey
from store.chain.witness_store import SIZES_LOOKED_AT, CosignedNote, cosigned
from store.key_codec import LaneKey, TenantResourceLane

SHA256 = x509.ObjectIdentifier("2.16.840.1.101.3.4.2.1")
_SIZE_BYTES = 8
_TIMESTAMP = b"tsr"


class TimestampRejected(Exception):
    """A reply that does not timestamp the text: `why` names the check that failed."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def timestamp_key(chain: str, size: int) -> LaneKey:
    """Where the timestamp of the chain's note of tree size `size` is kept."""
    name = _TIMESTAMP + size.to_bytes(_SIZE_BYTES, "big")
    return LaneKey(TenantResourceLane.TRACE_META, chain, name=name)


def covered(reply: bytes, text: bytes) -> TimeStampResponse:
    """The parsed reply, when it grants a timestamp over SHA-256(`text`); else
    `TimestampRejected` (reply_unreadable, not_granted or imprint_mismatch)."""
    try:
        parsed = decode_timestamp_response(reply)
        status = parsed.status
        imprint = parsed.tst_info.message_imprint if status == PKIStatus.GRANTED else None
    except ValueError:
        raise TimestampRejected("reply_unreadable") from None
    if imprint is None:
        raise TimestampRejected("not_granted")
    if imprint.hash_algorithm != SHA256 or imprint.message != hashlib.sha256(text).digest():
        raise TimestampRejected("imprint_mismatch")
    return parsed


def keep_timestamp(lanes: Lanes, chain: str, size: int, reply: bytes) -> None:
    """Keep a checked reply for the note of `size` (unsynced, as the notes are: a reply lost
    in a crash is asked for again while that note is the newest)."""
    with lanes.batch(sync=False) as batch:
        batch.put(timestamp_key(chain, size), reply)


def timestamp_of(view: LaneView, chain: str, signed: SignedTreeHead) -> bytes | None:
    """The kept reply of the note's size, if it covers that note's signed text."""
    reply = view.get(timestamp_key(chain, signed.head.size))
    if reply is None:
        return None
    try:
        covered(reply, signed.head.text().encode())
    except TimestampRejected:
        return None
    return reply


def timestamped_sizes(view: LaneView, chain: str) -> list[int]:
    """The sizes a timestamp is kept for, newest first (at most SIZES_LOOKED_AT)."""
    kept = meta_newest_first(view, chain, _TIMESTAMP, _SIZE_BYTES)
    sizes: list[int] = []
    for key, _ in kept:
        if len(sizes) >= SIZES_LOOKED_AT:
            break
        sizes.append(int.from_bytes(key.name[len(_TIMESTAMP) :], "big"))
    return sizes


def newest_timestamped(
    view: LaneView, log: LogSigner, chain: str, witnesses: Sequence[VerifierKey], quorum: int
) -> CosignedNote | None:
    """The newest kept note with a timestamp that covers it and at least `quorum` of the
    witnesses' cosignatures (0 without witnesses), with them."""
    for size in timestamped_sizes(view, chain):
        found = cosigned(view, log, chain, size, witnesses)
        if found is None or len(found.cosigners) < quorum:
            continue
        if timestamp_of(view, chain, found.signed) is not None:
            return found
    return None
