"""Lane-store throughput beside its raw engine, measured in the same run.

LevelDB (the default): ops/s of SessionStateStore read (get), synced write
(put) and compare-and-set, beside raw plyvel get and synced put of the same
bytes, with the ratio of each to its raw baseline.

    .venv/bin/python bench/store_bench.py [--seconds 2]

PostgreSQL (`--store CONNINFO`, any libpq connection string; issue 13): runs
`sessionstate db upgrade` on it, then measures durable writes/s with `wrk`
(bench/loadgen.py): PUT S/state, each connection its own session (and its own
model-service token), a workspace approval in force, durable writes on, rate
limits off,

- through one `sessionstate serve` instance, at 1 and 16 connections;
- through two instances (each its own OPA sidecar and data dir, on the same
  database), the 16 connections split over both (two wrk processes at once;
  p50/p99 are the larger of the two);
- through one instance with `serve --workers 2`, at 16 connections, with the
  answers each worker gave (counted by `X-Sessionstate-Worker` in wrk's Lua):
  each keep-alive connection stays with the worker that accepted it, so the
  counts show how the kernel spread the connections over the workers;

then, with the instances stopped, raw psycopg `INSERT ...; COMMIT` of rows as
large as a stored record (key and value) into a scratch table shaped as the
lanes table (created, then dropped), at 1 and 16 threads each with its own
connection. It prints the figures and the ratios (goal: through the service
>= 0.5x raw at 16). Writes/s count acknowledged (2xx) writes. Every answer
must be 200 or 201: when some are not, every figure is still measured and
printed, then the bench names them (status and count) and exits with status
3; any other failure stops it at once (status 1). The instances, their
sidecars and wrk are stopped and the scratch table dropped however the run
ends (an error, Ctrl-C, SIGTERM).

    SESSIONSTATE_OPA_BIN=$(scripts/tools.sh opa) .venv/bin/python bench/store_bench.py \\
        --store 'postgresql://USER@HOST:5432/DB' [--seconds 10] [--clients 16]

The database should be one for benchmarks: the runs write sessions and
decisions of tenant `tenant-a` into it. A password in CONNINFO is visible to
other users of the machine (ps): prefer PGPASSWORD or ~/.pgpass, which libpq
reads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import plyvel
import psycopg
import requests
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.floors import FloorFailure, timed_threads
from bench.instances import (
    DIGEST_KEY,
    JSON,
    TENANT,
    WORKSPACE,
    BenchFailure,
    Instances,
    Served,
    bearer,
    check,
    grant_approval,
    stopped_report,
)
from bench.loadgen import Load, LoadFailure, Request, UnexpectedStatus, combined, run_together
from bench.processes import exit_on_sigterm
from service.api.v1 import WORKER
from service.config.settings import Settings
from store.backends.leveldb import LevelDBLaneStore
from store.canonical import canonical_json
from store.digests import DigestKey
from store.session_state import Precondition, SessionStateStore, state_key
from tests.support.factories import record, scope, state_input

ROOT = Path(__file__).resolve().parent.parent
WRITTEN = frozenset({200, 201})
EXIT_UNEXPECTED_ANSWERS = 3  # every figure measured, but some writes were not acknowledged


def rate(operation: Callable[[int], object], seconds: float) -> float:
    """Operations per second of operation(i), run for about `seconds`."""
    count, start = 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(50):
            operation(count)
            count += 1
    return count / (time.perf_counter() - start)


def leveldb_bench(seconds: float) -> None:
    key = DigestKey(b"b" * 32)
    built = record(key)
    value = canonical_json(built.to_json())

    with tempfile.TemporaryDirectory() as tmp:
        raw = plyvel.DB(str(Path(tmp) / "raw"), create_if_missing=True)
        raw_key = state_key(built.scope).encode()
        raw.put(raw_key, value, sync=True)
        raw_get = rate(lambda i: raw.get(raw_key), seconds)
        raw_put = rate(lambda i: raw.put(raw_key, value, sync=True), seconds)
        raw.close()

        lanes = LevelDBLaneStore(Path(tmp) / "lanes")
        store = SessionStateStore(lanes)
        store.write(built)
        lane_get = rate(lambda i: store.read(scope()), seconds)
        lane_put = rate(lambda i: store.write(built), seconds)

        current = [built.state_digest]
        versions = [record(key, state_id=f"state-{n}") for n in range(2)]

        def compare_and_set(i: int) -> None:
            nxt = versions[i % 2]
            store.write(nxt, Precondition(if_match=current[0]))
            current[0] = nxt.state_digest

        lane_cas = rate(compare_and_set, seconds)
        lanes.close()

    print(f"record size: {len(value)} bytes; {seconds:.1f} s per figure")
    print(f"{'operation':<34}{'ops/s':>12}{'baseline ops/s':>16}{'ratio':>8}")
    rows = [
        ("read (get + parse + verify)", lane_get, raw_get),
        ("write (synced put, CAS check)", lane_put, raw_put),
        ("compare-and-set (If-Match)", lane_cas, raw_put),
    ]
    for name, ours, baseline in rows:
        print(f"{name:<34}{ours:>12,.0f}{baseline:>16,.0f}{ours / baseline:>8.2f}")
    print(f"{'raw plyvel get':<34}{raw_get:>12,.0f}")
    print(f"{'raw plyvel synced put':<34}{raw_put:>12,.0f}")


# -- PostgreSQL ---------------------------------------------------------------


def db_upgrade(conninfo: str, tmp: Path) -> dict[str, Any]:
    """`sessionstate db upgrade` on the store; what it printed (no password in it)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("SESSIONSTATE_")}
    env |= {"SESSIONSTATE_STORE": conninfo, "SESSIONSTATE_DATA_DIR": str(tmp / "upgrade")}
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "db", "upgrade"],
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise BenchFailure(f"sessionstate db upgrade failed ({done.returncode}): {done.stderr}")
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def session_path(session: str) -> str:
    return f"{WORKSPACE}/sessions/{session}/state"


