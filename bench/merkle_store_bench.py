"""The decision log's Merkle tree on the real store (LevelDB): what it adds to an append, and
how a proof's cost grows with the log.

**Append.** A chain of the service's own write-decision entries (`decision_log_bench`'s
shape, its full policy input) is appended in batches of B, as the journal does: one
`ChainExtension` after the cached head and the tree frontier kept with it
(`store.chain.tree_frontier`), one LevelDB batch each. With the tree, the batch holds the
nodes the entries add (hashed on the kept frontier: no read); without it, the chain's
`tree_key` is deleted after its first batch, so appends add no node (what a chain written
before trees does). The two chains, each in a fresh database, are appended batch by batch
in turn (which goes first alternating), so that whatever else the machine does weighs on
both alike; the figure is the appending thread's CPU per entry (`time.thread_time`: not
LevelDB's compaction thread, which serves both databases and cannot be told apart), the
median of `--repeat` runs, and the ratio with/without (goal: at most 1.2). Batches are
unsynced unless `--sync`: a synced batch's fsync would hide the tree's CPU behind the
disk. Each chain verifies afterwards, or the bench stops.

**Proofs.** One chain's tree is built up to each size, each in its own database (nodes
and tiles only, from fake entries: the entries themselves are not read by a proof), and
compacted. Then `--proofs` inclusion and consistency proofs of random leaves and sizes
are asked of each size through `store.chain.log_proofs` (what the routes call), untimed
first (so that no kind is timed on a cold cache), then again in `--rounds` rounds of
fresh random asks, each round asking every size in turn, so that what the machine does
meanwhile weighs on all sizes alike (one round's figure moves by more than the goal's
margin from one minute to the next on a shared machine). Each is timed wall and CPU
(`time.thread_time`: the proof's own thread), with the keys read and the passes they are
read in counted; each size's figure is its fastest round (what the proof costs when
nothing else takes the CPU's caches or cycles: as `timeit` reports the least of its
runs), beside its median round. A sample of each kind is
checked by the standard-library verifiers (`store.chain.rfc9162`) outside the timing.
The ratio of the largest size's CPU to the smallest's is the growth (goal: at most 1.5
from 10k to 1M: the proof itself grows with log2 n, 20/13.3 = 1.5 hashes).

Run: `.venv/bin/python bench/merkle_store_bench.py [--entries 20000] [--batch 1 32]
[--sizes 10000 100000 1000000] [--proofs 2000] [--repeat 3] [--sync]`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.decision_log_bench import sealable, write_body
from store.backends.leveldb import LevelDBLaneStore
from store.chain.evidence import EvidenceChain
from store.chain.keys import tree_key
from store.chain.log_proofs import consistency, inclusion
from store.chain.merkle_tree import entry_leaf, root
from store.chain.rfc9162 import verify_consistency, verify_inclusion
from store.chain.tree_frontier import TreeFrontier
from store.chain.tree_store import StoredTree
from store.chain.tree_tiles import completed_tiles
from tests.support.counting_lanes import CountingLanes

CHAIN = "tenant-a"
APPEND_GOAL, PROOF_GOAL = 1.2, 1.5
BUILD_BATCH = 4096  # fake leaves per batch while a proof tree is built


class Appender:
    """One chain in its own fresh database, appended to batch by batch as the journal does
    (after the head and the tree frontier it kept), counting the appending thread's CPU."""

    def __init__(self, folder: Path, first: dict[str, Any], tree: bool, sync: bool) -> None:
        self.lanes = LevelDBLaneStore(folder)
        self.chain = EvidenceChain(self.lanes, CHAIN)
        self.chain.append([first])  # the chain's first entry: its marker and tree_key
        if not tree:
            with self.lanes.batch(sync=True) as dropping:
                dropping.delete(tree_key(CHAIN))
        self.head = self.chain.head()
        self.frontier: TreeFrontier | None = None  # the journal's kept frontier
        self.sync, self.cpu, self.entries = sync, 0.0, 1

    def append(self, bodies: list[dict[str, Any]]) -> None:
        started = time.thread_time()
        extension = self.chain.extension(after=self.head, known=self.frontier)
        extension.seal(bodies)
        with self.lanes.batch(sync=self.sync) as written:
            extension.add_to(written)
        self.head, self.frontier = extension.head, extension.frontier
        self.cpu += time.thread_time() - started
        self.entries += len(bodies)

    def checked(self) -> float:
        """CPU microseconds per appended entry, once the chain verifies and, with a tree,
        its root reads; then the database is closed."""
        try:
            outcome = self.chain.verify()
            if not outcome.ok or outcome.entries != self.entries:
                sys.exit(f"merkle_store_bench: the chain does not verify ({outcome.problem})")
            tree = StoredTree(self.lanes, CHAIN)
            if tree.present():
                assert root(self.entries, tree.node_at)  # every node the root needs is there
        finally:
            self.lanes.close()
        return 1e6 * self.cpu / (self.entries - 1)


