"""The one rule for every signature: sign a chain's head only after the walk up to it held,
and the chain reached the signed head the service remembers for it, with the same hash.

The API's verify, the reviewer's page (its bundle download), the offline `checkpoint`
and `bundle` commands all go through here, so none of them can vouch for a broken
chain, nor for a cut one whose seqs were since used again.

The API's verify and the reviewer's page also remember the head they signed,
so the next verify walks only what was appended since (`resumed_checkpoint`). The remembered head is a checkpoint like any other, kept
in the store beside the chain (`trace_meta`, under the chain's tenant, one per
signing key) and trusted only when its signature holds under the deployment's
checkpoint key: whoever can write the store but not read that key cannot make
a verify skip anything. A remembered head whose signature does not hold, or
that names another chain, is ignored (the walk then covers the whole chain and
says so) and logged as `verified_head_rejected`; a genuine but older one only
makes the walk longer. A whole walk stays available (`verified_checkpoint`, or
`full=True`): the CLI, checkpoints, bundles, `GET /v1/decisions/verify?full=true`;
it is held against the remembered head too, which is what shows a cut tail.

The same remembered head tells the journal not to extend a chain that no longer
reaches it (`SignedHeads.behind`), until `record_loss` writes the entry that says
what is gone (`store.chain.loss`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from store.backends.contract import ExpectationFailed, Lanes, StoreOffline
from store.canonical import canonical_json
from store.chain.checkpoints import Checkpoint, CheckpointSigner, CheckpointVerifier
from store.chain.entry import ChainCorrupt
from store.chain.evidence import EvidenceChain
from store.chain.head import ChainHead
from store.chain.keys import LEGACY_CHAIN, chain_names, entry_key, legacy_chain_present, marker_key
from store.chain.loss import LOSS_MEMBER, ChainLoss, index_with, losses_index_key
from store.chain.walk import ChainVerification
from store.key_codec import LaneKey, TenantResourceLane
from store.secrets import SecretsHome

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
    chain: EvidenceChain, secrets: SecretsHome, issued_at: datetime
) -> tuple[ChainVerification, Checkpoint | None]:
    """Walk the whole chain; when it holds, sign the head that verified (naming the chain's
    tenant), and remember it, else sign nothing.

    The one rule for every checkpoint (the API's verify, the offline command, an evidence
    bundle): a checkpoint vouches for a head only after the walk up to it held and the chain
    reached the signed head remembered for it, with the same hash (`whole_walk`). The head
    signed is remembered in turn (never backwards), whoever signed it, so a chain cut below
    any head the deployment's key signed is found. The key is created on first use, and only
    when something is signed; the retention anchor is checked with it (no key yet: a stored
    anchor cannot verify).
    """
    signer = CheckpointSigner.existing(secrets)
    remembered, stored = (None, None) if signer is None else _remembered(chain, signer.verifier())
    result = whole_walk(chain, None if signer is None else signer.verifier())
    if not result.ok:
        return result, None
    signer = signer or CheckpointSigner.of(secrets)
    return result, _signed(chain, signer, result, issued_at, remembered, stored)


def resumed_checkpoint(
    chain: EvidenceChain, secrets: SecretsHome, issued_at: datetime, *, full: bool = False
) -> Verified:
    """`verified_checkpoint`, resuming from the head the last such walk remembered, if its
    signature holds (`EvidenceChain.verify_resumed` says what that covers); the head signed
    now is remembered for the next one. With `full`, the whole chain is walked (still
    against the remembered head), and its head remembered.
    """
    signer = CheckpointSigner.existing(secrets)
    anchors = None if signer is None else signer.verifier()
    remembered, stored = (None, None) if anchors is None else _remembered(chain, anchors)
    since = None if full else remembered
    result = whole_walk(chain, anchors) if since is None else chain.verify_resumed(since, anchors)
    if not result.ok:
        return Verified(result, None, since)
    signer = signer or CheckpointSigner.of(secrets)
    checkpoint = _signed(chain, signer, result, issued_at, remembered, stored)
    return Verified(result, checkpoint, since)


def _signed(
    chain: EvidenceChain,
    signer: CheckpointSigner,
    result: ChainVerification,
    issued_at: datetime,
    remembered: Checkpoint | None,
    stored: bytes | None,
) -> Checkpoint:
    """A checkpoint of the head that verified, remembered unless that would move back."""
    head = ChainHead(seq=result.head_seq, hash=result.head_hash)
    checkpoint = signer.sign(head, issued_at, chain.name or None)
    if remembered is None or remembered.seq <= checkpoint.seq:  # never backwards
        _remember(chain, checkpoint, stored)
    return checkpoint


def whole_walk(chain: EvidenceChain, verifier: CheckpointVerifier | None) -> ChainVerification:
    """The walk of the whole chain, held against the head remembered for it under
    `verifier`'s key (unless retention pruned past it); the anchor is checked with it too.
    Every whole walk goes through here: the service's, the offline commands' and repair's."""
    remembered = None if verifier is None else _remembered(chain, verifier)[0]
    if remembered is None or verifier is None or _pruned_past(chain, remembered):
        return chain.verify(None, verifier)
    return chain.verify(remembered, verifier)


