"""The witnesses' cosignatures of a chain's checkpoint notes, kept beside the notes.

A C2SP tlog-witness answers a note it checked with a tlog-cosignature line
(`store.chain.cosignature`). Each verified line is kept under the chain in
`trace_meta`, `cosignature_key(chain, size, witness)`, beside the note of that size
(`store.chain.log_note.note_key`), and the size is remembered per witness
(`witnessed_key`): it is the `old` size the next submission's consistency proof
starts from. A line is trusted only when it verifies again on the note as read
(whoever can write the store cannot make a witness's key sign), so a line that does
not is left out, as is one of a witness no longer configured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from store.backends.contract import Lanes, LaneView
from store.chain.cosignature import verify_cosignature
from store.chain.keys import meta_newest_first
from store.chain.log_note import LogSigner, SignedTreeHead, stored_note
from store.chain.note import NoteError, VerifierKey, decode_note, parse_signature_lines
from store.key_codec import LaneKey, TenantResourceLane

_SIZE_BYTES = 8
_COSIGNATURE = b"cosig"
_WITNESSED = b"cosigned:"
SIZES_LOOKED_AT = 64  # the newest cosigned sizes a quorum is looked for among


def cosignature_key(chain: str, size: int, witness: VerifierKey) -> LaneKey:
    """Where the witness's cosignature line of the chain's note of `size` is kept."""
    name = _COSIGNATURE + size.to_bytes(_SIZE_BYTES, "big") + witness.key_id.to_bytes(4, "big")
    return LaneKey(TenantResourceLane.TRACE_META, chain, name=name)


def witnessed_key(chain: str, witness: VerifierKey) -> LaneKey:
    """Where the size the witness last cosigned of the chain is kept."""
    name = _WITNESSED + witness.key_id.to_bytes(4, "big")
    return LaneKey(TenantResourceLane.TRACE_META, chain, name=name)


def witnessed_size(view: LaneView, chain: str, witness: VerifierKey) -> int:
    """The size the witness last cosigned (0: none yet, or nothing remembered)."""
    stored = view.get(witnessed_key(chain, witness))
    return 0 if stored is None or len(stored) != _SIZE_BYTES else int.from_bytes(stored, "big")


def keep_cosignature(lanes: Lanes, chain: str, size: int, witness: VerifierKey, line: str) -> None:
    """Keep a verified cosignature line of the note of `size`, and that size as the
    witness's last (unsynced, as the notes are: a line lost in a crash is asked again)."""
    with lanes.batch(sync=False) as batch:
        batch.put(cosignature_key(chain, size, witness), line.encode())
        batch.put(witnessed_key(chain, witness), size.to_bytes(_SIZE_BYTES, "big"))


@dataclass(frozen=True)
class CosignedNote:
    """A kept note, the witnesses whose kept cosignature verifies on it, and the note with
    those lines appended as further signature lines (what is served)."""

    signed: SignedTreeHead
    cosigners: tuple[str, ...]
    note: bytes


def cosigned(
    view: LaneView, log: LogSigner, chain: str, size: int, witnesses: Sequence[VerifierKey]
) -> CosignedNote | None:
    """The kept note of `size` with the witnesses' kept cosignatures that verify on it."""
    signed = stored_note(view, log, chain, size)
    if signed is None:
        return None
    return with_cosignatures(view, chain, signed, witnesses)


def with_cosignatures(
    view: LaneView, chain: str, signed: SignedTreeHead, witnesses: Sequence[VerifierKey]
) -> CosignedNote:
    """`signed` with the witnesses' kept cosignatures that verify on it."""
    text = signed.head.text()
    names, lines = [], []
    for witness in witnesses:
        stored = view.get(cosignature_key(chain, signed.head.size, witness))
        if stored is None:
            continue
        try:
            (line,) = parse_signature_lines(decode_note(stored))
            lines.append(verify_cosignature(line, text, witness).line)
        except (NoteError, ValueError):
            continue  # not the witness's word on this note: left out
        names.append(witness.name)
    return CosignedNote(signed, tuple(names), signed.note + "".join(lines).encode())


def cosigned_sizes(view: LaneView, chain: str) -> list[int]:
    """The sizes some witness's cosignature is kept for, newest first (at most
    SIZES_LOOKED_AT keys read)."""
    kept = meta_newest_first(view, chain, _COSIGNATURE, 12)
    sizes: list[int] = []
    for count, (key, _) in enumerate(kept):
        if count >= SIZES_LOOKED_AT:
            break
        size = int.from_bytes(key.name[len(_COSIGNATURE) :][:_SIZE_BYTES], "big")
        if not sizes or sizes[-1] != size:
            sizes.append(size)
    return sizes


def newest_cosigned(
    view: LaneView,
    log: LogSigner,
    chain: str,
    witnesses: Sequence[VerifierKey],
    quorum: int = 1,
) -> CosignedNote | None:
    """The newest kept note at least `quorum` of the witnesses' cosignatures verify on."""
    for size in cosigned_sizes(view, chain):
        found = cosigned(view, log, chain, size, witnesses)
        if found is not None and len(found.cosigners) >= quorum:
            return found
    return None


def served_note(
    view: LaneView,
    log: LogSigner,
    chain: str,
    newest: SignedTreeHead,
    witnesses: Sequence[VerifierKey],
    quorum: int,
) -> CosignedNote:
    """What the checkpoint route serves: the newest kept note that `quorum` of the
    witnesses' cosignatures verify on, with them; while none has, `newest` (the latest
    note) with the cosignatures it has so far."""
    found = newest_cosigned(view, log, chain, witnesses, quorum)
    return found if found is not None else with_cosignatures(view, chain, newest, witnesses)
