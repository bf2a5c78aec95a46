"""A chain's Merkle tree as stored: complete-subtree nodes, and the heads and proofs built from them.

Leaf i (0-based) of a chain's tree is the entry with seq i+1, hashed from its
stored RFC 8785 bytes (`entry_leaf`); hashing is RFC 6962 (`store.chain.rfc9162`).
What is stored is every *complete* subtree's hash, as C2SP tlog-tiles numbers
them: node (level L, index K) is the root of leaves [K*2^L, (K+1)*2^L). A node
is written once, when its last leaf is appended, and never changes; level 0
holds the leaf hashes, so a proof never reads an entry. A tree of n leaves
holds fewer than 2n nodes of 32 bytes.

Everything here is pure: nodes are read through a `node_at(level, index)`
callback and handed back to be written, so the journal can put them in the
batch that writes their entries. The costs, in nodes, for a tree of n leaves:

- `appended`: one append writes the leaf and each subtree it completes
  (1 + the trailing one bits of n: at most log2(n) + 1) and reads each of their
  left halves but the leaf (at most log2(n));
- `root` of any size <= n: one read per one bit of the size;
- `inclusion_proof`, `consistency_proof` for any sizes <= n: one read per
  complete-subtree hash of the proof, and for the one hash of a proof that
  covers a ragged right edge, one read per complete subtree of it: at most
  2*log2(n) + 1 reads in all, and no hashing beyond folding that one hash.

Single nodes, and complete tiles beside them: an append writes its few 32-byte
nodes (a tile is not final until its last leaf, and rewriting a growing one would
cost up to 16 KiB an append); a complete tile is written whole, once, when the note
that covers it is signed (`store.chain.tree_tiles`), so that a proof reads one value
for each 8 levels a complete tile covers instead of one key a node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from store.chain.rfc9162 import EMPTY_ROOT, leaf_hash, node_hash

NodeAt = Callable[[int, int], bytes]  # (level, index) -> the stored node's 32 bytes
INDEX_BYTES = 8  # a node's index in its key name, big-endian


class NodeId(NamedTuple):
    """A complete subtree: the root of leaves [position * 2**level, (position + 1) * 2**level)
    (tlog-tiles' node index; `index` is a tuple's method)."""

    level: int
    position: int


def node_name(node: NodeId) -> bytes:
    """A node's key name: its level (one byte), then its index (8 bytes, big-endian), so a
    level's nodes are contiguous and in index order (a range scan for a tile, a range
    delete for retention)."""
    return bytes([node.level]) + node.position.to_bytes(INDEX_BYTES, "big")


def entry_leaf(stored: bytes) -> bytes:
    """The leaf hash of a chain entry, from its stored (RFC 8785) bytes."""
    return leaf_hash(stored)


def appended(size: int, leaf: bytes, node_at: NodeAt) -> list[tuple[NodeId, bytes]]:
    """The nodes to store when the leaf of hash `leaf` is appended to a tree of `size`
    leaves: the leaf itself and every subtree it completes, lowest first."""
    nodes = [(NodeId(0, size), leaf)]
    level, index, hash_ = 0, size, leaf
    while index & 1:  # the new node is a right child: its parent is complete now
        hash_ = node_hash(node_at(level, index - 1), hash_)
        level, index = level + 1, index >> 1
        nodes.append((NodeId(level, index), hash_))
    return nodes


def appended_all(size: int, leaves: Iterable[bytes], node_at: NodeAt) -> dict[NodeId, bytes]:
    """The nodes to store when leaves are appended in order to a tree of `size` leaves (one
    batch): what the batch itself completes is read from the batch, not the store."""
    written: dict[NodeId, bytes] = {}

    def batch_or_store(level: int, index: int) -> bytes:
        found = written.get(NodeId(level, index))
        return found if found is not None else node_at(level, index)

    for offset, leaf in enumerate(leaves):
        written.update(appended(size + offset, leaf, batch_or_store))
    return written


def root(size: int, node_at: NodeAt) -> bytes:
    """MTH of the first `size` leaves: the tree head of that size."""
    if size < 0:
        raise ValueError("a tree size is at least 0")
    return _range_hash(0, size, node_at) if size else EMPTY_ROOT


def inclusion_proof(index: int, size: int, node_at: NodeAt) -> list[bytes]:
    """PATH(index, D[size]) (RFC 9162 2.1.3.1): the audit path of leaf `index` in the tree of
    `size` leaves, from the leaf's sibling up."""
    if not 0 <= index < size:
        raise ValueError("the leaf index must be below the tree size")
    path: list[bytes] = []
    begin, end = 0, size
    while end - begin > 1:
        split = begin + _largest_power_below(end - begin)
        if index < split:
            path.append(_range_hash(split, end, node_at))
            end = split
        else:
            path.append(_range_hash(begin, split, node_at))
            begin = split
    path.reverse()
    return path


def consistency_proof(first: int, second: int, node_at: NodeAt) -> list[bytes]:
    """PROOF(first, D[second]) (RFC 9162 2.1.4.1): the hashes that show the tree of `second`
    leaves extends the tree of `first`. A proof from the empty tree proves nothing: first
    must be at least 1."""
    if not 0 < first <= second:
        raise ValueError("the sizes must be 0 < first <= second")
    proof: list[bytes] = []
    begin, end, whole = 0, second, True  # whole: SUBPROOF's b, still the whole old tree
    while first != end:
        split = begin + _largest_power_below(end - begin)
        if first <= split:
            proof.append(_range_hash(split, end, node_at))
            end = split
        else:
            proof.append(_range_hash(begin, split, node_at))
            begin, whole = split, False
    if not whole:
        proof.append(_range_hash(begin, end, node_at))
    proof.reverse()
    return proof


def _largest_power_below(n: int) -> int:
    """The largest power of 2 smaller than n (n >= 2): where RFC 6962 splits n leaves."""
    return 1 << ((n - 1).bit_length() - 1)


def _range_hash(begin: int, end: int, node_at: NodeAt) -> bytes:
    """MTH(D[begin:end]) for a range RFC 6962's recursion makes (begin a multiple of the
    largest power of 2 not above end - begin): its complete subtrees, largest first, folded
    from the right."""
    subtrees = []
    while begin < end:
        level = (end - begin).bit_length() - 1
        subtrees.append((level, begin >> level))
        begin += 1 << level
    hash_ = node_at(*subtrees.pop())
    while subtrees:
        hash_ = node_hash(node_at(*subtrees.pop()), hash_)
    return hash_
