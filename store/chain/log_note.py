"""A chain's checkpoint notes: its Merkle tree head as a C2SP tlog-checkpoint, signed.

The note (`store.chain.tlog_checkpoint` in a `store.chain.note` envelope) says
`<origin>/<chain>`, the tree size and the RFC 6962 root, signed by the data
dir's checkpoint key (the one that signs the JSON checkpoints) as a note key
named by the origin: one verifier key, `LogSigner.verifier_key`, for every
tenant of the deployment, in the form Go's `golang.org/x/mod/sumdb/note` reads.
Unset, the origin is `sessionstate.local/` and the key's 16 hex digits, so it
stays the same across restarts and differs between deployments.

A note is signed by the one rule of `store.chain.signed_head`: only after the
walk up to the head held and reached the remembered signed head
(`resumed_checkpoint`, which signs and remembers a JSON checkpoint of the same
head), so a broken chain never gets one. Its size is that head's seq. The tree
it vouches for is checked too: the nodes the entries walked since the last
note add are computed again from their stored bytes, on the last note's tree
(whose root must still be the one that note signed), and must be the stored
ones; else the tree is dropped, as an append drops one it finds damaged
(`db upgrade` builds it again), and `TreeUnavailable` and no note. The tiles
those nodes complete are written then (`store.chain.tree_tiles`), so that the
proofs against the note read them. Every note signed is kept, under
the chain in `trace_meta` (`note_key`: by size), so the latest is one seek and
an older size can be served again.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from store.backends.contract import LaneView
from store.chain.checkpoints import CheckpointSigner
from store.chain.evidence import EvidenceChain
from store.chain.keys import meta_newest_first
from store.chain.merkle_tree import appended_all, entry_leaf, root
from store.chain.note import NoteError, NoteSigner, VerifierKey, open_note
from store.chain.rfc9162 import EMPTY_ROOT
from store.chain.signed_head import ChainUnverified, Verified, resumed_checkpoint
from store.chain.tlog_checkpoint import TreeHead
from store.chain.tree_store import StoredTree, TreeNodeMissing, drop_tree
from store.chain.tree_tiles import TileId, completed_tiles
from store.key_codec import LaneKey, TenantResourceLane
from store.secrets import SecretsHome

DEFAULT_ORIGIN_PREFIX = "sessionstate.local/"
_SIZE_BYTES = 8
_NOTE = b"note"
_CHECK_BATCH = 4096  # leaves whose nodes are checked at a time (bounds the memory)


class TreeUnavailable(Exception):
    """The chain has no Merkle tree (pruned before it had one), or its stored tree does not
    hold (a node missing, or not the one its entries give): no note or proof is made."""

    def __init__(self) -> None:
        super().__init__(
            "this decision log has no Merkle tree that holds (retention pruned entries "
            "before one was built, or a node of it is damaged): no checkpoint note or proof"
        )


def note_key(chain: str, size: int) -> LaneKey:
    """Where the chain's note of tree size `size` is kept."""
    return LaneKey(
        TenantResourceLane.TRACE_META, chain, name=_NOTE + size.to_bytes(_SIZE_BYTES, "big")
    )


def default_origin(signer: CheckpointSigner) -> str:
    """The origin when `SESSIONSTATE_LOG_ORIGIN` is unset: names the deployment by its key."""
    return DEFAULT_ORIGIN_PREFIX + signer.key_id.removeprefix("ed25519:")


@dataclass(frozen=True)
class LogSigner:
    """The deployment's note key: the deployment's checkpoint key, named by the origin."""

    origin: str
    signer: NoteSigner

    @classmethod
    def of(cls, secrets: SecretsHome, origin: str | None) -> LogSigner:
        """The deployment's checkpoint key (in a data dir, created on first use) under `origin`
        (None: the default)."""
        key = CheckpointSigner.of(secrets)
        name = origin or default_origin(key)
        return cls(name, key.note_signer(name))

    @property
    def verifier_key(self) -> VerifierKey:
        return self.signer.verifier_key

    def chain_origin(self, chain: str) -> str:
        """A chain's origin line: `<origin>/<chain>`."""
        return f"{self.origin}/{chain}"


@dataclass(frozen=True)
class SignedTreeHead:
    """A note as served, and the tree head it signs."""

    head: TreeHead
    note: bytes


def stored_note(view: LaneView, log: LogSigner, chain: str, size: int) -> SignedTreeHead | None:
    """The kept note of that size, if it opens under the log's key and names the chain."""
    return _opened(view.get(note_key(chain, size)), log, chain)


