"""A recorded loss: the chain's own entry saying that entries a signed head covered are gone.

When a chain's stored entries no longer reach the head the service signed and
remembers (`store.chain.signed_head`), the service takes no entry on that chain (it
would re-use seqs the signed head already covered) until an operator records
the loss (`sessionstate decisions record-loss`). The loss entry carries a
`loss` member: the signed head it concerns (the whole checkpoint, signature
and all) and the last stored entry it follows.

Two cases, and the entry's seq and link say which:

- the stored chain ends below the signed head (its tail was cut): the entry
  takes the seq after the signed head and links to the signed head's hash, so
  no covered seq is ever used again. The seqs from the one after `follows` up
  to the signed head are gone (`lost_from_seq`..`lost_to_seq`); a walk accepts
  exactly this gap (`store.chain.walk`) and reports it.
- the chain reaches the signed head's seq with another entry there (seqs were
  re-used, by a version before this check, or by whoever edited the store):
  the entry follows the stored head as any entry does. Which of the signed
  entries are gone is not known (`lost_from_seq` null) up to the signed head's
  seq, and the signed head is superseded: it is in the chain, as this entry's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from store.canonical import canonical_json
from store.chain.checkpoints import Checkpoint
from store.chain.head import ChainHead
from store.key_codec import LaneKey, TenantResourceLane

LOSS_MEMBER = "loss"


class ChainLoss(BaseModel):
    """The `loss` member of a loss entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    signed_head: Checkpoint = Field(description="the signed head the chain no longer reached")
    follows: ChainHead = Field(description="the last stored entry when the loss was recorded")
    lost_from_seq: int | None = Field(
        ge=1,
        description="the first seq gone; null when seqs up to the signed head's were re-used, "
        "so which signed entries are gone is not known",
    )
    lost_to_seq: int = Field(ge=1, description="the last seq gone: the signed head's")

    @model_validator(mode="after")
    def _says_what_follows_from_its_heads(self) -> ChainLoss:
        if self.lost_to_seq != self.signed_head.seq:
            raise ValueError("lost_to_seq is the signed head's seq")
        expected = self.follows.seq + 1 if self.gap else None
        if self.lost_from_seq != expected:
            raise ValueError("lost_from_seq is the seq after follows, when seqs were not re-used")
        return self

    @classmethod
    def of(cls, signed_head: Checkpoint, follows: ChainHead) -> ChainLoss:
        gap = follows.seq < signed_head.seq
        return cls(
            signed_head=signed_head,
            follows=follows,
            lost_from_seq=follows.seq + 1 if gap else None,
            lost_to_seq=signed_head.seq,
        )

    @property
    def gap(self) -> bool:
        """The seqs after `follows` up to the signed head are unused (the tail was cut)."""
        return self.follows.seq < self.signed_head.seq

    @property
    def links_to(self) -> ChainHead:
        """What the loss entry links to: the signed head across a gap, else `follows`."""
        if self.gap:
            return ChainHead(seq=self.signed_head.seq, hash=self.signed_head.head_hash)
        return self.follows

    @property
    def seq(self) -> int:
        """The loss entry's own seq."""
        return self.links_to.seq + 1


class RecordedLoss(BaseModel):
    """A loss entry a walk went over, as verify reports it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int = Field(ge=1, description="the loss entry's seq")
    follows_seq: int = Field(ge=0, description="the last entry stored before it")
    lost_from_seq: int | None = Field(
        description="the first seq gone; null: seqs up to lost_to_seq had been re-used"
    )
    lost_to_seq: int = Field(description="the last seq gone: the signed head's")
    signed_head_hash: str = Field(description="the hash the signed head had at lost_to_seq")

    @property
    def unused_seqs(self) -> int:
        """How many seqs the loss left unused: the gap after `follows_seq` (none when the
        seqs had been re-used)."""
        return 0 if self.lost_from_seq is None else self.lost_to_seq - self.follows_seq

    @classmethod
    def at(cls, seq: int, loss: ChainLoss) -> RecordedLoss:
        return cls(
            seq=seq,
            follows_seq=loss.follows.seq,
            lost_from_seq=loss.lost_from_seq,
            lost_to_seq=loss.lost_to_seq,
            signed_head_hash=loss.signed_head.head_hash,
        )


def loss_of(entry: Mapping[str, Any]) -> ChainLoss | None:
    """The entry's recorded loss; None when it has none or one that does not read."""
    member = entry.get(LOSS_MEMBER)
    if member is None:
        return None
    try:
        return ChainLoss.model_validate(member)
    except ValidationError:  # never re-raised: the error quotes its input
        return None


def losses_index_key(chain: str) -> LaneKey:
    """Where the seqs of a chain's loss entries are listed, so that a walk resumed past them
    can still report them (each is read again from its entry before it counts)."""
    return LaneKey(TenantResourceLane.TRACE_META, chain, name=b"losses")


def indexed_seqs(stored: bytes | None) -> list[int]:
    """The seqs a losses index holds; none for an index that does not read (an index only
    points: what counts is the entry at each seq)."""
    try:
        seqs = json.loads(stored) if stored is not None else []
    except ValueError:
        return []
    if not isinstance(seqs, list) or not all(type(seq) is int for seq in seqs):
        return []
    return seqs


def index_with(stored: bytes | None, seq: int) -> bytes:
    """The losses index with seq added."""
    return canonical_json(sorted({*indexed_seqs(stored), seq}))