def verify_every_chain(
    lanes: Lanes, verifier: CheckpointVerifier | None = None
) -> dict[str, ChainVerification]:
    """Every chain's whole walk by name (the legacy global chain's too, as `""`, while a
    data dir still holds one), each held against its remembered head (`whole_walk`)."""
    names = chain_names(lanes)
    if legacy_chain_present(lanes):
        names.insert(0, LEGACY_CHAIN)
    return {name: whole_walk(EvidenceChain(lanes, name), verifier) for name in names}


def _pruned_past(chain: EvidenceChain, head: Checkpoint) -> bool:
    """Retention deleted the entries up to beyond head: nothing is left to hold it against."""
    try:
        return head.seq < chain.anchor().seq
    except ChainCorrupt:
        return False  # the walk names the anchor's problem


class NothingLost(Exception):
    """No loss to record: no signed head is remembered for the chain, or it still holds it."""


def record_loss(
    chain: EvidenceChain, secrets: SecretsHome, members: Mapping[str, Any]
) -> dict[str, Any]:
    """Append the entry that records what a chain lost under its remembered signed head
    (`store.chain.loss`), with `members` (`recorded_at`, ...) beside its `loss`; the entry
    as written. Raises `NothingLost` when there is nothing to record.

    Across a cut tail the entry takes the seq after the signed head, which stays
    remembered: the chain reaches it again, through the entry. When the seq was re-used
    instead, the entry follows the stored head, and the remembered head it now holds is
    forgotten (the next verify walks the whole chain and remembers what it signs). One
    synced batch, expecting the chain's next seq free and the remembered head as read.
    """
    signer = CheckpointSigner.existing(secrets)
    if signer is None:
        raise NothingLost("no checkpoint key yet: no head was ever remembered")
    key = verified_head_key(chain.name, signer.key_id)
    lanes = chain.lanes
    with lanes.exclusive(marker_key(chain.name)):
        remembered, stored = _remembered(chain, signer.verifier())
        if remembered is None:
            raise NothingLost("no signed head is remembered for this chain: nothing to record")
        if reaches(chain, remembered):
            raise NothingLost(
                f"the chain still reaches its signed head (seq {remembered.seq}): nothing is lost"
            )
        head = chain.head()
        loss = ChainLoss.of(remembered, head)
        body = {**members, LOSS_MEMBER: loss.model_dump(mode="json")}
        extension = chain.extension(loss.links_to)
        (sealed,) = extension.seal([body])
        index = lanes.get(losses_index_key(chain.name))
        with lanes.batch(sync=True) as batch:
            extension.add_to(batch)  # expects the seq after the signed head free
            batch.expect(entry_key(head.seq + 1, chain.name), None)  # and the stored head's
            batch.expect(key, stored)
            batch.expect(losses_index_key(chain.name), index)
            batch.put(losses_index_key(chain.name), index_with(index, sealed.seq))
            if lanes.get(marker_key(chain.name)) is None:  # never rewrite the row held
                batch.put(marker_key(chain.name), b"")
            if not loss.gap:
                batch.delete(key)
    log.warning("decision_log_loss_recorded", extra={"chain": chain.name, "seq": sealed.seq})
    return sealed.entry


class SignedHeads:
    """The signed head the service remembers for each chain, under the deployment's key, for
    the journal to check a chain's head against before it extends it (`behind`)."""

    def __init__(self, secrets: SecretsHome) -> None:
        self._secrets = secrets
        self._signer: CheckpointSigner | None = None

    def remembered(self, chain: EvidenceChain) -> Checkpoint | None:
        """The head remembered for chain, if its signature holds."""
        if self._signer is None:
            self._signer = CheckpointSigner.existing(self._secrets)  # no key: none remembered
        if self._signer is None:
            return None
        return _remembered(chain, self._signer.verifier())[0]

    def behind(self, chain: EvidenceChain) -> bool:
        """Whether the stored chain no longer reaches its remembered signed head: it ends
        below it, or holds another entry at its seq. Extending it would re-use seqs that
        head covered."""
        head = self.remembered(chain)
        return head is not None and not reaches(chain, head)


def reaches(chain: EvidenceChain, head: Checkpoint) -> bool:
    """Whether the stored chain holds the signed head (or retention pruned past it)."""
    if _pruned_past(chain, head):
        return True
    try:
        anchor = chain.anchor()
    except ChainCorrupt:
        return False
    if head.seq == anchor.seq:
        return head.head_hash == anchor.hash
    return chain.reaches(ChainHead(seq=head.seq, hash=head.head_hash))


def _remembered(
    chain: EvidenceChain, verifier: CheckpointVerifier
) -> tuple[Checkpoint | None, bytes | None]:
    """The head remembered for the chain under the verifier's key, if its signature holds;
    and the stored bytes, to replace only those."""
    stored = chain.lanes.get(verified_head_key(chain.name, verifier.key_id))
    if stored is None:
        return None, None
    head = Checkpoint.stored(stored)
    if not verifier.verify_of(head, chain.name):
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
