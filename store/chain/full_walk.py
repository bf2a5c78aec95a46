"""The last whole walk of a chain: when, by whom, and what it found (`last_full_walk`).

A verify that resumes from a signed head walks only what was appended since,
so its `ok` says nothing of the entries before that head. What does is the
last walk of the whole chain, which the running service records here (in
`trace_meta`, under the chain's tenant) each time it walks one: a verify with
`full=true` or with no head to resume from, and the scrub (`store.chain.scrub_pass`).

A walk that held is recorded with the checkpoint signed for the head it
reached (`issued_at` is the walk's `at`), and is shown only while that
signature holds under the data dir's key: whoever can write the store but not
read the key cannot make a broken chain look wholly walked and sound. A walk
that found a problem needs no signature to be believed: it is a reason to look.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from store.backends.contract import StoreOffline
from store.canonical import canonical_json
from store.chain.checkpoints import Checkpoint, CheckpointVerifier
from store.chain.evidence import EvidenceChain
from store.chain.head import TIMESTAMP_PATTERN, format_timestamp
from store.chain.walk import ChainProblem, ChainVerification
from store.key_codec import LaneKey, TenantResourceLane

log = logging.getLogger("sessionstate.decisions")

WalkedBy = Literal["verify", "scrub"]


class FullWalk(BaseModel):
    """A walk of the whole chain, from its anchor to its head (or to its first problem)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: str = Field(pattern=TIMESTAMP_PATTERN, description="when it ended, RFC 3339 UTC")
    by: WalkedBy = Field(
        description="verify: a verify that walked the whole chain (full=true, or none before "
        "it); scrub: the service's background walk (SESSIONSTATE_DECISION_SCRUB_SECONDS)"
    )
    ok: bool
    entries: int = Field(ge=0, description="entries that verified before any problem")
    first_invalid_seq: int | None
    problem: ChainProblem | None = Field(description="what broke at first_invalid_seq")
    checkpoint: Checkpoint | None = Field(
        description="the head it reached, signed at `at` (none when it found a problem)"
    )


def full_walk_key(chain: str) -> LaneKey:
    """Where the chain's last whole walk is kept."""
    return LaneKey(TenantResourceLane.TRACE_META, chain, name=b"full_walk")


def record_full_walk(
    chain: EvidenceChain,
    result: ChainVerification,
    *,
    at: datetime,
    by: WalkedBy,
    checkpoint: Checkpoint | None,
) -> FullWalk:
    """Keep a whole walk's outcome as the chain's last (unsynced: a crash only loses it)."""
    walk = FullWalk(
        at=format_timestamp(at),
        by=by,
        ok=result.ok,
        entries=result.entries,
        first_invalid_seq=result.first_invalid_seq,
        problem=result.problem,
        checkpoint=checkpoint if result.ok else None,
    )
    try:
        with chain.lanes.batch(sync=False) as batch:
            batch.put(full_walk_key(chain.name), canonical_json(walk.model_dump()))
    except StoreOffline as error:
        log.warning("full_walk_not_kept", extra={"error_type": type(error).__name__})
    return walk


def last_full_walk(chain: EvidenceChain, verifier: CheckpointVerifier | None) -> FullWalk | None:
    """The chain's last whole walk, if one was recorded and (when it held) its checkpoint's
    signature holds under `verifier`; one that does not is logged as `full_walk_rejected`."""
    stored = chain.lanes.get(full_walk_key(chain.name))
    if stored is None:
        return None
    try:
        walk = FullWalk.model_validate_json(stored)
    except ValueError:  # never re-raised: a validation error quotes its input
        walk = None
    if walk is not None and (not walk.ok or _signed(walk, chain.name, verifier)):
        return walk
    log.warning("full_walk_rejected")
    return None


def _signed(walk: FullWalk, chain: str, verifier: CheckpointVerifier | None) -> bool:
    head = walk.checkpoint
    return (
        head is not None
        and verifier is not None
        and head.issued_at == walk.at
        and verifier.verify_of(head, chain)
    )