def latest_note(view: LaneView, log: LogSigner, chain: str) -> SignedTreeHead | None:
    """The kept note of the largest size that opens under the log's key (one seek, then as
    many reads as notes of another key or origin sort above it)."""
    for _, value in meta_newest_first(view, chain, _NOTE, _SIZE_BYTES):
        opened = _opened(value, log, chain)
        if opened is not None:
            return opened
    return None


def _opened(value: bytes | None, log: LogSigner, chain: str) -> SignedTreeHead | None:
    if value is None:
        return None
    try:
        head = TreeHead.parse(open_note(value, log.verifier_key).text)
    except NoteError:
        return None
    return SignedTreeHead(head, value) if head.origin == log.chain_origin(chain) else None


def current_note(
    chain: EvidenceChain, secrets: SecretsHome, log: LogSigner, now: datetime
) -> SignedTreeHead:
    """`note_of` the head a walk resumed from the remembered head verifies now."""
    return note_of(chain, resumed_checkpoint(chain, secrets, now), log)


def note_of(chain: EvidenceChain, verified: Verified, log: LogSigner) -> SignedTreeHead:
    """The chain's note of the head `verified` signed (`store.chain.signed_head`): the kept
    one when the chain has not grown since, else one signed now, its tree checked, and
    kept. Raises `ChainUnverified` for a chain that did not verify, `TreeUnavailable` for
    a tree that does not hold."""
    if verified.checkpoint is None:
        raise ChainUnverified.of(verified.result, "checkpoint note")
    size = verified.checkpoint.seq
    latest = latest_note(chain.lanes, log, chain.name)
    if latest is not None and latest.head.size == size:
        return latest
    if latest is not None and latest.head.size > size:
        raise TreeUnavailable()  # a tree larger than the chain that verified
    head = TreeHead(log.chain_origin(chain.name), size, checked_root(chain, latest, size))
    signed = SignedTreeHead(head, log.signer.sign(head.text()))
    with chain.lanes.batch(sync=False) as batch:  # lost in a crash: signed again
        batch.put(note_key(chain.name, size), signed.note)
    return signed


def checked_root(chain: EvidenceChain, latest: SignedTreeHead | None, size: int) -> bytes:
    """The stored tree's root of `size` leaves, once the nodes the entries after the last
    note (or after the retention anchor) add are those their stored bytes give, on a tree
    whose root at the last note's size is still the one signed. A tree that does not hold
    is dropped (`drop_tree`: `db upgrade` builds it again) and `TreeUnavailable`."""
    if size == 0:
        return EMPTY_ROOT
    tree = StoredTree(chain.lanes, chain.name)
    if not tree.present():
        raise TreeUnavailable()
    kept_from = chain.anchor().seq
    completed: set[TileId] = set()
    try:
        if _holds(chain, tree, latest, kept_from, size, completed):
            with chain.lanes.batch(sync=False) as batch:  # lost in a crash: read as nodes
                tree.put_tiles(batch, completed)
            return root(size, tree.node_at)
    except TreeNodeMissing:
        if chain.anchor().seq != kept_from:  # retention pruned meanwhile: not damage
            raise TreeUnavailable() from None
    drop_tree(chain.lanes, chain.name)
    raise TreeUnavailable()


def _holds(
    chain: EvidenceChain,
    tree: StoredTree,
    latest: SignedTreeHead | None,
    kept_from: int,
    size: int,
    completed: set[TileId],
) -> bool:
    """Whether the stored tree still has the last note's root, and the nodes of the entries
    after it (up to `size`) are those their stored bytes give; the tiles those nodes
    complete are added to `completed`. Raises `TreeNodeMissing`."""
    since = kept_from if latest is None else max(latest.head.size, kept_from)
    signed_before = latest is not None and since == latest.head.size and since > 0
    if signed_before and latest and root(since, tree.node_at) != latest.head.root_hash:
        return False
    leaves = _leaves(chain, tree, since, size)
    while part := list(itertools.islice(leaves, _CHECK_BATCH)):
        computed = appended_all(since, part, tree.node_at)
        if any(tree.node_at(*node) != hash_ for node, hash_ in computed.items()):
            return False
        completed |= completed_tiles(computed)
        since += len(part)
    return True


def _leaves(chain: EvidenceChain, tree: StoredTree, since: int, size: int) -> Iterator[bytes]:
    """The leaf hashes of the entries after seq `since` up to `size`, from their stored
    bytes; a seq a recorded loss says is gone keeps the leaf its node holds."""
    expected = since + 1
    for seq, stored in chain.stored_entries(after_seq=since, until_seq=size):
        for gone in range(expected, seq):
            yield tree.node_at(0, gone - 1)
        yield entry_leaf(stored)
        expected = seq + 1
    for gone in range(expected, size + 1):
        yield tree.node_at(0, gone - 1)