def writes(
    instances: list[Served],
    sessions: list[str],
    seconds: int,
    failures: list[str],
    count_header: str | None = None,
) -> dict[str, Any]:
    """PUT S/state through the instances at once, each connection its own session (and
    token): instance k takes sessions k, k + n, ...; one wrk thread per connection.

    Its figures count acknowledged (2xx) writes only. Answers of another status are
    counted in the figures (`unexpected`) and named in `failures`; the run goes on, so
    the other figures are still measured, and the bench fails at the end."""
    body = json.dumps(state_input()).encode()
    loads = []
    for number, served in enumerate(instances):
        mine = sessions[number :: len(instances)]
        loads.append(
            Load(
                served.url,
                [
                    Request("PUT", session_path(s), bearer("model-service", s) | JSON, body)
                    for s in mine
                ],
                connections=len(mine),
                threads=len(mine),
                seconds=seconds,
                expected=WRITTEN,
                what=f"writes through instance {number + 1} of {len(instances)}, "
                f"{len(mine)} connections",
                count_header=count_header,
            )
        )
    try:
        result = combined(run_together(loads))
    except UnexpectedStatus as failure:
        failures.append(str(failure))
        result = combined(failure.results)
    figures: dict[str, Any] = result.figures()
    figures["requests_per_second"] = round(result.ok_per_second, 1)
    unexpected = {s: n for s, n in result.statuses.items() if s not in WRITTEN}
    if count_header is not None:
        figures |= {"answers_by": dict(sorted(result.header_counts.items()))}
    return figures | ({"unexpected": unexpected} if unexpected else {})


def seed(served: Served, sessions: list[str]) -> None:
    """An unmeasured write of each session through served (201 for a new session), so that
    every measured write replaces a record and the instance has written before."""
    body = json.dumps(state_input()).encode()
    for session in sessions:
        answer = requests.put(
            served.url + session_path(session),
            data=body,
            headers=bearer("model-service", session) | JSON,
            timeout=30,
        )
        check(answer, WRITTEN, "seed write")


def through_service(
    opa: str, conninfo: str, tmp: Path, clients: int, seconds: int, failures: list[str]
) -> dict[str, dict[int, Any]]:
    sessions = [f"bench-{n}" for n in range(clients)]
    store = {"SESSIONSTATE_STORE": conninfo}
    found: dict[str, dict[int, Any]] = {"one": {}, "two": {}, "workers": {}}
    with Instances(opa, tmp) as instances:
        try:
            first = instances.start(data_dir=tmp / "instance-1", extra_env=store)
            grant_approval(first.url)
            seed(first, sessions)
            for count in sorted({1, clients}):
                found["one"][count] = writes([first], sessions[:count], seconds, failures)
            second = instances.start(data_dir=tmp / "instance-2", extra_env=store)
            # Its first writes find the tenant's chain moved on by the first: not measured.
            seed(second, sessions[1::2])
            found["two"][clients] = writes([first, second], sessions, seconds, failures)
            for served in (first, second):
                served.stop()
            workers = instances.start(
                data_dir=tmp / "workers-2", extra_env=store, args=("--workers", "2")
            )
            seed(workers, sessions)
            found["workers"][clients] = writes([workers], sessions, seconds, failures, WORKER)
        except (BenchFailure, LoadFailure) as failure:
            raise BenchFailure(f"{failure}\n{stopped_report(instances.stop_all())}") from None
        started = [first, second, workers]
    if failures:
        for number, served in enumerate(started, start=1):
            for (status, reason), count in sorted(refusals(served).items()):
                failures.append(f"instance {number}'s log: {count} x {status} {reason}")
    return found


def refusals(served: Served) -> Counter[tuple[int, str]]:
    """(status, reason) of each write the instance did not acknowledge, from its log."""
    found: Counter[tuple[int, str]] = Counter()
    for line in served.log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("event") == "request" and event.get("status") not in WRITTEN:
                found[(int(event["status"]), str(event.get("reason", "-")))] += 1
    return found


