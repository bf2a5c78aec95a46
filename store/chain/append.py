"""`ChainExtension`: entries sealed onto one chain, added to a batch with what guards them.

Every writer of a chain extends it this one way (`EvidenceChain.append`, the
journal's group commits, `sessionstate db upgrade`'s migration, a recorded
loss): seal the bodies after the head it read (`seal`, which touches no
store), then add them to a batch of its own, which expects the key of the seq
after that head to be absent and, for a chain's first entries, writes its
marker. When another writer appended meanwhile the batch fails
(`ExpectationFailed`) and nothing of it is written, so a chain never forks.

The same batch holds the chain's Merkle tree nodes the entries add
(`store.chain.tree_store`): leaf i is the entry of seq i+1, its stored bytes,
and all of an extension's nodes are computed together, so those its later
entries need of its earlier ones come from the extension, the rest (the old
frontier, at most log2(n) nodes) from the store. A chain's first entries write
its `tree_key` too; a chain without one (written before trees, waiting for `db
upgrade`) gets no nodes. The batch expects `tree_key` as read, so an upgrade
that builds the tree meanwhile and an append cannot miss each other's leaves.
A frontier node that is not stored (damage) drops the tree (its `tree_key`
goes, logged as `decision_log_tree_dropped`) rather than refuse the entries:
proofs for the chain are refused from then on, never served from a wrong tree.
A writer that keeps appending (the journal) passes the frontier it kept after
its last commit (`store.chain.tree_frontier`), and the append reads nothing of
the tree.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from store.backends.contract import LaneBatch, LaneView
from store.canonical import Encoded
from store.chain.entry import SealedEntry, seal
from store.chain.head import ChainHead
from store.chain.keys import entry_key, marker_key, tree_key
from store.chain.tree_frontier import TreeFrontier, advanced
from store.chain.tree_store import StoredTree, TreeNodeMissing

log = logging.getLogger("sessionstate.decisions")


class ChainExtension:
    """Entries sealed onto chain `chain` after `start`, not written yet; `head` is the chain's
    head once they are. `view` is the store the chain's tree is read from, unless `known`
    (the frontier a writer kept after committing `start`) says it. Once added to a batch,
    `frontier` is the tree's after `head`, for the writer to keep if the batch commits."""

    def __init__(
        self, chain: str, start: ChainHead, view: LaneView, known: TreeFrontier | None = None
    ) -> None:
        self.chain = chain
        self.start = start
        self._tree = StoredTree(view, chain)
        self._known = known if known is not None and known.usable_after(start) else None
        self.head = start
        self.entries: list[SealedEntry] = []
        self.frontier: TreeFrontier | None = None

    def seal(
        self,
        bodies: Sequence[Mapping[str, Any]],
        *,
        encoded_members: Sequence[Mapping[str, Encoded]] = (),
    ) -> list[SealedEntry]:
        """Seal bodies after the entries sealed so far (`seal`); the entries they became.
        Raises ValueError for a body it cannot seal, and then nothing of bodies is added."""
        sealed, self.head = seal(bodies, self.head, self.chain, encoded_members=encoded_members)
        self.entries.extend(sealed)
        return sealed

    def add_to(self, batch: LaneBatch) -> None:
        """Put the entries and their tree nodes in batch, which then commits only if the seq
        after `start` is still free, with the chain's marker and `tree_key` when they are its
        first. Nothing sealed: nothing."""
        if not self.entries:
            return
        batch.expect(entry_key(self.start.seq + 1, self.chain), None)
        if self.start.seq == 0:  # held while written? Only if entry 1 exists: the
            batch.put(marker_key(self.chain), b"")  # expectation above fails first
        for entry in self.entries:
            batch.put(entry.key, entry.value)
        self._add_nodes(batch)

    def _add_nodes(self, batch: LaneBatch) -> None:
        marker = self._tree.marker() if self._known is None else self._known.marker
        batch.expect(tree_key(self.chain), marker)
        if self.start.seq == 0 and marker is None:  # the chain's first entries: a tree
            marker = b""
            batch.put(tree_key(self.chain), marker)
        if marker is None:
            self.frontier = TreeFrontier(self.head, None, {})
            return
        before = self._tree.edge(self.start.seq) if self._known is None else self._known.nodes
        try:
            nodes = self._tree.appended(self.start.seq, (e.value for e in self.entries), before)
        except TreeNodeMissing:
            log.error("decision_log_tree_dropped", extra={"chain": self.chain})
            batch.delete(tree_key(self.chain))
            self.frontier = TreeFrontier(self.head, None, {})
            return
        self._tree.put(batch, nodes)
        self.frontier = advanced(before, self.head, marker, nodes)
