"""The verification walk: a chain's stored entries checked in order from its anchor.

A walk starts at the anchor (or genesis) and steps through each stored key in
key order: every key must be the next seq and hold an entry that links to the
one before and hashes to its `hash`. The one gap it goes over is a recorded
loss (`store.chain.loss`) whose signed head the checkpoint key signed for this
chain. A checkpoint it is given must agree with the entry at its seq, and be
reached. It reports the first problem as a label from a fixed vocabulary
(`ChainProblem`) and a seq, never stored bytes (`ChainVerification`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from store.canonical import canonical_json
from store.chain.checkpoints import Checkpoint, CheckpointVerifier, RetentionAnchor
from store.chain.entry import ChainCorrupt, entry_hash, parse_entry
from store.chain.head import ChainHead
from store.chain.keys import LEGACY_CHAIN
from store.chain.loss import LOSS_MEMBER, RecordedLoss, loss_of

ChainProblem = Literal[
    "entry_unreadable",
    "entry_not_canonical",
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
Failure = tuple[int | None, ChainProblem]  # the first invalid seq (None: not an entry's fault)


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


def link_problem(entry: Mapping[str, Any], seq: int, prev_hash: str) -> ChainProblem | None:
    """Why entry, read at seq, does not link on from prev_hash; None when it does."""
    stored_seq = entry.get("seq")
    if not isinstance(stored_seq, int) or isinstance(stored_seq, bool) or stored_seq != seq:
        return "seq_mismatch"
    if entry.get("prev_hash") != prev_hash:
        return "prev_hash_mismatch"
    claimed = entry.get("hash")
    if not isinstance(claimed, str) or claimed != entry_hash(entry):
        return "hash_mismatch"
    return None


@dataclass
class Walk:
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

    def step(self, seq: int | None, stored: bytes) -> Failure | None:
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
        problem = link_problem(entry, seq, self.prev_hash)
        if problem is None and not _canonical(entry, stored):
            problem = "entry_not_canonical"
        if problem is None and self._contradicts_checkpoint(seq, entry["hash"]):
            problem = "checkpoint_mismatch"
        if problem is None and LOSS_MEMBER in entry:
            problem = self._note_loss(seq, entry, crossed=crosses)
        if problem is not None:
            return seq, problem
        self.expected, self.prev_hash, self.verified = seq + 1, entry["hash"], self.verified + 1
        return None

    def _cross_gap(self, seq: int, entry: dict[str, Any] | None) -> Failure | None:
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

    def finish(self) -> Failure | None:
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

    def outcome(self, failure: Failure | None) -> ChainVerification:
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


def _canonical(entry: dict[str, Any], stored: bytes) -> bool:
    """Whether the stored bytes are the entry's RFC 8785 form, as the service writes it:
    the entry's Merkle leaf is those bytes, so the same entry spelled otherwise (spaces,
    member order, escapes) would hash to its `hash` yet not be the leaf a proof shows."""
    try:
        return canonical_json(entry) == stored
    except Exception:  # never re-raised: the message may quote the content
        return False
