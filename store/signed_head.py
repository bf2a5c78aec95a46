"""The one rule for every checkpoint: sign a chain's head only after the walk up to it held.

The API's verify, the offline `checkpoint` command and evidence bundles all go
through here, so none of them can vouch for a broken chain.

The API's verify and the reviewer's page also remember the head they signed,
so the next verify walks only what was appended since (`resumed_checkpoint`). The remembered head is a checkpoint like any other, kept
in the store beside the chain (`trace_meta`, under the chain's tenant, one per
signing key) and trusted only when its signature holds under the data dir's
checkpoint key: whoever can write the store but not read that key cannot make
a verify skip anything. A remembered head whose signature does not hold, or
that names another chain, is ignored (the walk then covers the whole chain and
says so) and logged as `verified_head_rejected`; a genuine but older one only
makes the walk longer. A whole walk stays available (`verified_checkpoint`, or
`full=True`): the CLI, checkpoints, bundles, `GET /v1/decisions/verify?full=true`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from store.backends.contract import ExpectationFailed, StoreOffline
from store.canonical import canonical_json
from store.chain_head import ChainHead
from store.checkpoints import Checkpoint, CheckpointSigner
from store.evidence_chain import LEGACY_CHAIN, ChainVerification, EvidenceChain
from store.keys import LaneKey, TenantResourceLane

log = logging.getLogger("sessionstate.decisions")


class ChainUnverified(Exception):
    """The chain does not verify, so nothing is signed for it. The message names where and why."""

    def __init__(self, problem: str | None, seq: int | None, refused: str) -> None:
        self.problem = problem
        self.seq = seq
        where = f" at seq {seq}" if seq is not None else ""
        super().__init__(
            f"the decision log does not verify ({problem}{where}): no {refused} is signed "
            "for a broken chain; `sessionstate decisions verify` shows the problem"
        )

    @classmethod
    def of(cls, result: ChainVerification, refused: str) -> ChainUnverified:
        return cls(result.problem, result.first_invalid_seq, refused)


@dataclass(frozen=True)
class Verified:
    """A walk's outcome, the checkpoint signed for it (None for a broken chain), and the
    remembered head it resumed from (None: it walked the whole chain)."""

    result: ChainVerification
    checkpoint: Checkpoint | None
    resumed_from: Checkpoint | None = None


def verified_head_key(chain: str, key_id: str) -> LaneKey:
    """Where the last head of `chain` verified and signed with the key `key_id` is kept."""
    return LaneKey(TenantResourceLane.TRACE_META, chain, name=b"verified:" + key_id.encode())


def verified_checkpoint(
    chain: EvidenceChain, data_dir: Path, issued_at: datetime
) -> tuple[ChainVerification, Checkpoint | None]:
    """Walk the whole chain; when it holds, sign the head that verified (naming the chain's
    tenant), else sign nothing.

    The one rule for every checkpoint (the API's verify, the offline command, an evidence
    bundle): a checkpoint vouches for a head only after the walk up to it held. The key
    is created on first use, and only when something is signed; the retention anchor is
    checked with it (no key yet: a stored anchor cannot verify).
    """
    existing = CheckpointSigner.existing(data_dir)
    result = chain.verify(None, None if existing is None else existing.verifier())
    if not result.ok:
        return result, None
    head = ChainHead(seq=result.head_seq, hash=result.head_hash)
    signer = CheckpointSigner.from_data_dir(data_dir)
    return result, signer.sign(head, issued_at, chain.name or None)


def resumed_checkpoint(
    chain: EvidenceChain, data_dir: Path, issued_at: datetime, *, full: bool = False
) -> Verified:
    """`verified_checkpoint`, resuming from the head the last such walk remembered, if its
    signature holds (`EvidenceChain.verify_resumed` says what that covers); the head signed
    now is remembered for the next one. With `full`, the whole chain is walked, and its head
    remembered unless that is behind the remembered one. Only the running service calls
    this: offline review never writes to the store it reviews.
    """
    signer = CheckpointSigner.existing(data_dir)
    remembered, stored = (None, None) if signer is None else _remembered(chain, signer)
    since = None if full else remembered
    anchors = None if signer is None else signer.verifier()
    result = chain.verify(None, anchors) if since is None else chain.verify_resumed(since, anchors)
    if not result.ok:
        return Verified(result, None, since)
    head = ChainHead(seq=result.head_seq, hash=result.head_hash)
    signer = signer or CheckpointSigner.from_data_dir(data_dir)
    checkpoint = signer.sign(head, issued_at, chain.name or None)
    # Never backwards: a shorter chain than one verified before goes on showing as cut.
    if remembered is None or remembered.seq <= checkpoint.seq:
        _remember(chain, checkpoint, stored)
    return Verified(result, checkpoint, since)


def _remembered(
    chain: EvidenceChain, signer: CheckpointSigner
) -> tuple[Checkpoint | None, bytes | None]:
    """The head remembered for the chain under this key, if its signature holds; and the
    stored bytes, to replace only those."""
    stored = chain.lanes.get(verified_head_key(chain.name, signer.key_id))
    if stored is None:
        return None, None
    try:
        head = Checkpoint.model_validate_json(stored)
    except ValueError:  # never re-raised: a validation error quotes its input
        head = None
    if (
        head is None
        or (head.tenant_id or LEGACY_CHAIN) != chain.name
        or not signer.verifier().verify(head)
    ):
        log.warning("verified_head_rejected")
        return None, stored
    return head, stored


def _remember(chain: EvidenceChain, head: Checkpoint, replaced: bytes | None) -> None:
    """Keep head for the next walk, if no other walk replaced the one read meanwhile.

    Unsynced: a head lost in a crash only makes the next walk longer.
    """
    key = verified_head_key(chain.name, head.key_id)
    try:
        with chain.lanes.batch(sync=False) as batch:
            batch.expect(key, replaced)
            batch.put(key, canonical_json(head.model_dump()))
    except ExpectationFailed:
        pass  # another walk remembered its head first; the next walk starts from that one
    except StoreOffline as error:
        log.warning("verified_head_not_kept", extra={"error_type": type(error).__name__})
