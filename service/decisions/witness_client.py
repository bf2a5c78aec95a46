"""One C2SP tlog-witness submission (https://c2sp.org/tlog-witness): POST /add-checkpoint.

The body is `old <size>`, the consistency proof from that size to the note's, one
base64 hash a line, an empty line, then the signed note. The witness answers 200
with its cosignature lines, 409 `text/x.tlog.size` with the size it last signed
when `old` is not that size, 422 when the proof does not hold, 403 for a log or
key it does not know, 400 for input it cannot read. What the answer means is
`Answer`: the body is read only for a 200 (its lines) and a 409 (a size), and
never logged. Short timeouts: a submission runs on the background job, never on a
request, and a witness that does not answer in time is unreachable this round.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from store.chain.cosignature import parse_cosignature_lines
from store.chain.note import NoteError, NoteSignature

SIZE_MEDIA_TYPE = "text/x.tlog.size"
TIMEOUT = httpx.Timeout(5.0, connect=2.0)
_SIZE_RE = re.compile(rb"(0|[1-9][0-9]{0,18})\n")
_MAX_ANSWER_BYTES = 64 * 1024


@dataclass(frozen=True)
class Cosigned:
    """200: the signature lines the witness answered (not verified yet)."""

    lines: tuple[NoteSignature, ...]


@dataclass(frozen=True)
class Conflict:
    """409: the size the witness last signed of this log."""

    size: int


@dataclass(frozen=True)
class Refused:
    """Any other 4xx, or a 200 or 409 whose body does not read: the witness says no."""

    status: int


@dataclass(frozen=True)
class Unreachable:
    """No answer (connection, timeout) or a 5xx: the witness could not be asked."""

    error_type: str


Answer = Cosigned | Conflict | Refused | Unreachable


def submission(old: int, proof: Sequence[bytes], note: bytes) -> bytes:
    """The add-checkpoint body."""
    lines = [f"old {old}", *(base64.b64encode(hash_).decode() for hash_ in proof)]
    return "".join(line + "\n" for line in lines).encode() + b"\n" + note


def add_checkpoint(
    client: httpx.Client, url: str, old: int, proof: Sequence[bytes], note: bytes
) -> Answer:
    """Submit the note to the witness at `url` (its add-checkpoint URL)."""
    try:
        response = client.post(url, content=submission(old, proof, note), timeout=TIMEOUT)
    except httpx.HTTPError as error:
        return Unreachable(type(error).__name__)
    status = response.status_code
    if status >= 500:
        return Unreachable(f"http_{status}")
    body = response.content[:_MAX_ANSWER_BYTES]
    if status == 200:
        try:
            return Cosigned(parse_cosignature_lines(body))
        except NoteError:
            return Refused(status)
    media_type = response.headers.get("content-type", "").split(";")[0].strip()
    if status == 409 and media_type == SIZE_MEDIA_TYPE and (size := _SIZE_RE.fullmatch(body)):
        return Conflict(int(size.group(1)))
    return Refused(status)
