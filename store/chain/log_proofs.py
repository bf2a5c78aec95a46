"""Inclusion and consistency proofs of a chain's Merkle tree, within the sizes its notes signed.

What the routes and the offline commands hand a reviewer, beside a checkpoint note
(`store.chain.log_note`): the audit path of one entry's leaf (leaf seq - 1) in the
tree of a size, and the proof that the tree of one size extends that of a smaller
one, both in RFC 9162 order, read from the stored nodes (O(log n) of them, fetched in
one pass: `StoredTree.read_through`). Sizes are
bounded by the latest note's: 1 <= tree_size <= it, the leaf below tree_size,
1 <= first <= second <= it (`ProofOutOfRange` otherwise). A consistency proof from a
size below the chain's first kept entry needs nodes retention deleted
(`store.chain.merkle_retention`): `ProofPruned`. Errors name no size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from store.chain.evidence import EvidenceChain
from store.chain.log_note import TreeUnavailable
from store.chain.merkle_tree import NodeAt, consistency_proof, entry_leaf, inclusion_proof
from store.chain.tree_store import StoredTree, TreeNodeMissing


class ProofOutOfRange(ValueError):
    """The sizes asked are outside what the latest checkpoint note signed."""


class ProofPruned(LookupError):
    """Retention deleted the nodes the proof needs: it starts below the first kept entry."""


@dataclass(frozen=True)
class InclusionProof:
    leaf_index: int
    tree_size: int
    leaf_hash: bytes
    hashes: list[bytes]


@dataclass(frozen=True)
class ConsistencyProof:
    first: int
    second: int
    hashes: list[bytes]


def inclusion(
    chain: EvidenceChain, seq: int, stored: bytes, tree_size: int, latest: int
) -> InclusionProof:
    """The audit path of entry seq (its stored bytes: `stored`) in the tree of tree_size."""
    if not seq <= tree_size <= latest:
        raise ProofOutOfRange("the tree size must hold the entry and be at most the latest note's")
    hashes = _read(chain, lambda node_at: inclusion_proof(seq - 1, tree_size, node_at), latest)
    return InclusionProof(seq - 1, tree_size, entry_leaf(stored), hashes)


def consistency(chain: EvidenceChain, first: int, second: int, latest: int) -> ConsistencyProof:
    """The proof that the tree of `second` leaves extends the tree of `first`."""
    if not 1 <= first <= second <= latest:
        raise ProofOutOfRange("the sizes must be 1 <= first <= second <= the latest note's")
    if first < chain.anchor().seq:
        raise ProofPruned("retention deleted the tree nodes of that size")
    hashes = _read(chain, lambda node_at: consistency_proof(first, second, node_at), latest)
    return ConsistencyProof(first, second, hashes)


def _read(chain: EvidenceChain, make: Callable[[NodeAt], list[bytes]], latest: int) -> list[bytes]:
    """The proof `make` computes from the chain's stored nodes, read in one pass (the tiles
    complete in the tree of the latest note's size as tiles)."""
    tree = StoredTree(chain.lanes, chain.name)
    if not tree.present():
        raise TreeUnavailable()
    try:
        return tree.read_through(make, holds=latest)
    except TreeNodeMissing:
        raise TreeUnavailable() from None
