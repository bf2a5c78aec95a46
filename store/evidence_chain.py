"""`EvidenceChain`: an append-only, tamper-evident hash chain in the `trace_evidence` lane.

There is one chain per tenant: its entries, its anchor and its marker are keys
whose tenant component is the chain's name (the tenant id), so on PostgreSQL a
chain lives under its tenant's `tenant_id`. Entries that name no tenant go on
the chain `NO_TENANT_CHAIN`, a name no scope id can be; what the deployment
records of itself (policy activations) goes on `SYSTEM_CHAIN`. The name `""`
(`LEGACY_CHAIN`) addresses the one global chain older versions wrote, which
`sessionstate db upgrade` migrates (`store.chain_migration`).

A compliance reviewer must be able to tell that no recorded entry was edited,
removed, inserted or reordered after the fact. So every entry carries its `seq`,
the previous entry's `hash`, and its own `hash` (the canonical digest of the
entry without `hash`): changing any entry breaks it or the link to it. Cutting
the newest entries leaves a shorter chain that still links; only a checkpoint
signed earlier (`store.checkpoints`) shows that.

The chain does not know what an entry means. Retention deletes the oldest
entries and, in the same batch, keeps an anchor (the last deleted entry's seq
and hash) in the `trace_meta` lane, so what remains is still provable. The
anchor is signed with the checkpoint key (`store.checkpoints.RetentionAnchor`,
naming its chain), and every verify checks that signature with the verifier
it is given: whoever can write the store but not read the key cannot delete
the oldest entries and pass the rest off as retention's. Anchors older
releases wrote unsigned fail verify (`anchor_unsigned`) until `sessionstate
db upgrade` signs them (`sign_unsigned_anchor`); the legacy global chain's
anchor predates signing, and is read as it is only to migrate it.

Reads fail closed and never repeat stored bytes: a problem is a label from a
fixed vocabulary and a seq, and an exception carries a fixed message.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from store.backends.contract import Lanes
from store.canonical import (
    Encoded,
    canonical_digest,
    canonical_json,
    canonical_object,
    encode,
    sha256_digest,
)
from store.chain_head import (
    CHAIN_NAME_PATTERN,
    GENESIS,
    HASH_PATTERN,
    NO_TENANT_CHAIN,
    SYSTEM_CHAIN,
    ChainHead,
    parse_timestamp,
)
from store.chain_loss import LOSS_MEMBER, RecordedLoss, indexed_seqs, loss_of, losses_index_key
from store.checkpoints import (
    Checkpoint,
    CheckpointSigner,
    CheckpointVerifier,
    RetentionAnchor,
)
from store.keys import LaneKey, TenantResourceLane

__all__ = ["NO_TENANT_CHAIN", "ChainHead", "EvidenceChain", "entry_key", "seal"]

CHAIN_FIELDS = ("seq", "prev_hash", "hash")
LEGACY_CHAIN = ""  # the single global chain of versions before per-tenant chains
_CHAIN_NAME_RE = re.compile(CHAIN_NAME_PATTERN)

_HASH_RE = re.compile(HASH_PATTERN)
_SEQ_BYTES = 8
_LAST_SEQ = (1 << (8 * _SEQ_BYTES)) - 1
_VERIFY_ATTEMPTS = 3

ChainProblem = Literal[
    "entry_unreadable",
    "seq_gap",
    "seq_mismatch",
    "prev_hash_mismatch",
    "hash_mismatch",
    "truncated_before_checkpoint",
    "checkpoint_mismatch",
    "checkpoint_signature_invalid",
    "anchor_invalid",
    "anchor_unsigned",
    "anchor_signature_invalid",
    "checkpoint_before_anchor",
    "checkpoint_other_chain",
    "checkpoint_in_recorded_loss",
    "loss_invalid",
]
_Failure = tuple[int | None, ChainProblem]  # the first invalid seq (None: not an entry's fault)
# A stored anchor as read: signed, or a bare head (genesis when none is stored, else an
# unsigned one older releases wrote).
_Anchor = RetentionAnchor | ChainHead


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


class ChainVerification(BaseModel):
    """The outcome of walking the chain: ok, or the first problem and the seq it is at."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    entries: int = Field(ge=0, description="entries that verified before any problem")
    head_hash: str = Field(description="hash of the last entry that verified (else the anchor's)")
    head_seq: int = Field(default=0, ge=0, description="seq of that entry (else the anchor's)")
    first_invalid_seq: int | None = None
    problem: ChainProblem | None = None
    walked_from_seq: int | None = Field(
        default=None,
        description="the first entry this walk read (the anchor's next, or the verified head it "
        "resumed from); null: it read none (the chain holds no entry)",
    )
    walked_to_seq: int | None = Field(
        default=None,
        description="the last entry this walk read (the head, or where it stopped); null: none",
    )
    anchor: RetentionAnchor | None = Field(
        default=None,
        description="the signed retention anchor the walk started from, its signature checked "
        "(its `origin` says what it vouches for); null: the chain starts at genesis, or the "
        "anchor did not verify",
    )
    recorded_losses: tuple[RecordedLoss, ...] = Field(
        default=(),
        description="the recorded losses walked over (`sessionstate decisions record-loss`): "
        "each a gap the chain accepts because an entry of its own says what is gone",
    )

    @property
    def seqs_lost(self) -> int:
        """How many seqs the recorded losses walked over left unused (the gaps they cover)."""
        return sum(loss.unused_seqs for loss in self.recorded_losses)