def raw_inserts(conninfo: str, counts: list[int], seconds: int) -> dict[int, Any]:
    """INSERT ...; COMMIT of rows as large as a stored record, one connection per thread,
    into a scratch table shaped as the lanes table, dropped afterwards."""
    built = record(DigestKey(DIGEST_KEY.encode()))
    value = canonical_json(built.to_json())
    key = state_key(built.scope).encode()
    table = sql.Identifier(f"bench_raw_inserts_{secrets.token_hex(4)}")
    insert = sql.SQL("INSERT INTO {} (tenant_id, key, value) VALUES (%s, %s, %s)").format(table)
    found: dict[int, Any] = {}
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(
            sql.SQL(
                "CREATE TABLE {} (tenant_id text NOT NULL, key bytea NOT NULL, "
                "value bytea NOT NULL, PRIMARY KEY (tenant_id, key))"
            ).format(table)
        )
        try:
            admin.execute(sql.SQL("CREATE INDEX ON {} (key)").format(table))
            for count in counts:
                connections = [psycopg.connect(conninfo) for _ in range(count)]
                try:
                    found[count] = timed_threads(
                        [
                            inserter(connection, insert, key + f"/{count}-{n}".encode(), value)
                            for n, connection in enumerate(connections)
                        ],
                        seconds,
                    )
                finally:
                    for connection in connections:
                        connection.close()
        finally:
            admin.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
    return found


def inserter(
    connection: psycopg.Connection[Any], insert: sql.Composed, prefix: bytes, value: bytes
) -> Callable[[], None]:
    """One INSERT and its COMMIT per call, each row a key of its own."""
    numbers = iter(range(1 << 62))

    def once() -> None:
        connection.execute(insert, (TENANT, prefix + b"/%d" % next(numbers), value))
        connection.commit()

    return once


def postgres_bench(conninfo: str, clients: int, seconds: int) -> None:
    opa = Settings().resolved_opa_bin()
    size = len(canonical_json(record(DigestKey(DIGEST_KEY.encode())).to_json()))
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="store-bench-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            upgraded = db_upgrade(conninfo, tmp)
            service = through_service(opa, conninfo, tmp, clients, seconds, failures)
            raw = raw_inserts(conninfo, sorted({1, clients}), seconds)
        except (BenchFailure, LoadFailure, FloorFailure, psycopg.Error) as failure:
            sys.exit(f"store bench aborted: {failure}")
    print(
        f"PostgreSQL store {upgraded['target']} (schema {upgraded['now']}): durable writes, "
        f"PUT S/state, each connection its own session, approval in force, rate limits off; "
        f"record {size} bytes; {seconds} s per figure; {os.cpu_count()} CPUs shared by wrk, "
        "services, OPA sidecars and PostgreSQL"
    )
    counts = sorted({1, clients})
    head = "".join(f"{f'{n} conn: writes/s':>19}{'p50 ms':>9}{'p99 ms':>9}" for n in counts)
    print(f"{'figure':<48}{head}")
    rows = [
        ("through one service instance", service["one"]),
        (f"through two instances ({clients} conn split)", service["two"]),
        ("through one instance, --workers 2", service["workers"]),
        ("raw psycopg INSERT; COMMIT (a connection each)", raw),
    ]
    for label, figures in rows:
        cells = "".join(
            f"{figures[n]['requests_per_second']:>19,.0f}{figures[n]['p50_ms']:>9.2f}"
            f"{figures[n]['p99_ms']:>9.2f}"
            if n in figures
            else f"{'-':>19}{'-':>9}{'-':>9}"
            for n in counts
        )
        print(f"{label:<48}{cells}")
    spread = service["workers"][clients]["answers_by"]
    print(
        f"answers per worker (slot:pid), --workers 2, {clients} keep-alive connections: "
        + ", ".join(f"{worker} {count:,}" for worker, count in spread.items())
    )
    print(f"\nratio to raw (goal: through the service >= 0.5x raw at {clients})")
    ratios = [
        ("one instance, 1 conn", service["one"][1], raw[1]),
        (f"one instance, {clients} conn", service["one"][clients], raw[clients]),
        (f"two instances, {clients} conn", service["two"][clients], raw[clients]),
    ]
    for label, ours, baseline in ratios:
        ratio = ours["requests_per_second"] / baseline["requests_per_second"]
        print(f"{label:<48}{ratio:>8.2f}x")
    if failures:
        print(
            "\nFAILED: answers other than 200/201 (writes/s above count 2xx only):\n"
            + "\n".join(failures),
            file=sys.stderr,
        )
        sys.exit(EXIT_UNEXPECTED_ANSWERS)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=None, help="time per figure")
    parser.add_argument("--store", metavar="CONNINFO", help="a PostgreSQL to measure instead")
    parser.add_argument("--clients", type=int, default=16, help="PostgreSQL: concurrent count")
    args = parser.parse_args()
    if args.store is None:
        leveldb_bench(2.0 if args.seconds is None else args.seconds)
        return
    seconds = 10.0 if args.seconds is None else args.seconds
    if seconds < 1 or not seconds.is_integer() or args.clients < 2:
        parser.error("with --store: --seconds a whole number of 1 or more, --clients 2 or more")
    exit_on_sigterm()
    postgres_bench(args.store, args.clients, int(seconds))


if __name__ == "__main__":
    main()
