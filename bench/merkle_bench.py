"""The Merkle tree's own cost (`store.chain.merkle_tree`), with no store under it: a dict.

One tree grows by appending leaves one at a time into a dict keyed by node (as the
journal would, one `appended` per entry), up to each size asked; at each size it
prints the append rate since the last size, then, over random leaves and sizes up to
it, the time and the node reads of one head (`root`), one inclusion proof and one
consistency proof (mean, and the most reads any one needed), each proof checked by the
standard-library verifiers (`store.chain.rfc9162`) outside the timing. Times are the
process's CPU time (`time.process_time`), so other work on a shared machine does not
count as the tree's (the cache misses of a bigger dict still do). A proof's reads grow
with log2 of the size: from ten thousand leaves to a million, by at most 20/13.3 = 1.5x.
Run: `.venv/bin/python bench/merkle_bench.py [--sizes 10000 100000 1000000] [--proofs 2000]`.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store.chain.merkle_tree import (
    NodeId,
    appended,
    consistency_proof,
    entry_leaf,
    inclusion_proof,
    root,
)
from store.chain.rfc9162 import verify_consistency, verify_inclusion


class DictNodes:
    """The nodes of one tree in a dict, counting reads."""

    def __init__(self) -> None:
        self.stored: dict[NodeId, bytes] = {}
        self.size = 0
        self.reads = 0

    def node_at(self, level: int, position: int) -> bytes:
        self.reads += 1
        return self.stored[NodeId(level, position)]

    def grow_to(self, size: int) -> float:
        """Appends leaves up to size; the CPU seconds it took."""
        started = time.process_time()
        while self.size < size:
            leaf = entry_leaf(b'{"seq":%d}' % (self.size + 1))
            self.stored.update(appended(self.size, leaf, self.node_at))
            self.size += 1
        return time.process_time() - started


def measure(nodes: DictNodes, asks: list[Callable[[], object]]) -> tuple[float, float, int]:
    """Mean CPU microseconds and reads of one call, and the most reads one call made."""
    reads, most = 0, 0
    started = time.process_time()
    for ask in asks:
        nodes.reads = 0
        ask()
        reads, most = reads + nodes.reads, max(most, nodes.reads)
    return 1e6 * (time.process_time() - started) / len(asks), reads / len(asks), most


def proofs_at(nodes: DictNodes, count: int, rng: random.Random) -> None:
    """Times heads, inclusion and consistency proofs of random sizes up to the tree's."""
    at = nodes.node_at
    sizes = [rng.randint(2, nodes.size) for _ in range(count)]
    pairs = [(size, rng.randrange(size)) for size in sizes]  # (tree size, leaf or first size)
    kinds: dict[str, list[Callable[[], object]]] = {
        "root": [partial(root, s, at) for s in sizes],
        "inclusion": [partial(inclusion_proof, i, s, at) for s, i in pairs],
        "consistency": [partial(consistency_proof, f + 1, s, at) for s, f in pairs],
    }
    for kind, asks in kinds.items():
        mean_us, mean_reads, most = measure(nodes, asks)
        print(f"  {kind:<12} {mean_us:8.1f} us   reads {mean_reads:5.1f} mean, {most:3d} most")
    for size, other in pairs[:100]:  # checked, not timed
        head = root(size, at)
        leaf = at(0, other)
        assert verify_inclusion(other, size, leaf, inclusion_proof(other, size, at), head)
        proof = consistency_proof(other + 1, size, at)
        assert verify_consistency(other + 1, size, root(other + 1, at), head, proof)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--proofs", type=int, default=2000, help="of each kind, at each size")
    args = parser.parse_args()
    nodes, rng = DictNodes(), random.Random(30)
    for size in sorted(args.sizes):
        appending = nodes.size
        seconds = nodes.grow_to(size)
        added = nodes.size - appending
        print(
            f"{size:,} leaves ({len(nodes.stored):,} nodes): appended {added:,} in {seconds:.2f} s CPU,"
            f" {added / seconds:,.0f} leaves/s, {1e6 * seconds / added:.1f} us each"
        )
        proofs_at(nodes, args.proofs, rng)


if __name__ == "__main__":
    main()
