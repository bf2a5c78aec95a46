"""An evidence entry's format: the chain's members of it, its sealing, and reading it back.

An entry is a JSON object: the body a writer gives (it must carry `recorded_at`,
an RFC 3339 UTC timestamp) plus the chain's own members, `seq`, `prev_hash` (the
previous entry's `hash`) and `hash`, the canonical digest (`store.canonical`) of
the entry without `hash`. `seal` chains bodies on after a head without touching
the store; `parse_entry` reads stored bytes back as strict JSON, and never
repeats them in an error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from store.canonical import (
    Encoded,
    canonical_digest,
    canonical_json,
    canonical_object,
    encode,
    sha256_digest,
)
from store.chain.head import NO_TENANT_CHAIN, ChainHead, parse_timestamp
from store.chain.keys import entry_key
from store.key_codec import LaneKey
from store.strict_json import MalformedJson, strict_loads

CHAIN_FIELDS = ("seq", "prev_hash", "hash")


class ChainCorrupt(Exception):
    """The chain cannot be extended or pruned: its newest entry or its anchor does not read
    (for pruning: or its anchor's signature does not hold)."""


class SealedEntry(NamedTuple):
    """One entry ready to write: its key, its canonical bytes, and the entry those bytes hold."""

    key: LaneKey
    value: bytes
    entry: dict[str, Any]

    @property
    def seq(self) -> int:
        return int.from_bytes(self.key.name, "big")


def seal(
    bodies: Sequence[Mapping[str, Any]],
    head: ChainHead,
    chain: str = NO_TENANT_CHAIN,
    *,
    encoded_members: Sequence[Mapping[str, Encoded]] = (),
) -> tuple[list[SealedEntry], ChainHead]:
    """Chain bodies on after head, in order; pure. Raises ValueError for a body it cannot seal.

    `encoded_members[i]`, when given, holds members of `bodies[i]` already encoded
    (`Encoded.of` of the very value the body holds), which are not encoded again."""
    sealed: list[SealedEntry] = []
    for index, body in enumerate(bodies):
        _check_body(index, body)
        entry = {**body, "seq": head.seq + 1, "prev_hash": head.hash}
        given = encoded_members[index] if index < len(encoded_members) else {}
        try:
            # Each member encoded once: the hash covers the object without `hash`, the stored
            # bytes are the same members with it.
            if all(type(name) is str and name.isascii() for name in entry):
                encoded = {
                    name: (given[name].data, given[name].plain) if name in given else encode(value)
                    for name, value in entry.items()
                }
                members = {name: data for name, (data, _) in encoded.items()}
                entry["hash"] = sha256_digest(canonical_object(members))
                members["hash"] = canonical_json(entry["hash"])
                value = canonical_object(members)
            else:  # names that sort otherwise by UTF-16 code unit: the whole object at once
                encoded = {"": (b"", False)}
                entry["hash"] = canonical_digest(entry)
                value = canonical_json(entry)
        except Exception as error:  # rfc8785's message may quote the value
            raise ValueError(
                f"body {index} is not canonical JSON ({type(error).__name__})"
            ) from None
        # Hand back what a read returns (lists for tuples, canonical numbers), not the input,
        # and only if it verifies: 2.0**60 is written as an int too large to canonicalise.
        # A plain entry reads back equal by construction (store.canonical.encode).
        if all(plain for _, plain in encoded.values()):
            stored = json.loads(value)
        else:
            stored = parse_entry(value)
            if stored is None or entry_hash(stored) != entry["hash"]:
                raise ValueError(
                    f"body {index} does not read back as written (a float beyond 2**53?)"
                )
        sealed.append(SealedEntry(entry_key(head.seq + 1, chain), value, stored))
        head = ChainHead(seq=head.seq + 1, hash=entry["hash"])
    return sealed, head


def _check_body(index: int, body: Mapping[str, Any]) -> None:
    if not isinstance(body, Mapping):
        raise ValueError(f"body {index} is not a mapping")
    taken = [name for name in CHAIN_FIELDS if name in body]
    if taken:
        raise ValueError(f"body {index} sets {', '.join(taken)}: only the chain sets those")
    if parse_timestamp(body.get("recorded_at")) is None:
        raise ValueError(f"body {index} needs recorded_at, an RFC 3339 UTC timestamp ending in Z")


def parse_entry(stored: bytes) -> dict[str, Any] | None:
    """The JSON object stored bytes hold; None if they are not strict JSON of one
    (`store.strict_json`: UTF-8, no duplicate member names, which mean different things to
    different parsers, and no NaN or Infinity)."""
    try:
        value = strict_loads(stored)
    except MalformedJson:  # never re-raised: the bytes are not evidence
        return None
    return value if isinstance(value, dict) else None


def entry_hash(entry: Mapping[str, Any]) -> str | None:
    """What entry's `hash` must be; None when its content cannot be canonicalised."""
    try:
        return canonical_digest({name: value for name, value in entry.items() if name != "hash"})
    except Exception:  # never re-raised: the message may quote the content
        return None


def holds(entry: Mapping[str, Any] | None, seq: int) -> bool:
    """Whether entry is entry seq and hashes to its `hash`."""
    return entry is not None and entry.get("seq") == seq and entry.get("hash") == entry_hash(entry)
