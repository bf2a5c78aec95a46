"""`EvidenceChain`: one decision chain over a lane store: append, read, verify, prune.

The chain does not know what an entry means (`store.chain.entry` says what one
is). It appends (`store.chain.append`), reads back, walks from its anchor to
check every link (`store.chain.walk`), and prunes its oldest entries for
retention, keeping a signed anchor (`store.chain.anchor`).

Reads fail closed and never repeat stored bytes: a problem is a label from a
fixed vocabulary and a seq, and an exception carries a fixed message.
"""

from __future__ import annotations

import itertools
import re
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from store.backends.contract import Lanes
from store.canonical import canonical_json
from store.chain.anchor import Anchor, anchor_problem, read_anchor, start_of
from store.chain.append import ChainExtension
from store.chain.checkpoints import (
    Checkpoint,
    CheckpointSigner,
    CheckpointVerifier,
    RetentionAnchor,
)
from store.chain.entry import ChainCorrupt, holds, parse_entry
from store.chain.head import GENESIS, HASH_PATTERN, NO_TENANT_CHAIN, ChainHead, parse_timestamp
from store.chain.keys import LAST_SEQ, LEGACY_CHAIN, SEQ_BYTES, anchor_key, entry_key
from store.chain.loss import RecordedLoss, indexed_seqs, loss_of, losses_index_key
from store.chain.tree_frontier import TreeFrontier
from store.chain.tree_store import StoredTree
from store.chain.walk import ChainVerification, Walk, link_problem
from store.key_codec import TenantResourceLane

