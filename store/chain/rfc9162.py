"""RFC 9162 Merkle tree hashing and proof verification, with Python's standard library alone.

What a reviewer needs to check a tree head, an inclusion proof or a consistency
proof, and nothing the log's storage needs: the hashes of RFC 6962 / RFC 9162
section 2.1 (a leaf is SHA-256 of 0x00 then its bytes, a node SHA-256 of 0x01,
left, right; the empty tree's root is SHA-256 of nothing) and the verification
algorithms of sections 2.1.3.2 and 2.1.4.2, step for step as the RFC writes
them. This module imports nothing but `hashlib` and runs on Python 3.8, so the
offline bundle verifier can ship it as it is; building trees and proofs is
`store.chain.merkle_tree`.

Where the RFC leaves a case open, the answer is the one of
`github.com/transparency-dev/merkle`'s `proof` package (whose published test
vectors tests/chain/test_merkle_vectors.py runs): a consistency proof from the
empty tree proves nothing, so none verifies. One answer is stricter than
theirs: every hash, roots included, must be 32 bytes (they compare any two
roots of equal sizes byte for byte).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()  # MTH({}), the root of the tree of no leaves


def leaf_hash(data: bytes) -> bytes:
    """MTH({d}) = SHA-256(0x00 || d): the hash of one leaf."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right): the hash of an interior node."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def verify_inclusion(
    leaf_index: int, tree_size: int, leaf: bytes, proof: Sequence[bytes], root: bytes
) -> bool:
    """Whether proof shows the leaf of hash `leaf` at leaf_index in the tree of tree_size
    leaves whose root is `root` (RFC 9162 2.1.3.2)."""
    if not 0 <= leaf_index < tree_size or not _hashes(leaf, root, *proof):
        return False
    fn, sn, r = leaf_index, tree_size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while not (fn & 1 or fn == 0):
                    fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def verify_consistency(
    first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]
) -> bool:
    """Whether proof shows the tree of `second` leaves with root second_root extends the tree
    of `first` leaves with root first_root (RFC 9162 2.1.4.2)."""
    if not 0 < first <= second or not _hashes(first_root, second_root, *proof):
        return False
    if first == second:
        return not proof and first_root == second_root
    if not proof:
        return False
    path = list(proof)
    if first & (first - 1) == 0:  # an exact power of 2: the old root is a node of the new tree
        path.insert(0, first_root)
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            if not fn & 1:
                while not (fn & 1 or fn == 0):
                    fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == first_root and sr == second_root


def _hashes(*values: bytes) -> bool:
    return all(isinstance(value, bytes) and len(value) == HASH_SIZE for value in values)
