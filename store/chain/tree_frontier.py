"""`TreeFrontier`: the right edge of a chain's Merkle tree after a head a writer committed.

An append reads, of the nodes already stored, only the roots of the complete
subtrees that make up the tree's leaves (`merkle_tree.appended`: one per one bit
of the size), and the chain's `tree_key`, which its batch expects as read. A
writer that keeps appending to the same chain (the journal) knows both after each
commit: the old edge and the nodes it just wrote give the new edge. Kept beside
the head the writer committed, they save the append its reads.

A frontier is used only after the very head it was made for (`usable_after`: the
same seq and hash). Another writer that appended meanwhile makes the batch fail
on the entry key it expects; one that built or dropped the tree, on `tree_key`;
either way nothing is written and the writer reads the head again, which forgets
the frontier. Damage to a stored edge node is not seen by an append that uses a
frontier (it hashes the frontier's nodes, not the stored ones): the signing of
the next checkpoint note recomputes those nodes from the entries and drops a
tree that no longer matches (`store.chain.log_note.checked_root`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from store.chain.head import ChainHead
from store.chain.merkle_tree import NodeId


class TreeFrontier(NamedTuple):
    """After `head`: the chain's `tree_key` value (None: no tree) and its edge nodes."""

    head: ChainHead
    marker: bytes | None
    nodes: Mapping[NodeId, bytes]

    def usable_after(self, start: ChainHead) -> bool:
        return self.head == start


def edge(size: int) -> list[NodeId]:
    """The roots of the complete subtrees a tree of `size` leaves is made of, largest first."""
    return [
        NodeId(level, (size >> level) - 1)
        for level in range(size.bit_length() - 1, -1, -1)
        if size >> level & 1
    ]


def advanced(
    before: Mapping[NodeId, bytes],
    head: ChainHead,
    marker: bytes | None,
    added: Mapping[NodeId, bytes],
) -> TreeFrontier | None:
    """The frontier after `head`, from the edge before it and the nodes an append added;
    None when one of the edge's nodes is in neither (it is then read from the store)."""
    if marker is None:
        return TreeFrontier(head, None, {})
    size = head.seq
    nodes = {
        node: hash_
        for part in (before, added)
        for node, hash_ in part.items()
        if size >> node.level & 1 and node.position == (size >> node.level) - 1
    }
    return TreeFrontier(head, marker, nodes) if len(nodes) == size.bit_count() else None