def append_figures(tmp: Path, args: argparse.Namespace) -> list[tuple[int, float, float]]:
    """(batch, with us/entry, without us/entry): the two chains appended batch by batch in
    turn (which goes first alternating), so that what else the machine does weighs on
    both; medians of `--repeat` runs."""
    template = write_body()
    bodies = [sealable(template) for _ in range(args.entries)]
    rows = []
    for batch in args.batch:
        runs: dict[bool, list[float]] = {True: [], False: []}
        for repeat in range(args.repeat):
            pair = {
                tree: Appender(tmp / f"append-{batch}-{repeat}-{tree}", bodies[0], tree, args.sync)
                for tree in (True, False)
            }
            for turn, at in enumerate(range(1, len(bodies), batch)):
                for tree in (turn % 2 == 0, turn % 2 == 1):
                    pair[tree].append(bodies[at : at + batch])
            for tree, appender in pair.items():
                runs[tree].append(appender.checked())
        rows.append((batch, statistics.median(runs[True]), statistics.median(runs[False])))
    return rows


def fake_entry(seq: int) -> bytes:
    return b'{"seq":%d}' % seq


def grow(lanes: LevelDBLaneStore, size: int, to: int) -> None:
    """Build the tree's nodes from `size` leaves to `to` in the store."""
    tree = StoredTree(lanes, CHAIN)
    while size < to:
        count = min(BUILD_BATCH, to - size)
        nodes = tree.appended(size, (fake_entry(seq) for seq in range(size + 1, size + count + 1)))
        with lanes.batch(sync=False) as batch:
            tree.put(batch, nodes)
            tree.put_tiles(batch, completed_tiles(nodes), nodes)  # as the note's signing does
        size += count


Figures = tuple[float, float, float, float]


def settle(lanes: LevelDBLaneStore) -> None:
    """Compact the whole database: a bulk build leaves LevelDB compacting in the background,
    which would be timed with the proofs asked meanwhile."""
    with lanes._reading() as db:
        db.compact_range()


def timed(counting: CountingLanes, asks: list[Callable[[], object]]) -> Figures:
    """Mean wall and CPU microseconds of one ask, and the mean keys read and passes."""
    counting.got = counting.passes = 0
    wall, cpu = time.perf_counter(), time.thread_time()
    for ask in asks:
        ask()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    count = len(asks)
    return 1e6 * wall / count, 1e6 * cpu / count, counting.got / count, counting.passes / count


