"""The tests' own reference Merkle tree: RFC 6962 section 2.1 written out word for word.

MTH, PATH and PROOF/SUBPROOF exactly as the RFC defines them, recursively over the
whole list of leaf inputs, with nothing stored and nothing of the service's code (not
even its hashing): slow and obviously right, so the stored tree's heads and proofs
(`store.chain.merkle_tree`) can be compared with it. Not for use outside the tests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def _leaf(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _k(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(d: Sequence[bytes]) -> bytes:
    """MTH(D[n]): the Merkle Tree Hash of the leaf inputs d."""
    n = len(d)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return _leaf(d[0])
    k = _k(n)
    return _node(mth(d[:k]), mth(d[k:]))


def path(m: int, d: Sequence[bytes]) -> list[bytes]:
    """PATH(m, D[n]): the audit path of leaf m."""
    n = len(d)
    if n == 1:
        return []
    k = _k(n)
    if m < k:
        return [*path(m, d[:k]), mth(d[k:])]
    return [*path(m - k, d[k:]), mth(d[:k])]


def proof(m: int, d: Sequence[bytes]) -> list[bytes]:
    """PROOF(m, D[n]): the consistency proof of the tree of the first m leaves."""
    return _subproof(m, d, True)


def _subproof(m: int, d: Sequence[bytes], b: bool) -> list[bytes]:
    n = len(d)
    if m == n:
        return [] if b else [mth(d)]
    k = _k(n)
    if m <= k:
        return [*_subproof(m, d[:k], b), mth(d[k:])]
    return [*_subproof(m - k, d[k:], False), mth(d[:k])]