_HASH_RE = re.compile(HASH_PATTERN)
_VERIFY_ATTEMPTS = 3


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
        return start_of(anchor)

    def extension(
        self, after: ChainHead | None = None, known: TreeFrontier | None = None
    ) -> ChainExtension:
        """Entries to seal onto this chain after `after` (its stored head when None), for a
        batch of the caller's (`ChainExtension.add_to`). A caller that caches the head
        serialises its own writes, and may pass the tree's frontier it kept (`known`); the
        batch's expectations keep other writers out."""
        start = self.head() if after is None else after
        return ChainExtension(self.name, start, self._lanes, known)

    def append(self, bodies: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Seal bodies after the stored head and write them in one synced batch; serialised
        per database."""
        if not bodies:
            return []
        with self._lock:
            extension = self.extension()
            extension.seal(bodies)
            with self._lanes.batch(sync=True) as batch:
                extension.add_to(batch)
        return [item.entry for item in extension.entries]

    def get(self, seq: int) -> dict[str, Any] | None:
        """Entry seq as stored; None when missing or unreadable (`verify` says which)."""
        if not 0 < seq < 1 << (8 * SEQ_BYTES):
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
            linked = anchor is not None and self._links_after(start_of(anchor), seq, entry)
            if linked or self._read_anchor() == anchor:
                break
        return linked

    def _links_after(self, anchor: ChainHead, seq: int, entry: Mapping[str, Any]) -> bool:
        if seq <= anchor.seq:  # an entry retention removed, or the anchor moved past it
            return False
        previous = {"hash": anchor.hash} if seq == anchor.seq + 1 else self.get(seq - 1)
        prev_hash = None if previous is None else previous.get("hash")
        return isinstance(prev_hash, str) and link_problem(entry, seq, prev_hash) is None

    def verify(
        self, checkpoint: Checkpoint | None = None, verifier: CheckpointVerifier | None = None
    ) -> ChainVerification:
        """Walk the chain from the anchor and report the first problem; never raises on bad bytes.

        Each stored key must be the next seq (else `seq_gap` at the missing one), hold a
        JSON object (`entry_unreadable`) whose `seq` is its key's (`seq_mismatch`), whose
        `prev_hash` is the previous entry's `hash` (`prev_hash_mismatch`) and whose `hash`
        is its canonical digest (`hash_mismatch`). A stored anchor that does not read, or
        an entry at or below it, is `anchor_invalid`. The one gap accepted is a recorded
        loss (`store.chain.loss`): an entry after the gap that follows the last entry
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
        anchor: Anchor | None,
        checkpoint: Checkpoint | None,
        verifier: CheckpointVerifier | None,
        anchors: CheckpointVerifier | None,
    ) -> ChainVerification:
        """The walk from anchor; `verifier` checks the checkpoint's signature (None: the caller
        did), `anchors` the anchor's."""
        if anchor is None:
            return Walk(GENESIS).outcome((None, "anchor_invalid"))
        walk = Walk(start_of(anchor), checkpoint, chain=self.name, keys=anchors)
        if checkpoint is not None and verifier is not None and not verifier.verify(checkpoint):
            return walk.outcome((None, "checkpoint_signature_invalid"))
        problem = anchor_problem(anchor, self.name, anchors)
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

    def verify_resumed(
        self, since: Checkpoint, verifier: CheckpointVerifier | None = None
    ) -> ChainVerification:
        """Walk only the entries after `since`, a head an earlier walk verified and signed
        (the caller checks its signature: `store.chain.signed_head`).

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
        self, anchor: Anchor | None, since: Checkpoint, verifier: CheckpointVerifier | None
    ) -> ChainVerification:
        if anchor is None:
            return self._verify_from(None, None, None, verifier)
        first = start_of(anchor)
        if since.seq < first.seq:
            return self._verify_from(anchor, None, None, verifier)
        problem = anchor_problem(anchor, self.name, verifier)
        start = ChainHead(seq=since.seq, hash=since.head_hash)
        if problem is not None or since.seq == first.seq or not self.reaches(start):
            return self._verify_from(anchor, since, None, verifier)
        earlier = self._recorded_losses(first.seq, since.seq, verifier)
        walk = Walk(
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
                and holds(entry, seq)
                and verifier is not None
                and verifier.verify_of(loss.signed_head, self.name)
            ):
                found.append(RecordedLoss.at(seq, loss))
        return found

    def verify_part(
        self, after: ChainHead | None, limit: int, verifier: CheckpointVerifier | None = None
    ) -> tuple[ChainVerification, bool]:
        """A whole walk a part at a time (`store.chain.scrub_pass`): read at most `limit` stored
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
        anchor: Anchor | None,
        after: ChainHead | None,
        limit: int,
        verifier: CheckpointVerifier | None,
    ) -> tuple[ChainVerification, bool]:
        if anchor is None or anchor_problem(anchor, self.name, verifier) is not None:
            return self._verify_from(anchor, None, None, verifier), True
        first = start_of(anchor)
        if after is None or after.seq <= first.seq or not self.reaches(after):
            walk, stored = Walk(first, chain=self.name, keys=verifier), self._stored()
        else:
            walk = Walk(after, verified=after.seq - first.seq, chain=self.name, keys=verifier)
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
            return holds(entry, head.seq) and entry is not None and entry["hash"] == head.hash
        after = self.get(head.seq + 1)
        loss = None if after is None else loss_of(after)
        return (
            after is not None
            and holds(after, head.seq + 1)
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
        the same batch as the deletes, and so are the chain's Merkle tree nodes that no
        proof of a kept leaf needs (`StoredTree.prune`). Raises `ChainCorrupt` rather than
        prune on from an anchor whose signature does not hold under `signer`'s key, or an
        unsigned one: a new signed anchor would vouch for it.
        """
        if before.utcoffset() is None:
            raise ValueError("before must be timezone-aware")
        with self._lock:
            newest = self.head().seq
            keys = signer.verifier()
            start = self._verified_anchor(keys)
            walk = Walk(start, chain=self.name, keys=keys)
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
                # Leaf i is seq i+1: the first kept leaf moves from the old anchor's seq to the new.
                StoredTree(self._lanes, self.name).prune(batch, start.seq, doomed[-1].seq)
        return len(doomed)

    def _verified_anchor(self, verifier: CheckpointVerifier) -> ChainHead:
        """The stored anchor, if it reads and its signature holds; else `ChainCorrupt`."""
        anchor = self._read_anchor()
        if anchor is None:
            raise ChainCorrupt("the retention anchor does not read")
        problem = anchor_problem(anchor, self.name, verifier)
        if problem == "anchor_unsigned":
            raise ChainCorrupt(
                "the retention anchor is not signed (an older release wrote it): "
                "`sessionstate db upgrade` signs it"
            )
        if problem is not None:
            raise ChainCorrupt("the retention anchor's signature does not verify")
        return start_of(anchor)

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
            outcome = Walk(anchor, chain=self.name, keys=signer.verifier()).over(self._stored())
            if not outcome.ok:
                return outcome
            signed = signer.sign_anchor(self.name, anchor, "db_upgrade", signed_at)
            with self._lanes.batch(sync=True) as batch:
                batch.expect(anchor_key(self.name), stored)
                batch.put(anchor_key(self.name), canonical_json(signed.model_dump()))
        return outcome.model_copy(update={"anchor": signed})

    def _read_anchor(self) -> Anchor | None:
        return read_anchor(self._lanes, self.name)

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
        stop = None if last is None or last >= LAST_SEQ else entry_key(last + 1, self.name)
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
                seq = int.from_bytes(key.name, "big") if len(key.name) == SEQ_BYTES else None
                yield seq, stored
        except ValueError:
            raise ChainCorrupt("an evidence key does not decode") from None