def chain_name(tenant_id: str | None) -> str:
    """The chain a decision about tenant_id goes on: the tenant's, else `NO_TENANT_CHAIN`."""
    return tenant_id or NO_TENANT_CHAIN


def is_chain_name(name: str) -> bool:
    """Whether name can be a (current) chain: a scope id or `NO_TENANT_CHAIN`."""
    return _CHAIN_NAME_RE.fullmatch(name) is not None


def entry_key(seq: int, chain: str = NO_TENANT_CHAIN) -> LaneKey:
    """The key of entry seq of a chain: 8 bytes big-endian, so key order is seq order."""
    return LaneKey(TenantResourceLane.TRACE_EVIDENCE, chain, name=seq.to_bytes(_SEQ_BYTES, "big"))


def anchor_key(chain: str) -> LaneKey:
    """Where retention keeps the chain's start (the last pruned entry's seq and hash)."""
    return LaneKey(TenantResourceLane.TRACE_META, chain, name=b"anchor")


ANCHOR_KEY = anchor_key(NO_TENANT_CHAIN)  # the no-tenant chain's anchor


def marker_key(chain: str) -> LaneKey:
    """Says the chain exists; written with its first entry, so chains can be listed."""
    return LaneKey(TenantResourceLane.TRACE_META, chain, name=b"chain")


def chain_names(lanes: Lanes) -> list[str]:
    """Every chain with a marker, in key order (the legacy chain is never listed)."""
    return [
        key.tenant
        for key, _ in lanes.scan(TenantResourceLane.TRACE_META)
        if key.name == b"chain" and key.tenant != LEGACY_CHAIN
    ]


def tenant_chain_names(lanes: Lanes) -> list[str]:
    """Every chain of decisions (each tenant's, and the no-tenant one): all but the
    deployment's own, `SYSTEM_CHAIN` (its policy activations)."""
    return [name for name in chain_names(lanes) if name != SYSTEM_CHAIN]


def legacy_chain_present(lanes: Lanes) -> bool:
    """Whether the data holds the single global chain of older versions (not migrated yet)."""
    if next(iter(lanes.scan(TenantResourceLane.TRACE_EVIDENCE, LEGACY_CHAIN)), None) is not None:
        return True
    return lanes.get(anchor_key(LEGACY_CHAIN)) is not None


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
            if stored is None or _entry_hash(stored) != entry["hash"]:
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
    """The JSON object stored bytes hold; None if they are not UTF-8 JSON of one, unambiguous."""
    try:
        value = json.loads(
            stored.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant
        )
    except Exception:  # never re-raised: the message may quote the bytes
        return None
    return value if isinstance(value, dict) else None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Duplicate keys mean different things to different parsers: not evidence.
    value = dict(pairs)
    if len(value) != len(pairs):
        raise ValueError("duplicate key")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError("NaN and Infinity are not JSON")


def _entry_hash(entry: Mapping[str, Any]) -> str | None:
    """What entry's `hash` must be; None when its content cannot be canonicalised."""
    try:
        return canonical_digest({name: value for name, value in entry.items() if name != "hash"})
    except Exception:  # never re-raised: the message may quote the content
        return None


def _holds(entry: Mapping[str, Any] | None, seq: int) -> bool:
    """Whether entry is entry seq and hashes to its `hash`."""
    return entry is not None and entry.get("seq") == seq and entry.get("hash") == _entry_hash(entry)


