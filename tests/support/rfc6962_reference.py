"""The tests' own RFC 6962 Merkle tree, straight from section 2.1 of the RFC: MTH, PATH
and PROOF as the recursive definitions read, over a whole list of leaves in memory.

It is a reference for checking the formats, the outside tools (what
`logcheck` and litewitness accept) and the log's own tree against; that one is stored and built
incrementally elsewhere. Clear over fast: each call rehashes the leaves it covers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def leaf_hash(leaf: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + leaf).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """k, the largest power of two smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def mth(leaves: Sequence[bytes]) -> bytes:
    """MTH(D[n]), the Merkle tree hash."""
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return leaf_hash(leaves[0])
    k = _split(n)
    return _node(mth(leaves[:k]), mth(leaves[k:]))


def path(m: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PATH(m, D[n]), the audit path of leaf m, leaf side first."""
    n = len(leaves)
    if n == 1:
        return []
    k = _split(n)
    if m < k:
        return [*path(m, leaves[:k]), mth(leaves[k:])]
    return [*path(m - k, leaves[k:]), mth(leaves[:k])]


def proof(m: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PROOF(m, D[n]), the consistency proof from the first m leaves to all n (0 < m <= n)."""
    return _subproof(m, leaves, True)


def _subproof(m: int, leaves: Sequence[bytes], whole: bool) -> list[bytes]:
    n = len(leaves)
    if m == n:
        return [] if whole else [mth(leaves)]
    k = _split(n)
    if m <= k:
        return [*_subproof(m, leaves[:k], whole), mth(leaves[k:])]
    return [*_subproof(m - k, leaves[k:], False), mth(leaves[:k])]
