"""Decision-log throughput: group commit beside one synced write per entry, in the same run.

T threads each append a fixed number of decision entries, shaped like the
service's own (`entry_body` of a write decision with its full policy input).
Group commit is `DecisionJournal.record` (one committer thread, many entries
per synced batch, with their index keys). The baseline is
`EvidenceChain.append([body])` per entry: one synced batch each, serialised by
the chain's lock. Each figure has a fresh database, and each chain must verify
afterwards with every entry on it, or the bench stops. Prints entries/s, their
ratio, the journal's average batch size, and p50/p99 latency of one call; and,
as the ceiling of the one committer thread, how fast `seal` alone runs (no disk).
Run: `.venv/bin/python bench/decision_log_bench.py [--entries 2000] [--threads 1 4 16 64]`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.auth.tokens import Actor
from service.decisions.journal import DecisionJournal
from service.decisions.log import DecisionEntryBody, DecisionOutcome, entry_body
from service.policy.client import EncodedInput
from service.policy.trace import DecisionEngine, DecisionTrace
from store.backends.leveldb import LevelDBLaneStore
from store.canonical import canonical_digest, canonical_json
from store.chain.entry import seal
from store.chain.evidence import EvidenceChain
from store.chain.head import GENESIS, format_timestamp
from tests.support.policy_inputs import allowed_input

WARM_UP = 16  # entries written before the clock starts: the first sync creates files


WRITTEN = DecisionOutcome(status=201, applied=True, approval_id=None)


def write_body() -> DecisionEntryBody:
    """An allowed, applied write's entry body, before the chain seals and the journal dates it."""
    policy_input = allowed_input("write")
    trace = DecisionTrace(
        decision_id=str(uuid.uuid4()),
        action="write",
        policy="sessionstate/write",
        allow=True,
        reasons=[],
        policy_revision="sha256:" + "3e" * 32,
        input_digest=canonical_digest(policy_input.model_dump(mode="json", by_alias=True)),
        evaluated_at=datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        engine=DecisionEngine(version="1.22.3"),
        latency_ms=0.812,
    )
    actor = Actor(
        sub="svc-1",
        roles=("model-service",),
        tenant_id="tenant-a",
        workspace_id="ws-1",
        session_id="chat-1",
    )
    return entry_body(trace, EncodedInput.of(policy_input), actor)


def fresh(template: DecisionEntryBody) -> DecisionEntryBody:
    """template with its own decision id, as every decision has (the id index is keyed on it)."""
    decision = template.decision.model_copy(update={"decision_id": str(uuid.uuid4())})
    return template.model_copy(update={"decision": decision})


def sealable(template: DecisionEntryBody) -> dict[str, Any]:
    """A fresh body as the journal hands it to the chain: with its outcome, dated now."""
    return fresh(template).sealable(WRITTEN, format_timestamp(datetime.now(UTC)))


@dataclass
class Run:
    rate: float  # entries/s over the timed part
    latencies: list[float]  # seconds, one per call
    seqs: list[int]  # the seq each call got back


def run_threads(threads: int, per_thread: int, append: Callable[[], dict[str, Any]]) -> Run:
    """threads threads, per_thread calls each, all released at once; timed until the last ends."""
    gate = threading.Barrier(threads + 1)
    latencies: list[list[float]] = [[] for _ in range(threads)]
    seqs: list[list[int]] = [[] for _ in range(threads)]

    def worker(slot: int) -> None:
        gate.wait()
        for _ in range(per_thread):
            started = time.perf_counter()
            entry = append()
            latencies[slot].append(time.perf_counter() - started)
            seqs[slot].append(entry["seq"])

    workers = [threading.Thread(target=worker, args=(slot,)) for slot in range(threads)]
    for thread in workers:
        thread.start()
    gate.wait()
    started = time.perf_counter()
    for thread in workers:
        thread.join()
    elapsed = time.perf_counter() - started
    flat = [value for part in latencies for value in part]
    return Run(len(flat) / elapsed, flat, [value for part in seqs for value in part])