def _link_problem(entry: Mapping[str, Any], seq: int, prev_hash: str) -> ChainProblem | None:
    stored_seq = entry.get("seq")
    if not isinstance(stored_seq, int) or isinstance(stored_seq, bool) or stored_seq != seq:
        return "seq_mismatch"
    if entry.get("prev_hash") != prev_hash:
        return "prev_hash_mismatch"
    claimed = entry.get("hash")
    if not isinstance(claimed, str) or claimed != _entry_hash(entry):
        return "hash_mismatch"
    return None


@dataclass
class _Walk:
    """A walk from the anchor: the seq expected next and the hash it must link to."""

    anchor: ChainHead
    checkpoint: Checkpoint | None = None
    expected: int = field(init=False)
    prev_hash: str = field(init=False)
    verified: int = 0
    walked_from: int | None = None  # the first entry read (preset: a resumed walk's head)
    walked_to: int | None = None
    signed_anchor: RetentionAnchor | None = None  # the anchor's document, once it verified
    losses: list[RecordedLoss] = field(default_factory=list)
    chain: str = LEGACY_CHAIN  # whose walk it is, and the key of its signed heads
    keys: CheckpointVerifier | None = None

    def __post_init__(self) -> None:
        self.expected = self.anchor.seq + 1
        self.prev_hash = self.anchor.hash

    def step(self, seq: int | None, stored: bytes) -> _Failure | None:
        """Check the next stored key; the (seq, problem) it shows, or None when it verifies."""
        if seq is None:
            return self.expected, "entry_unreadable"
        self.walked_from = seq if self.walked_from is None else self.walked_from
        self.walked_to = seq
        if seq < self.expected:  # an entry retention removed is back, or the anchor moved
            return seq, "anchor_invalid"
        entry = parse_entry(stored)
        crosses = seq > self.expected
        if crosses:
            failure = self._cross_gap(seq, entry)
            if failure is not None:
                return failure
        if entry is None:
            return seq, "entry_unreadable"
        problem = _link_problem(entry, seq, self.prev_hash)
        if problem is None and self._contradicts_checkpoint(seq, entry["hash"]):
            problem = "checkpoint_mismatch"
        if problem is None and LOSS_MEMBER in entry:
            problem = self._note_loss(seq, entry, crossed=crosses)
        if problem is not None:
            return seq, problem
        self.expected, self.prev_hash, self.verified = seq + 1, entry["hash"], self.verified + 1
        return None

    def _cross_gap(self, seq: int, entry: dict[str, Any] | None) -> _Failure | None:
        """Go over the seqs before seq only when entry records them as lost: it follows the
        last entry walked and takes the seq after the signed head it names (its link to that
        head's hash is then checked as any link is). Any other gap is `seq_gap`."""
        loss = None if entry is None else loss_of(entry)
        walked = ChainHead(seq=self.expected - 1, hash=self.prev_hash)
        if loss is None or not loss.gap or loss.seq != seq or loss.follows != walked:
            return self.expected, "seq_gap"
        if self.keys is None or not self.keys.verify_of(loss.signed_head, self.chain):
            return seq, "loss_invalid"  # a head the key never signed (or no key to tell)
        signed = loss.links_to
        checkpoint = self.checkpoint
        if checkpoint is not None and self.expected <= checkpoint.seq < seq:
            # A checkpoint of a lost seq can no longer be checked; the signed head can.
            if checkpoint.seq != signed.seq:
                return checkpoint.seq, "checkpoint_in_recorded_loss"
            if checkpoint.head_hash != signed.hash:
                return checkpoint.seq, "checkpoint_mismatch"
        self.expected, self.prev_hash = seq, signed.hash
        return None

    def _note_loss(self, seq: int, entry: dict[str, Any], *, crossed: bool) -> ChainProblem | None:
        """A loss entry that linked: it must say what it links to (`loss_invalid` if not).
        A walk that began at the signed head it names (resumed from a head that is lost) did
        not cross its gap, and counted the lost seqs as verified: they are taken off."""
        loss = loss_of(entry)
        if loss is None or loss.seq != seq or loss.links_to.hash != self.prev_hash:
            return "loss_invalid"
        if self.keys is None or not self.keys.verify_of(loss.signed_head, self.chain):
            return "loss_invalid"  # a head the key never signed (or no key to tell)
        recorded = RecordedLoss.at(seq, loss)
        self.losses.append(recorded)
        if not crossed:
            self.verified -= recorded.unused_seqs
        return None

    def over(self, stored: Iterator[tuple[int | None, bytes]]) -> ChainVerification:
        """Step through stored entries to the first problem, or to the end."""
        try:
            for seq, value in stored:
                failure = self.step(seq, value)
                if failure is not None:
                    return self.outcome(failure)
        except ChainCorrupt:
            return self.outcome((self.expected, "entry_unreadable"))
        return self.outcome(self.finish())

    def finish(self) -> _Failure | None:
        """After the last key: a checkpoint beyond it means the tail was cut."""
        if self.checkpoint is not None and self.checkpoint.seq >= self.expected:
            return self.expected, "truncated_before_checkpoint"
        return None

    def _contradicts_checkpoint(self, seq: int, hash_: str) -> bool:
        return (
            self.checkpoint is not None
            and self.checkpoint.seq == seq
            and self.checkpoint.head_hash != hash_
        )

    def outcome(self, failure: _Failure | None) -> ChainVerification:
        seq, problem = failure if failure is not None else (None, None)
        return ChainVerification(
            ok=failure is None,
            entries=self.verified,
            head_hash=self.prev_hash,
            head_seq=self.expected - 1,
            first_invalid_seq=seq,
            problem=problem,
            walked_from_seq=self.walked_from,
            walked_to_seq=self.walked_to if self.walked_to is not None else self.walked_from,
            anchor=self.signed_anchor,
            recorded_losses=tuple(self.losses),
        )