class ProofTree:
    """One chain's tree of `size` leaves in its own database (nodes only, from fake entries),
    compacted, and the figures of the rounds of proofs asked of it."""

    def __init__(self, folder: Path, size: int) -> None:
        self.size = size
        self.lanes = LevelDBLaneStore(folder)
        with self.lanes.batch(sync=True) as batch:
            batch.put(tree_key(CHAIN), b"")
        grow(self.lanes, 0, size)
        settle(self.lanes)
        self.counting = CountingLanes(self.lanes)
        self.chain = EvidenceChain(self.counting, CHAIN)
        self.rounds: dict[str, list[Figures]] = {"inclusion": [], "consistency": []}

    def inclusion(self, tree_size: int, seq: int) -> None:
        inclusion(self.chain, seq, fake_entry(seq), tree_size, self.size)

    def consistency(self, second: int, first: int) -> None:
        consistency(self.chain, first, second, self.size)

    def warm(self, rng: random.Random, count: int) -> None:
        """As many proofs of other random leaves and sizes, untimed."""
        for tree_size, seq in _asks(rng, self.size, count):
            self.inclusion(tree_size, seq)
            self.consistency(tree_size, seq)

    def round(self, rng: random.Random, count: int) -> None:
        """One round: `count` fresh random asks of each kind, timed."""
        pairs = _asks(rng, self.size, count)
        for kind, ask in (("inclusion", self.inclusion), ("consistency", self.consistency)):
            asks: list[Callable[[], object]] = [partial(ask, s, q) for s, q in pairs]
            self.rounds[kind].append(timed(self.counting, asks))

    def check(self, rng: random.Random) -> None:
        """A sample of each kind checked by the standard-library verifiers, untimed."""
        nodes = StoredTree(self.lanes, CHAIN).node_at
        for tree_size, seq in _asks(rng, self.size, 50):
            head = root(tree_size, nodes)
            proof = inclusion(self.chain, seq, fake_entry(seq), tree_size, self.size)
            leaf = entry_leaf(fake_entry(seq))
            assert verify_inclusion(seq - 1, tree_size, leaf, proof.hashes, head)
            extends = consistency(self.chain, seq, tree_size, self.size)
            assert verify_consistency(seq, tree_size, root(seq, nodes), head, extends.hashes)

    def figures(self) -> dict[str, tuple[Figures, float]]:
        """Each kind's fastest round (by CPU), and its median round's CPU."""
        found = {}
        for kind, values in self.rounds.items():
            ranked = sorted(values, key=lambda f: f[1])
            found[kind] = ranked[0], ranked[len(ranked) // 2][1]
        return found


def _asks(rng: random.Random, size: int, count: int) -> list[tuple[int, int]]:
    """(tree size, leaf seq or first size) pairs, at random up to `size`."""
    sizes = [rng.randint(2, size) for _ in range(count)]
    return [(tree_size, rng.randint(1, tree_size)) for tree_size in sizes]


def proof_figures(
    tmp: Path, args: argparse.Namespace
) -> list[tuple[int, dict[str, tuple[Figures, float]]]]:
    """Every size's tree built first; then the rounds, each asking every size in turn, so
    that what else the machine does meanwhile weighs on all sizes alike."""
    rng = random.Random(30)
    trees = [ProofTree(tmp / f"proofs-{size}", size) for size in sorted(args.sizes)]
    try:
        for tree in trees:
            tree.warm(rng, args.proofs)
        for _ in range(args.rounds):
            for tree in trees:
                tree.round(rng, max(1, args.proofs // args.rounds))
        for tree in trees:
            tree.check(rng)
        return [(tree.size, tree.figures()) for tree in trees]
    finally:
        for tree in trees:
            tree.lanes.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=20_000, help="appended per run")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32], help="entries per batch")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each pair")
    parser.add_argument("--sync", action="store_true", help="synced batches (fsync each)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--proofs", type=int, default=2000, help="of each kind, at each size")
    parser.add_argument("--rounds", type=int, default=15, help="the proofs split in rounds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        appends = append_figures(Path(tmp), args)
        proofs = proof_figures(Path(tmp), args)
    synced = "synced" if args.sync else "unsynced"
    print(
        f"append: {args.entries} write-decision entries a run, {synced} batches, CPU us/entry, median of {args.repeat}, the chains in turn; every chain verified"
    )
    print(f"{'batch':>6}{'with tree':>12}{'without':>10}{'ratio':>8}  goal <= {APPEND_GOAL}")
    for batch, with_tree, without in appends:
        print(f"{batch:>6}{with_tree:>12.1f}{without:>10.1f}{with_tree / without:>8.2f}")
    print(
        f"proofs: {args.proofs} of each kind at each size in {args.rounds} rounds across the "
        "sizes, through store.chain.log_proofs on LevelDB; mean per proof in the fastest round "
        "(and the median round's CPU)"
    )
    print(
        f"{'size':>10}{'kind':>13}{'wall us':>10}{'CPU us':>9}{'median':>9}{'keys':>7}{'passes':>8}"
    )
    for size, figures in proofs:
        for kind, ((wall, cpu, keys, passes), median) in figures.items():
            print(
                f"{size:>10,}{kind:>13}{wall:>10.1f}{cpu:>9.1f}{median:>9.1f}{keys:>7.1f}{passes:>8.1f}"
            )
    (first, low), (last, high) = proofs[0], proofs[-1]
    for kind in low:
        growth = high[kind][0][1] / low[kind][0][1]
        median = high[kind][1] / low[kind][1]
        print(
            f"{kind} CPU growth {first:,} -> {last:,}: {growth:.2f}x (median rounds "
            f"{median:.2f}x)  goal <= {PROOF_GOAL}"
        )


if __name__ == "__main__":
    main()
