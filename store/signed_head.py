"""The one rule for every checkpoint: sign a chain's head only after the walk up to it held.

The API's verify, the offline `checkpoint` command and evidence bundles all go
through `verified_checkpoint`, so none of them can vouch for a broken chain.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from store.chain_head import ChainHead
from store.checkpoints import Checkpoint, CheckpointSigner
from store.evidence_chain import ChainVerification, EvidenceChain


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


def verified_checkpoint(
    chain: EvidenceChain, data_dir: Path, issued_at: datetime
) -> tuple[ChainVerification, Checkpoint | None]:
    """Walk the whole chain; when it holds, sign the head that verified (naming the chain's
    tenant), else sign nothing.

    The one rule for every checkpoint (the API's verify, the offline command, an evidence
    bundle): a checkpoint vouches for a head only after the walk up to it held. The key
    is created on first use, and only when something is signed.
    """
    result = chain.verify()
    if not result.ok:
        return result, None
    head = ChainHead(seq=result.head_seq, hash=result.head_hash)
    signer = CheckpointSigner.from_data_dir(data_dir)
    return result, signer.sign(head, issued_at, chain.name or None)
