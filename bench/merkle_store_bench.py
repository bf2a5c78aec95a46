"""The decision log's Merkle tree on the real store (LevelDB): what it adds to an append, and
how a proof's cost grows with the log.

**Append.** A chain of the service's own write-decision entries (`decision_log_bench`'s
shape, its full policy input) is appended in batches of B, as the journal does: one
`ChainExtension` after the cached head and the tree frontier kept with it
(`store.chain.tree_frontier`), one LevelDB batch each. With the tree, the batch holds the
nodes the entries add (hashed on the kept frontier: no read); without it, the chain's
`tree_key` is deleted after its first batch, so appends add no node (what a chain written
before trees does). Both run in the same process, in
fresh databases, alternately, `--repeat` times; the figure is the median of the CPU time
per entry (`time.process_time`: other work on the machine does not count) and the ratio
with/without (goal: at most 1.2). Batches are unsynced unless `--sync`: a synced batch's
fsync would hide the tree's CPU behind the disk. Each chain verifies afterwards, or the
bench stops.

**Proofs.** One chain's tree is built in the store up to each size (nodes only, from
fake entries: the entries themselves are not read by a proof), and at each size
`--proofs` inclusion and consistency proofs of random leaves and sizes are asked through
`store.chain.log_proofs` (what the routes call), timed wall and CPU (`time.thread_time`:
the proof's own thread, not LevelDB's compaction thread; the database is compacted after
each build, and as many proofs of other random leaves and sizes are asked untimed first,
so that neither kind is timed on the other's cold cache), with the keys they read and
the passes they read them in counted. The proofs are asked in `--rounds` rounds of fresh
random asks, the kinds taking turns, and each kind's figure is its round of median CPU:
one round's figure moves by more than the goal's margin from run to run. A sample of each is checked by the standard-library verifiers
(`store.chain.rfc9162`) outside the timing. The ratio of the largest size's mean to the
smallest's is the growth (goal: at most 1.5 from 10k to 1M; the reads alone grow with
log2 n, 20/13.3 = 1.5).

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
from store.chain.tree_store import StoredTree
from tests.support.counting_lanes import CountingLanes

CHAIN = "tenant-a"
APPEND_GOAL, PROOF_GOAL = 1.2, 1.5
BUILD_BATCH = 4096  # fake leaves per batch while a proof tree is built


def append_run(
    folder: Path, bodies: list[dict[str, Any]], batch: int, tree: bool, sync: bool
) -> float:
    """CPU microseconds per entry of appending bodies in batches of `batch`."""
    lanes = LevelDBLaneStore(folder)
    try:
        chain = EvidenceChain(lanes, CHAIN)
        chain.append(bodies[:1])  # the chain's first entry: its marker and tree_key
        if not tree:
            with lanes.batch(sync=True) as dropping:
                dropping.delete(tree_key(CHAIN))
        head, frontier = chain.head(), None
        started = time.process_time()
        for at in range(1, len(bodies), batch):
            extension = chain.extension(after=head, known=frontier)
            extension.seal(bodies[at : at + batch])
            with lanes.batch(sync=sync) as written:
                extension.add_to(written)
            head, frontier = extension.head, extension.frontier
        spent = time.process_time() - started
        outcome = chain.verify()
        if not outcome.ok or outcome.entries != len(bodies):
            sys.exit(f"merkle_store_bench: the chain does not verify ({outcome.problem})")
        if tree and StoredTree(lanes, CHAIN).present():
            nodes = StoredTree(lanes, CHAIN).node_at
            assert root(len(bodies), nodes)  # every node the root needs was written
    finally:
        lanes.close()
    return 1e6 * spent / (len(bodies) - 1)


def append_figures(tmp: Path, args: argparse.Namespace) -> list[tuple[int, float, float]]:
    """(batch, with us/entry, without us/entry), medians of alternating runs."""
    template = write_body()
    bodies = [sealable(template) for _ in range(args.entries)]
    rows = []
    for batch in args.batch:
        runs: dict[bool, list[float]] = {True: [], False: []}
        for repeat in range(args.repeat):
            for tree in (repeat % 2 == 0, repeat % 2 == 1):  # alternate which goes first
                folder = tmp / f"append-{batch}-{repeat}-{tree}"
                runs[tree].append(append_run(folder, bodies, batch, tree, args.sync))
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


def proofs_at(
    chain: EvidenceChain,
    counting: CountingLanes,
    size: int,
    count: int,
    rng: random.Random,
    rounds: int = 5,
) -> dict[str, Figures]:
    """Inclusion and consistency proofs of random leaves and sizes up to `size`, timed in
    `rounds` rounds of fresh asks, the two kinds taking turns; the round of median CPU."""
    for tree_size in [rng.randint(2, size) for _ in range(count)]:  # warm up, untimed
        seq = rng.randint(1, tree_size)
        inclusion(chain, seq, fake_entry(seq), tree_size, size)
        consistency(chain, seq, tree_size, size)
    runs: dict[str, list[Figures]] = {"inclusion": [], "consistency": []}
    for _ in range(rounds):
        pairs = _asks(rng, size, max(1, count // rounds))
        runs["inclusion"].append(
            timed(
                counting,
                [lambda s=s, q=q: inclusion(chain, q, fake_entry(q), s, size) for s, q in pairs],
            )
        )
        runs["consistency"].append(
            timed(counting, [lambda s=s, f=f: consistency(chain, f, s, size) for s, f in pairs])
        )
    figures = {
        kind: sorted(values, key=lambda f: f[1])[len(values) // 2] for kind, values in runs.items()
    }
    pairs = _asks(rng, size, 50)
    nodes = StoredTree(counting._lanes, CHAIN).node_at  # checked, not timed
    for tree_size, seq in pairs:
        head = root(tree_size, nodes)
        proof = inclusion(chain, seq, fake_entry(seq), tree_size, size)
        assert verify_inclusion(seq - 1, tree_size, entry_leaf(fake_entry(seq)), proof.hashes, head)
        extends = consistency(chain, seq, tree_size, size)
        assert verify_consistency(seq, tree_size, root(seq, nodes), head, extends.hashes)
    return figures


def _asks(rng: random.Random, size: int, count: int) -> list[tuple[int, int]]:
    """(tree size, leaf seq or first size) pairs, at random up to `size`."""
    sizes = [rng.randint(2, size) for _ in range(count)]
    return [(tree_size, rng.randint(1, tree_size)) for tree_size in sizes]


def proof_figures(tmp: Path, args: argparse.Namespace) -> list[tuple[int, dict[str, Figures]]]:
    lanes = LevelDBLaneStore(tmp / "proofs")
    rng, rows, size = random.Random(30), [], 0
    try:
        with lanes.batch(sync=True) as batch:
            batch.put(tree_key(CHAIN), b"")
        counting = CountingLanes(lanes)
        chain = EvidenceChain(counting, CHAIN)  # type: ignore[arg-type]
        for target in sorted(args.sizes):
            grow(lanes, size, target)
            size = target
            settle(lanes)
            rows.append((size, proofs_at(chain, counting, size, args.proofs, rng, args.rounds)))
    finally:
        lanes.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=20_000, help="appended per run")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32], help="entries per batch")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, alternating")
    parser.add_argument("--sync", action="store_true", help="synced batches (fsync each)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--proofs", type=int, default=2000, help="of each kind, at each size")
    parser.add_argument("--rounds", type=int, default=5, help="the proofs split in rounds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        appends = append_figures(Path(tmp), args)
        proofs = proof_figures(Path(tmp), args)
    synced = "synced" if args.sync else "unsynced"
    print(
        f"append: {args.entries} write-decision entries a run, {synced} batches, CPU us/entry, median of {args.repeat}; every chain verified"
    )
    print(f"{'batch':>6}{'with tree':>12}{'without':>10}{'ratio':>8}  goal <= {APPEND_GOAL}")
    for batch, with_tree, without in appends:
        print(f"{batch:>6}{with_tree:>12.1f}{without:>10.1f}{with_tree / without:>8.2f}")
    print(
        f"proofs: {args.proofs} of each kind at each size in {args.rounds} rounds, through "
        "store.chain.log_proofs on LevelDB; mean per proof, the round of median CPU"
    )
    print(f"{'size':>10}{'kind':>13}{'wall us':>10}{'CPU us':>9}{'keys':>7}{'passes':>8}")
    for size, figures in proofs:
        for kind, (wall, cpu, keys, passes) in figures.items():
            print(f"{size:>10,}{kind:>13}{wall:>10.1f}{cpu:>9.1f}{keys:>7.1f}{passes:>8.1f}")
    (first, low), (last, high) = proofs[0], proofs[-1]
    for kind in low:
        growth = high[kind][1] / low[kind][1]
        print(f"{kind} CPU growth {first:,} -> {last:,}: {growth:.2f}x  goal <= {PROOF_GOAL}")


if __name__ == "__main__":
    main()