def _start(anchor: _Anchor) -> ChainHead:
    return anchor.head if isinstance(anchor, RetentionAnchor) else anchor


_LOCKS: weakref.WeakKeyDictionary[Lanes, threading.Lock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def _write_lock(lanes: Lanes) -> threading.Lock:
    """One lock per database, so two `EvidenceChain`s over it cannot fork the chain."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(lanes, threading.Lock())


class EvidenceChain:
    """The evidence chain over a lane store: append, read, verify, prune."""

    def __init__(self, lanes: Lanes, name: str = NO_TENANT_CHAIN) -> None:
        self._lanes = lanes
        self.name = name
        self._lock = _write_lock(lanes)

    @property
    def lanes(self) -> Lanes:
        """The store the chain is kept in."""
        return self._lanes

    def head(self) -> ChainHead:
        """The newest entry's seq and hash, else the anchor, else genesis; read from the store.

        Checks the newest entry's shape only (`verify` checks integrity), and raises
        `ChainCorrupt` rather than extend a chain whose end it cannot read.
        """
        newest = next(self._stored(reverse=True), None)
        if newest is None:
            return self.anchor()
        seq, stored = newest
        entry = None if seq is None else parse_entry(stored)
        if seq is None or entry is None or entry.get("seq") != seq:
            raise ChainCorrupt("the newest evidence entry does not read")
        hash_ = entry.get("hash")
        if not isinstance(hash_, str) or _HASH_RE.fullmatch(hash_) is None:
            raise ChainCorrupt("the newest evidence entry does not read")
        return ChainHead(seq=seq, hash=hash_)

    def anchor(self) -> ChainHead:
        """Where retention left the chain's start; genesis if nothing was pruned. Its
        signature is not checked here (`verify` does)."""
        anchor = self._read_anchor()
        if anchor is None:
            raise ChainCorrupt("the retention anchor does not read")
        return _start(anchor)

    def append(self, bodies: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Seal bodies after the stored head and write them in one synced batch.

        Serialised per database. A caller that caches the head and writes `seal`ed
        entries in batches of its own must serialise those writes itself.
        """
        if not bodies:
            return []
        with self._lock:
            head = self.head()
            sealed, _ = seal(bodies, head, self.name)
            with self._lanes.batch(sync=True) as batch:
                batch.expect(entry_key(head.seq + 1, self.name), None)
                if head.seq == 0:
                    batch.put(marker_key(self.name), b"")
                for item in sealed:
                    batch.put(item.key, item.value)
        return [item.entry for item in sealed]

    def get(self, seq: int) -> dict[str, Any] | None:
        """Entry seq as stored; None when missing or unreadable (`verify` says which)."""
        if not 0 < seq < 1 << (8 * _SEQ_BYTES):
            return None
        stored = self._lanes.get(entry_key(seq, self.name))
        return None if stored is None else parse_entry(stored)

    def scan(self, *, after_seq: int = 0, reverse: bool = False) -> Iterator[dict[str, Any]]:
        """Readable entries with seq > after_seq, oldest first (newest first when reverse).

        Seeks to after_seq + 1: the entries before it are not read."""
        for seq, stored in self._stored(reverse=reverse, first=after_seq + 1):
            if seq is None:
                continue
            entry = parse_entry(stored)
            if entry is not None:
                yield entry

    def stored_entries(
        self, *, until_seq: int, after_seq: int = 0, reverse: bool = False
    ) -> Iterator[tuple[int, bytes]]:
        """(seq, bytes exactly as stored) of each entry after after_seq up to until_seq, oldest
        first (newest first when reverse). Seeks to the first: a deep page costs what a first
        one does.

        For evidence that is re-hashed elsewhere; `verify` says whether the bytes hold.
        """
        if until_seq <= after_seq:
            return
        for seq, stored in self._stored(reverse=reverse, first=after_seq + 1, last=until_seq):
            if seq is not None:
                yield seq, stored

    def links(self, seq: int, entry: Mapping[str, Any]) -> bool:
        """Whether `entry`, read at seq, holds where it is: its `seq` is seq, its `hash` is its
        content's digest, and its `prev_hash` is the stored `hash` of entry seq - 1 (of the
        anchor, or genesis, for the first entry after it). The rest of the chain is not read:
        `verify` walks it. A prune that moves the anchor meanwhile is looked at again."""
        for _ in range(_VERIFY_ATTEMPTS):
            anchor = self._read_anchor()
            holds = anchor is not None and self._links_after(_start(anchor), seq, entry)
            if holds or self._read_anchor() == anchor:
                break
        return holds

    def _links_after(self, anchor: ChainHead, seq: int, entry: Mapping[str, Any]) -> bool:
        if seq <= anchor.seq:  # an entry retention removed, or the anchor moved past it
            return False
        previous = {"hash": anchor.hash} if seq == anchor.seq + 1 else self.get(seq - 1)
        prev_hash = None if previous is None else previous.get("hash")
        return isinstance(prev_hash, str) and _link_problem(entry, seq, prev_hash) is None

    def verify(
        self, checkpoint: Checkpoint | None = None, verifier: CheckpointVerifier | None = None
    ) -> ChainVerification:
        """Walk the chain from the anchor and report the first problem; never raises on bad bytes.

        Each stored key must be the next seq (else `seq_gap` at the missing one), hold a
        JSON object (`entry_unreadable`) whose `seq` is its key's (`seq_mismatch`), whose
        `prev_hash` is the previous entry's `hash` (`prev_hash_mismatch`) and whose `hash`
        is its canonical digest (`hash_mismatch`). A stored anchor that does not read, or
        an entry at or below it, is `anchor_invalid`. The one gap accepted is a recorded
        loss (`store.chain_loss`): an entry after the gap that follows the last entry
        walked and links to the signed head it names, a head `verifier`'s key signed for
        this chain; it is reported in `recorded_losses`, and a loss entry that does not say
        what it links to, or names a head the key did not sign, is `loss_invalid`.

        A stored anchor needs the verifier of the checkpoint key too: one older releases
        wrote unsigned is `anchor_unsigned`, one whose signature does not hold under the
        verifier (or with no verifier, or naming another chain) `anchor_signature_invalid`,
        before the chain is read.

        A checkpoint needs the verifier of its key, and one whose signature does not
        verify is refused before the chain is read (`checkpoint_signature_invalid`).
        The chain must then reach the checkpoint's seq (else `truncated_before_checkpoint`
        at the first missing seq) with the same hash there, or at the anchor when the
        checkpoint is at the anchor's seq (`checkpoint_mismatch`). A checkpoint below the
        anchor fails (`checkpoint_before_anchor`): retention removed the evidence it
        could be checked against, so it proves nothing, and a reviewer must hear that; so
        does one of a seq a recorded loss says is gone (`checkpoint_in_recorded_loss`).

        Runs without the write lock, so appends go on meanwhile. A LevelDB iterator reads
        a snapshot, but the anchor is read apart from it: a walk that fails while a prune
        moved the anchor is walked again.
        """
        if checkpoint is not None and verifier is None:
            raise ValueError("a checkpoint is checked only with its key's verifier")
        for _ in range(_VERIFY_ATTEMPTS):
            anchor = self._read_anchor()
            outcome = self._verify_from(anchor, checkpoint, verifier, verifier)
            if outcome.ok or self._read_anchor() == anchor:
                break
        return outcome

    def _verify_from(
        self,
        anchor: _Anchor | None,
        checkpoint: Checkpoint | None,
        verifier: CheckpointVerifier | None,
        anchors: CheckpointVerifier | None,
    ) -> ChainVerification:
        """The walk from anchor; `verifier` checks the checkpoint's signature (None: the caller
        did), `anchors` the anchor's."""
        if anchor is None:
            return _Walk(GENESIS).outcome((None, "anchor_invalid"))
        walk = _Walk(_start(anchor), checkpoint, chain=self.name, keys=anchors)
        if checkpoint is not None and verifier is not None and not verifier.verify(checkpoint):
            return walk.outcome((None, "checkpoint_signature_invalid"))
        problem = self._anchor_problem(anchor, anchors)
        if problem is not None:
            return walk.outcome((None, problem))
        walk.signed_anchor = anchor if isinstance(anchor, RetentionAnchor) else None
        if checkpoint is not None:
            start = walk.anchor
            if (checkpoint.tenant_id or LEGACY_CHAIN) != self.name:
                return walk.outcome((None, "checkpoint_other_chain"))
            if checkpoint.seq == start.seq and checkpoint.head_hash != start.hash:
                return walk.outcome((start.seq, "checkpoint_mismatch"))
            if checkpoint.seq < start.seq:
                return walk.outcome((None, "checkpoint_before_anchor"))
        return walk.over(self._stored())

    def _anchor_problem(
        self, anchor: _Anchor, verifier: CheckpointVerifier | None
    ) -> ChainProblem | None:
        """Why the stored anchor is not one to walk from: unsigned, or not signed by the key
        for this chain; None for a signed one that holds, genesis, or the legacy chain's."""
        if isinstance(anchor, RetentionAnchor):
            holds = verifier is not None and verifier.verify_anchor(anchor, self.name)
            return None if holds else "anchor_signature_invalid"
        if anchor.seq == 0 or self.name == LEGACY_CHAIN:  # nothing pruned; or before signing
            return None
        return "anchor_unsigned"

    def verify_resumed(
        self, since: Checkpoint, verifier: CheckpointVerifier | None = None
    ) -> ChainVerification:
        """Walk only the entries after `since`, a head an earlier walk verified and signed
        (the caller checks its signature: `store.signed_head`).

        The entry at `since.seq` must still be stored, read, hash to its content and be
        `since.head_hash`; then every entry after it is checked as `verify` checks them,
        linking on from that hash. So an entry after `since` that was edited, removed,
        inserted or moved, and a rewrite or a cut that reaches `since`, are found as by a
        whole walk. What is not read again: the entries before `since` (their links were
        checked when `since` was signed) and keys that are not entries. When the entry at
        `since.seq` does not hold, the whole chain is walked against `since` as against a
        checkpoint, which names the problem (`checkpoint_mismatch`,
        `truncated_before_checkpoint`, ...). When retention pruned up to `since` or past
        it, the walk starts at the anchor, as `verify`'s does. The stored anchor's signature
        is checked with `verifier` (the checkpoint key's) as `verify` checks it.

        `entries` counts from the anchor: those before `since` verified when it was signed.
        """
        if (since.tenant_id or LEGACY_CHAIN) != self.name:
            raise ValueError("a verified head of another chain")
        for _ in range(_VERIFY_ATTEMPTS):
            anchor = self._read_anchor()
            outcome = self._resume_from(anchor, since, verifier)
            if outcome.ok or self._read_anchor() == anchor:
                break
        return outcome

    def _resume_from(
        self, anchor: _Anchor | None, since: Checkpoint, verifier: CheckpointVerifier | None
    ) -> ChainVerification:
        if anchor is None:
            return self._verify_from(None, None, None, verifier)
        first = _start(anchor)
        if since.seq < first.seq:
            return self._verify_from(anchor, None, None, verifier)
        problem = self._anchor_problem(anchor, verifier)
        start = ChainHead(seq=since.seq, hash=since.head_hash)
        if problem is not None or since.seq == first.seq or not self.reaches(start):
            return self._verify_from(anchor, since, None, verifier)
        earlier = self._recorded_losses(first.seq, since.seq, verifier)
        walk = _Walk(
            start,
            verified=since.seq - first.seq - sum(loss.unused_seqs for loss in earlier),
            walked_from=since.seq,
            chain=self.name,
            keys=verifier,
            losses=earlier,
        )
        walk.signed_anchor = anchor if isinstance(anchor, RetentionAnchor) else None
        return walk.over(self._stored(first=since.seq + 1))

    def _recorded_losses(
        self, after: int, until: int, verifier: CheckpointVerifier | None
    ) -> list[RecordedLoss]:
        """The losses recorded after seq `after` up to `until`, from the chain's index of them,
        each counted only if the entry at its seq is a loss entry that holds (its hash, and its
        signed head under the key): what a walk resumed at `until` did not go over itself."""
        found = []
        for seq in indexed_seqs(self._lanes.get(losses_index_key(self.name))):
            entry = self.get(seq) if after < seq <= until else None
            loss = None if entry is None else loss_of(entry)
            if (
                entry is not None
                and loss is not None
                and loss.seq == seq
                and _holds(entry, seq)
                and verifier is not None
                and verifier.verify_of(loss.signed_head, self.name)
            ):
                found.append(RecordedLoss.at(seq, loss))
        return found

    def verify_part(
        self, after: ChainHead | None, limit: int, verifier: CheckpointVerifier | None = None
    ) -> tuple[ChainVerification, bool]:
        """A whole walk a part at a time (`store.chain_scrub`): read at most `limit` stored
        keys after `after` and check them as `verify` does, linking on from its hash; and
        whether the walk reached the chain's end (or a problem).

        `after` is where the previous part stopped (its `head_seq` and `head_hash`), None
        to begin at the anchor; when retention pruned up to it or past it meanwhile, or the
        entry there no longer holds (cut, or edited), the walk begins at the anchor again. A part begins at the key of `after` itself, so a
        key that is not an entry is seen wherever it sorts, as by a whole walk. `entries`
        counts from the anchor, as `verify_resumed`'s does. The stored anchor's signature is
        checked with `verifier` as `verify` checks it, at every part.
        """
        for _ in range(_VERIFY_ATTEMPTS):
            anchor = self._read_anchor()
            outcome, ended = self._part_from(anchor, after, limit, verifier)
            if outcome.ok or self._read_anchor() == anchor:
                break
        return outcome, ended

    def _part_from(
        self,
        anchor: _Anchor | None,
        after: ChainHead | None,
        limit: int,
        verifier: CheckpointVerifier | None,
    ) -> tuple[ChainVerification, bool]:
        if anchor is None or self._anchor_problem(anchor, verifier) is not None:
            return self._verify_from(anchor, None, None, verifier), True
        first = _start(anchor)
        if after is None or after.seq <= first.seq or not self.reaches(after):
            walk, stored = _Walk(first, chain=self.name, keys=verifier), self._stored()
        else:
            walk = _Walk(after, verified=after.seq - first.seq, chain=self.name, keys=verifier)
            stored = (item for item in self._stored(first=after.seq) if item[0] != after.seq)
        walk.signed_anchor = anchor if isinstance(anchor, RetentionAnchor) else None
        read = 0

        def counted() -> Iterator[tuple[int | None, bytes]]:
            nonlocal read
            for item in itertools.islice(stored, limit):
                read += 1
                yield item

        outcome = walk.over(counted())
        return outcome, not outcome.ok or read < limit

    def reaches(self, head: ChainHead) -> bool:
        """Whether the chain still holds head: the entry at its seq is stored, reads, and
        hashes to its hash; or nothing is stored at that seq and the entry after it is a
        recorded loss of head, linking to its hash. One or two reads, no walk."""
        stored = self._lanes.get(entry_key(head.seq, self.name))
        if stored is not None:
            entry = parse_entry(stored)
            return _holds(entry, head.seq) and entry is not None and entry["hash"] == head.hash
        after = self.get(head.seq + 1)
        loss = None if after is None else loss_of(after)
        return (
            after is not None
            and _holds(after, head.seq + 1)
            and loss is not None
            and loss.gap
            and loss.links_to == head
            and after.get("prev_hash") == head.hash
        )

    def prune(self, before: datetime, signer: CheckpointSigner, signed_at: datetime) -> int:
        """Retention: delete the oldest entries recorded before `before`; how many went.

        Stops at the first entry recorded at or after `before`, never deletes the newest
        (the head must stay provable), and never deletes past an entry that does not
        verify, so retention cannot erase evidence of tampering. The anchor (seq and
        hash of the last deleted entry, signed by `signer` at `signed_at`) is written in
        the same batch as the deletes. Raises `ChainCorrupt` rather than prune on from an
        anchor whose signature does not hold under `signer`'s key, or an unsigned one: a
        new signed anchor would vouch for it.
        """
        if before.utcoffset() is None:
            raise ValueError("before must be timezone-aware")
        with self._lock:
            newest = self.head().seq
            keys = signer.verifier()
            walk = _Walk(self._verified_anchor(keys), chain=self.name, keys=keys)
            doomed: list[ChainHead] = []
            for seq, stored in self._stored():
                if seq is None or seq >= newest or walk.step(seq, stored) is not None:
                    break
                entry = parse_entry(stored) or {}
                recorded = parse_timestamp(entry.get("recorded_at"))
                if recorded is None or recorded >= before:
                    break
                doomed.append(ChainHead(seq=seq, hash=walk.prev_hash))
            if not doomed:
                return 0
            anchor = signer.sign_anchor(self.name, doomed[-1], "retention", signed_at)
            with self._lanes.batch(sync=True) as batch:
                for gone in doomed:
                    batch.delete(entry_key(gone.seq, self.name))
                batch.put(anchor_key(self.name), canonical_json(anchor.model_dump()))
        return len(doomed)

    def _verified_anchor(self, verifier: CheckpointVerifier) -> ChainHead:
        """The stored anchor, if it reads and its signature holds; else `ChainCorrupt`."""
        anchor = self._read_anchor()
        if anchor is None:
            raise ChainCorrupt("the retention anchor does not read")
        problem = self._anchor_problem(anchor, verifier)
        if problem == "anchor_unsigned":
            raise ChainCorrupt(
                "the retention anchor is not signed (an older release wrote it): "
                "`sessionstate db upgrade` signs it"
            )
        if problem is not None:
            raise ChainCorrupt("the retention anchor's signature does not verify")
        return _start(anchor)

    def sign_unsigned_anchor(
        self, signer: CheckpointSigner, signed_at: datetime
    ) -> ChainVerification | None:
        """`db upgrade`: sign the anchor an older release left unsigned, once the whole chain
        from it verifies (origin `db_upgrade`: it vouches that the rest was intact then,
        not that what went before was removed by retention). None when the chain has no
        unsigned anchor; else the walk, after which the anchor was signed only if it held.
        """
        with self._lock:
            stored = self._lanes.get(anchor_key(self.name))
            anchor = self._read_anchor()
            if not isinstance(anchor, ChainHead) or anchor.seq == 0:
                return None
            outcome = _Walk(anchor, chain=self.name, keys=signer.verifier()).over(self._stored())
            if not outcome.ok:
                return outcome
            signed = signer.sign_anchor(self.name, anchor, "db_upgrade", signed_at)
            with self._lanes.batch(sync=True) as batch:
                batch.expect(anchor_key(self.name), stored)
                batch.put(anchor_key(self.name), canonical_json(signed.model_dump()))
        return outcome.model_copy(update={"anchor": signed})

    def _read_anchor(self) -> _Anchor | None:
        """The stored anchor: signed, or bare (older releases'); genesis when none is stored,
        None when it does not read. Its signature is not checked here."""
        stored = self._lanes.get(anchor_key(self.name))
        if stored is None:
            return GENESIS
        return _parse_anchor(stored)

    def _stored(
        self, *, reverse: bool = False, first: int | None = None, last: int | None = None
    ) -> Iterator[tuple[int | None, bytes]]:
        """(seq, bytes) per evidence key in key order; seq None for a key the chain never writes.

        With `first` and `last`, only the entry keys from seq first to seq last, sought to: a
        key of another length than an entry's sorts outside them, so only a walk of the whole
        chain (neither given) sees such keys. Raises `ChainCorrupt` at a key that does not
        decode (only raw database access makes one).
        """
        start = None if first is None or first <= 0 else entry_key(first, self.name)
        stop = None if last is None or last >= _LAST_SEQ else entry_key(last + 1, self.name)
        try:
            for key, stored in self._lanes.scan(
                TenantResourceLane.TRACE_EVIDENCE,
                self.name,
                "",
                "",
                reverse=reverse,
                start=start,
                stop=stop,
            ):
                seq = int.from_bytes(key.name, "big") if len(key.name) == _SEQ_BYTES else None
                yield seq, stored
        except ValueError:
            raise ChainCorrupt("an evidence key does not decode") from None


def _parse_anchor(stored: bytes) -> _Anchor | None:
    """A stored anchor's document, signed or bare; None when it is neither, or at seq 0."""
    anchor: _Anchor | None = None
    for model in (RetentionAnchor, ChainHead):
        with suppress(ValueError):  # never re-raised: validation errors quote their input
            anchor = model.model_validate_json(stored)
            break
    return anchor if anchor is not None and anchor.seq > 0 else None