def check_chain(name: str, chain: EvidenceChain, run: Run, expected: int) -> None:
    """Abort unless the chain verifies, holds every entry, and each call got its own seq."""
    outcome = chain.verify()
    problems = []
    if not outcome.ok:
        problems.append(f"verify failed: {outcome.problem} at seq {outcome.first_invalid_seq}")
    if outcome.entries != expected:
        problems.append(f"{outcome.entries} entries verified, {expected} appended")
    if sorted(run.seqs) != list(range(expected - len(run.seqs) + 1, expected + 1)):
        problems.append("the seqs handed back are not one gapless run")
    if problems:
        sys.exit(f"decision_log_bench: {name}: " + "; ".join(problems))


def journal_run(
    tmp: Path, template: DecisionEntryBody, threads: int, per_thread: int
) -> tuple[Run, float]:
    """Group commit: the run, and the average entries per synced batch."""
    lanes = LevelDBLaneStore(tmp / f"journal-{threads}")
    journal = DecisionJournal(lanes)
    try:
        for _ in range(WARM_UP):
            journal.record(fresh(template), status=WRITTEN.status)
        warm_batches = journal.batches
        run = run_threads(
            threads, per_thread, lambda: journal.record(fresh(template), status=WRITTEN.status)
        )
        journal.close()
        timed_batches = journal.batches - warm_batches
        check_chain(f"journal T={threads}", journal.chain("tenant-a"), run, WARM_UP + len(run.seqs))
    finally:
        journal.close()
        lanes.close()
    return run, len(run.seqs) / timed_batches


def synced_run(tmp: Path, template: DecisionEntryBody, threads: int, per_thread: int) -> Run:
    """Baseline: one synced `EvidenceChain.append` per entry."""
    lanes = LevelDBLaneStore(tmp / f"synced-{threads}")
    chain = EvidenceChain(lanes)

    def append() -> dict[str, Any]:
        return chain.append([sealable(template)])[0]

    try:
        for _ in range(WARM_UP):
            append()
        run = run_threads(threads, per_thread, append)
        check_chain(f"synced T={threads}", chain, run, WARM_UP + len(run.seqs))
    finally:
        lanes.close()
    return run


def seal_rate(template: DecisionEntryBody, count: int, batch: int = 32) -> float:
    """Entries/s that `seal` alone chains, in batches of `batch`: CPU only, no disk."""
    bodies = [sealable(template) for _ in range(count)]
    head, started = GENESIS, time.perf_counter()
    for at in range(0, count, batch):
        _, head = seal(bodies[at : at + batch], head)
    return count / (time.perf_counter() - started)


def ms(values: list[float], q: float) -> float:
    """The q-quantile of values (seconds), in milliseconds."""
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--entries", type=int, default=2000, help="entries per figure, split among the threads"
    )
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[1, 4, 16, 64], help="concurrent appenders"
    )
    args = parser.parse_args()
    template = write_body()
    size = len(canonical_json(sealable(template)))

    sealing = seal_rate(template, args.entries)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for threads in args.threads:
            per_thread = max(1, args.entries // threads)
            synced = synced_run(Path(tmp), template, threads, per_thread)
            grouped, batch = journal_run(Path(tmp), template, threads, per_thread)
            rows.append((threads, per_thread, grouped, synced, batch))

    print(
        f"entry body: {size} bytes before seq and hashes; about {args.entries} entries per figure;"
        " every chain verified"
    )
    print(
        f"{'T':>3}{'per T':>7}{'group entries/s':>17}{'synced entries/s':>18}{'ratio':>7}"
        f"{'avg batch':>11}{'group p50/p99 ms':>19}{'synced p50/p99 ms':>20}"
    )
    for threads, per_thread, grouped, synced, batch in rows:
        group_ms = f"{ms(grouped.latencies, 0.5):.2f} / {ms(grouped.latencies, 0.99):.2f}"
        synced_ms = f"{ms(synced.latencies, 0.5):.2f} / {ms(synced.latencies, 0.99):.2f}"
        print(
            f"{threads:>3}{per_thread:>7}{grouped.rate:>17,.0f}{synced.rate:>18,.0f}"
            f"{grouped.rate / synced.rate:>7.2f}{batch:>11.1f}{group_ms:>19}{synced_ms:>20}"
        )
    print(f"seal alone (no disk, batches of 32): {sealing:,.0f} entries/s")


if __name__ == "__main__":
    main()
