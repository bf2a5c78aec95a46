"""The scrub's walk of one chain: the whole chain, a part at a time, resumable.

A pass walks from the anchor to the head, `limit` keys per step
(`EvidenceChain.verify_part`), and keeps where it stopped in the store (in
`trace_meta`, under the chain's tenant, per signing key), so a restart goes
on from there rather than from the anchor. When the pass reaches the head or a
problem, it is recorded as the chain's last whole walk (`store.chain.full_walk`) and
the next pass begins at the anchor again.

Where a pass stopped is kept as a checkpoint of that head (`issued_at` is when
the pass began), trusted only while its signature holds under the data dir's
key: whoever can write the store but not read the key cannot move a pass past
an entry they edited. One that does not hold is logged as
`scrub_position_rejected` and the pass begins again. Several processes on one
store may scrub the same chain: each step expects the position it read, and a
step that lost that race is simply not kept. A step whose position cannot be
written raises (`StoreOffline`): the scrub tries again later.
"""

from __future__ import annotations

import logging
from datetime import datetime

from store.backends.contract import ExpectationFailed
from store.canonical import canonical_json
from store.chain.checkpoints import Checkpoint, CheckpointSigner
from store.chain.evidence import EvidenceChain
from store.chain.full_walk import FullWalk, record_full_walk
from store.chain.head import ChainHead, parse_timestamp
from store.key_codec import LaneKey, TenantResourceLane

log = logging.getLogger("sessionstate.decisions")


def scrub_position_key(chain: str, key_id: str) -> LaneKey:
    """Where a pass over `chain` stopped, signed with the key `key_id`."""
    return LaneKey(TenantResourceLane.TRACE_META, chain, name=b"scrub:" + key_id.encode())


def scrub_in_progress(chain: EvidenceChain, signer: CheckpointSigner) -> bool:
    """Whether a pass over the chain began and has not ended yet."""
    return chain.lanes.get(scrub_position_key(chain.name, signer.key_id)) is not None


def scrub_step(
    chain: EvidenceChain, signer: CheckpointSigner, now: datetime, limit: int
) -> FullWalk | None:
    """Walk the next `limit` keys of the chain's pass (beginning one if none is under way);
    the pass's outcome, recorded as the last whole walk, when it ended, else None."""
    key = scrub_position_key(chain.name, signer.key_id)
    stored = chain.lanes.get(key)
    position = None if stored is None else _position(chain.name, stored, signer)
    after = None if position is None else ChainHead(seq=position.seq, hash=position.head_hash)
    result, ended = chain.verify_part(after, limit, signer.verifier())
    began = now if position is None else parse_timestamp(position.issued_at) or now
    try:
        with chain.lanes.batch(sync=False) as batch:
            batch.expect(key, stored)
            if ended:
                batch.delete(key)
            else:
                head = ChainHead(seq=result.head_seq, hash=result.head_hash)
                batch.put(key, canonical_json(signer.sign(head, began, chain.name).model_dump()))
    except ExpectationFailed:
        return None  # another scrubber stepped meanwhile; the next step goes on from its position
    if not ended:
        return None
    head = ChainHead(seq=result.head_seq, hash=result.head_hash)
    checkpoint = signer.sign(head, now, chain.name) if result.ok else None
    return record_full_walk(chain, result, at=now, by="scrub", checkpoint=checkpoint)


def _position(chain: str, stored: bytes, signer: CheckpointSigner) -> Checkpoint | None:
    """Where the pass stopped, if its signature holds for this chain."""
    position = Checkpoint.stored(stored)
    if not signer.verifier().verify_of(position, chain):
        log.warning("scrub_position_rejected")
        return None
    return position
