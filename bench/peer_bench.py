"""A peer a user would pick instead: LangGraph's PostgreSQL checkpointer beside this service.

Someone who wants a model service's conversation state kept in PostgreSQL,
without governance, would reach for LangGraph's checkpointer
(`langgraph-checkpoint-postgres`, `PostgresSaver`): a library in the model
service's own process, no policy decision, no tamper-evident log, no HTTP hop.
This bench measures both on the same PostgreSQL in the same run, so the
ratios say what governance, the policy engine, the decision log and the HTTP
hop cost against that ungoverned in-process store (issue 32).

1. `sessionstate db upgrade` on the database, then one `sessionstate serve`
   instance on it (durable writes on, rate limits off, a workspace approval in
   force, its own OPA sidecar), each of `--clients` sessions written once;
   then with `wrk` (bench/loadgen.py), `--clients` connections, each its own
   session and token: the governed write (`PUT S/state`), then the governed
   read (`GET S/state` of the stored record), each after an unrecorded
   warm-up of `--warmup` seconds. The instance is stopped.
2. LangGraph's `PostgresSaver` in this process, its tables made by its own
   `setup()` in a schema of the bench's own (dropped afterwards): `--clients`
   threads, each with a saver on a connection of its own (the connection
   `PostgresSaver.from_conn_string` opens: autocommit, no prepared statements,
   dict rows; a saver holds a lock around each operation, so threads sharing
   one saver, even over a pool, would take turns), each its own thread_id,
   written once: `get_tuple` of the thread's checkpoint; then `put` of a
   checkpoint whose one channel holds the stored record's document (as large
   as the service's record), each put a new checkpoint whose parent is the
   last, as a graph's steps are; each after the same warm-up. Then
   `get_tuple` again, of the latest, on the history the puts left: its query
   scans the thread's blobs, so it slows as a thread's history grows (printed,
   not in the ratios: those take the peer at its fastest).

It prints ops/s, p50 and p99 of each, the CPU each operation cost where /proc
shows it (bench/cpu_time.py): the service and its OPA sidecar per service
request, this process per LangGraph operation, and PostgreSQL's processes
(the postmaster and everything under it) per operation when the server runs
on this machine; then the ratios against the targets of issue 32 (governed
write >= 0.3x `put`, governed read >= 0.4x `get_tuple`), each marked met or
not met, never asserted. `--json` prints the same as one JSON document.

    # a throwaway PostgreSQL started the way the tests start theirs (Debian's
    # postgresql; `make postgres` installs it as root), removed afterwards:
    SESSIONSTATE_OPA_BIN=$(scripts/tools.sh opa) .venv/bin/python bench/peer_bench.py
    # or a database of one's own (the run writes sessions and decisions of tenant
    # `tenant-a` into it; prefer PGPASSWORD or ~/.pgpass to a password in CONNINFO):
    SESSIONSTATE_OPA_BIN=$(scripts/tools.sh opa) .venv/bin/python bench/peer_bench.py \\
        --store 'postgresql://USER@HOST:5432/DB' [--seconds 10] [--clients 16] \\
        [--warmup 1] [--json]

Every service answer must be 200 (201 for a first write): when some are not,
every figure is still measured and printed, then the bench names them and
exits with status 3; any other failure stops it at once (status 1). The
instance, its sidecar, wrk, the throwaway server and the schema are gone
however the run ends (an error, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from psycopg import sql
from psycopg.rows import DictRow, dict_row

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cpu_time import ProcessTree, Reading, command_name, cpu_seconds, parent_of
from bench.floors import FloorFailure, timed_threads
from bench.instances import (
    DIGEST_KEY,
    JSON,
    BenchFailure,
    Instances,
    Served,
    bearer,
    grant_approval,
    stopped_report,
)
from bench.loadgen import Load, LoadFailure, Request, Result, UnexpectedStatus, run
from bench.processes import exit_on_sigterm
from bench.store_bench import EXIT_UNEXPECTED_ANSWERS, db_upgrade, refusals, seed, session_path
from service.config.settings import Settings
from store.canonical import canonical_json
from store.digests import DigestKey
from tests.support import postgres as pg
from tests.support.factories import record, state_input

TARGETS = {"write": 0.3, "read": 0.4}  # issue 32: governed / PostgresSaver, same run
READ = frozenset({200})
WRITTEN = frozenset({200, 201})
AFTER_PUTS = "PostgresSaver.get_tuple, after puts"


@dataclass(frozen=True)
class Measured:
    """One figure: ops/s, p50, p99 (ms), and CPU ms per operation of each side."""

    ops_per_second: float
    p50_ms: float
    p99_ms: float
    operations: int
    side_cpu_ms: float | None  # the service + OPA, or this process for LangGraph
    postgres_cpu_ms: float | None  # the postmaster and everything under it

    def as_json(self) -> dict[str, Any]:
        return {
            "ops_per_second": round(self.ops_per_second, 1),
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "operations": self.operations,
            "cpu_ms_per_op": None if self.side_cpu_ms is None else round(self.side_cpu_ms, 3),
            "postgres_cpu_ms_per_op": None
            if self.postgres_cpu_ms is None
            else round(self.postgres_cpu_ms, 3),
        }


class CpuWatch:
    """CPU of one side (a process tree, or this process) and of PostgreSQL over one figure."""

    def __init__(self, side: Callable[[], Reading], postgres: ProcessTree | None) -> None:
        self.side = side
        self.postgres = postgres

    @contextlib.contextmanager
    def over(self, spent: dict[str, float | None]) -> Iterator[None]:
        side, database = self.side(), self.postgres.reading() if self.postgres else None
        yield
        spent["side"] = self.side().since(side)
        spent["postgres"] = (
            self.postgres.reading().since(database) if self.postgres and database else None
        )


def this_process() -> Reading:
    seconds = cpu_seconds(os.getpid())
    return Reading({} if seconds is None else {os.getpid(): seconds})


def per_op_ms(seconds: float | None, operations: int) -> float | None:
    return None if seconds is None or not operations else seconds * 1000 / operations


def local_postmaster(conninfo: str) -> ProcessTree | None:
    """PostgreSQL's postmaster, when the server runs on this machine: the parent of this
    connection's backend, both named `postgres` in /proc. None when it cannot be seen."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    backend = int(row[0]) if row else 0
    postmaster = parent_of(backend) if backend else None
    if postmaster is None or command_name(backend) != "postgres":
        return None
    return ProcessTree(postmaster) if command_name(postmaster) == "postgres" else None


# -- the service ----------------------------------------------------------------


def service_figure(
    served: Served,
    watch: CpuWatch,
    sessions: list[str],
    method: str,
    body: bytes | None,
    expected: frozenset[int],
    seconds: int,
    warmup: int,
    failures: list[str],
) -> Measured:
    """wrk at len(sessions) connections, each its own session and token, one thread each."""
    load = Load(
        served.url,
        [
            Request(method, session_path(s), bearer("model-service", s) | JSON, body)
            for s in sessions
        ],
        connections=len(sessions),
        threads=len(sessions),
        seconds=seconds,
        expected=expected,
        what=f"{method} S/state, {len(sessions)} connections",
    )
    if warmup:
        try:
            run(replace(load, seconds=warmup, what=load.what + " warm-up"))
        except UnexpectedStatus as failure:
            failures.append(str(failure))
    spent: dict[str, float | None] = {}
    with watch.over(spent):
        try:
            result: Result = run(load)
        except UnexpectedStatus as failure:
            failures.append(str(failure))
            result = failure.results[0]
    return Measured(
        ops_per_second=result.ok_per_second,
        p50_ms=result.p50_ms,
        p99_ms=result.p99_ms,
        operations=result.requests,
        side_cpu_ms=per_op_ms(spent["side"], result.requests),
        postgres_cpu_ms=per_op_ms(spent["postgres"], result.requests),
    )


def governed(
    opa: str,
    conninfo: str,
    tmp: Path,
    clients: int,
    seconds: int,
    warmup: int,
    postgres: ProcessTree | None,
    failures: list[str],
) -> dict[str, Measured]:
    sessions = [f"peer-{n}" for n in range(clients)]
    body = json.dumps(state_input()).encode()
    with Instances(opa, tmp) as instances:
        try:
            served = instances.start(
                data_dir=tmp / "instance", extra_env={"SESSIONSTATE_STORE": conninfo}
            )
            grant_approval(served.url)
            seed(served, sessions)
            watch = CpuWatch(ProcessTree(served.process.pid).reading, postgres)
            write = service_figure(
                served, watch, sessions, "PUT", body, WRITTEN, seconds, warmup, failures
            )
            read = service_figure(
                served, watch, sessions, "GET", None, READ, seconds, warmup, failures
            )
        except (BenchFailure, LoadFailure) as failure:
            raise BenchFailure(f"{failure}\n{stopped_report(instances.stop_all())}") from None
    if failures:
        for (status, reason), count in sorted(refusals(served).items()):
            failures.append(f"the instance's log: {count} x {status} {reason}")
    return {"write": write, "read": read}


# -- LangGraph's PostgresSaver ----------------------------------------------------


@contextlib.contextmanager
def own_schema(conninfo: str) -> Iterator[str]:
    """A schema of the bench's own for LangGraph's tables; the conninfo that uses it."""
    schema = f"bench_peer_{secrets.token_hex(4)}"
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        try:
            yield psycopg.conninfo.make_conninfo(conninfo, options=f"-c search_path={schema}")
        finally:
            admin.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )


def saver_connection(conninfo: str) -> psycopg.Connection[DictRow]:
    """A connection as `PostgresSaver.from_conn_string` opens one."""
    return psycopg.Connection.connect(
        conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row
    )


class Thread:
    """One LangGraph thread_id written and read by one bench thread, through its saver."""

    def __init__(self, saver: PostgresSaver, thread_id: str, value: dict[str, Any]) -> None:
        self.saver = saver
        self.value = value
        self.config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        self.version: str | None = None
        self.step = 0

    def checkpoint(self) -> Checkpoint:
        """The next checkpoint: the one channel, `state`, at a new version."""
        self.version = self.saver.get_next_version(self.version, None)
        made = empty_checkpoint()
        made["channel_values"] = {"state": self.value}
        made["channel_versions"] = {"state": self.version}
        return made

    def put(self) -> None:
        made = self.checkpoint()
        self.step += 1
        metadata: Any = {"source": "loop", "step": self.step, "parents": {}}
        self.config = self.saver.put(
            self.config, made, metadata, {"state": made["channel_versions"]["state"]}
        )

    def get(self) -> None:
        if self.saver.get_tuple(self.config) is None:
            raise BenchFailure(f"get_tuple found no checkpoint for {self.config}")


def peer(
    conninfo: str, clients: int, seconds: int, warmup: int, postgres: ProcessTree | None
) -> tuple[dict[str, Measured], dict[str, int]]:
    """get_tuple, put, then get_tuple again (each thread's history grown by the puts); the
    sizes of what a put stores, and the checkpoints a thread has after the puts."""
    value = record(DigestKey(DIGEST_KEY.encode())).to_json()
    _, blob = JsonPlusSerializer().dumps_typed(value)
    with own_schema(conninfo) as schema_conninfo:
        with saver_connection(schema_conninfo) as conn:
            PostgresSaver(conn).setup()
        connections = [saver_connection(schema_conninfo) for _ in range(clients)]
        try:
            threads = [
                Thread(PostgresSaver(conn), f"peer-{n}", value)
                for n, conn in enumerate(connections)
            ]
            for thread in threads:
                thread.put()  # as the service's sessions are: written once, not measured
            watch = CpuWatch(this_process, postgres)
            # get_tuple first, while each thread has one checkpoint: its query scans the
            # thread's blobs, so it slows as a thread's history grows (the third figure).
            found = {
                "get_tuple": timed(watch, [thread.get for thread in threads], seconds, warmup),
                "put": timed(watch, [thread.put for thread in threads], seconds, warmup),
                "get_tuple_after": timed(watch, [thread.get for thread in threads], seconds, 0),
            }
            checkpoint_json = len(json.dumps(dict(threads[0].checkpoint(), channel_values={})))
            history = round(sum(thread.step for thread in threads) / len(threads))
        finally:
            for conn in connections:
                conn.close()
    return found, {
        "blob_bytes": len(blob),
        "checkpoint_json_bytes": checkpoint_json,
        "checkpoints_per_thread_after_puts": history,
    }


def timed(
    watch: CpuWatch, operations: list[Callable[[], None]], seconds: int, warmup: int
) -> Measured:
    """The threads' figures after an unrecorded warm-up, and the CPU they cost."""
    if warmup:
        timed_threads(operations, warmup)
    spent: dict[str, float | None] = {}
    with watch.over(spent):
        figures = timed_threads(operations, seconds)
    count = int(figures["requests"])
    return Measured(
        ops_per_second=figures["requests_per_second"],
        p50_ms=figures["p50_ms"],
        p99_ms=figures["p99_ms"],
        operations=count,
        side_cpu_ms=per_op_ms(spent["side"], count),
        postgres_cpu_ms=per_op_ms(spent["postgres"], count),
    )


# -- the run and its report -------------------------------------------------------


def measure(
    conninfo: str, clients: int, seconds: int, warmup: int
) -> tuple[dict[str, Any], list[str]]:
    opa = Settings().resolved_opa_bin()
    failures: list[str] = []
    postgres = local_postmaster(conninfo)
    with tempfile.TemporaryDirectory(prefix="peer-bench-") as tmp:
        upgraded = db_upgrade(conninfo, Path(tmp))
        ours = governed(opa, conninfo, Path(tmp), clients, seconds, warmup, postgres, failures)
    theirs, sizes = peer(conninfo, clients, seconds, warmup, postgres)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    ratios = {
        "write": ours["write"].ops_per_second / theirs["put"].ops_per_second,
        "read": ours["read"].ops_per_second / theirs["get_tuple"].ops_per_second,
        "read_after": ours["read"].ops_per_second / theirs["get_tuple_after"].ops_per_second,
    }
    report = {
        "postgresql": row[0] if row else "?",
        "schema": upgraded.get("now"),
        "clients": clients,
        "seconds": seconds,
        "warmup_seconds": warmup,
        "cpus": os.cpu_count(),
        "record_bytes": len(canonical_json(record(DigestKey(DIGEST_KEY.encode())).to_json())),
        **sizes,
        "postgres_cpu_seen": postgres is not None,
        "figures": {
            "governed write: PUT S/state": ours["write"].as_json(),
            "governed read: GET S/state": ours["read"].as_json(),
            "PostgresSaver.put": theirs["put"].as_json(),
            "PostgresSaver.get_tuple": theirs["get_tuple"].as_json(),
            AFTER_PUTS: theirs["get_tuple_after"].as_json(),
        },
        "ratios": [
            {
                "name": name,
                "ratio": round(ratios[key], 3),
                "target": TARGETS.get(key),
                "met": ratios[key] >= TARGETS[key] if key in TARGETS else None,
            }
            for key, name in (
                ("write", "governed write / PostgresSaver.put"),
                ("read", "governed read / PostgresSaver.get_tuple"),
                ("read_after", "governed read / get_tuple after puts"),
            )
        ],
    }
    return report, failures


def cell(value: float | None) -> str:
    return f"{'-':>11}" if value is None else f"{value:>11.2f}"


def print_report(report: dict[str, Any]) -> None:
    print(
        f"PostgreSQL {report['postgresql']}: the service (schema {report['schema']}, durable "
        f"writes, approval in force, rate limits off) through wrk, and LangGraph's PostgresSaver "
        f"in this process, {report['clients']} clients each, {report['seconds']} s per figure; "
        f"record {report['record_bytes']} bytes, checkpoint blob {report['blob_bytes']} bytes "
        f"+ {report['checkpoint_json_bytes']} bytes of checkpoint JSON; "
        f"{report['cpus']} CPUs shared by wrk, the service, OPA, this process and PostgreSQL"
    )
    print(
        f"{'figure':<36}{'ops/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'CPU ms/op':>11}{'PG ms/op':>11}  CPU of"
    )
    sides = {
        "governed write: PUT S/state": "service + OPA",
        "governed read: GET S/state": "service + OPA",
        "PostgresSaver.put": "this process",
        "PostgresSaver.get_tuple": "this process",
        AFTER_PUTS: "this process",
    }
    for name, figures in report["figures"].items():
        print(
            f"{name:<36}{figures['ops_per_second']:>10,.0f}{figures['p50_ms']:>9.2f}"
            f"{figures['p99_ms']:>9.2f}{cell(figures['cpu_ms_per_op'])}"
            f"{cell(figures['postgres_cpu_ms_per_op'])}  {sides[name]}"
        )
    print(
        f"(get_tuple after the puts: {report['checkpoints_per_thread_after_puts']:,} "
        "checkpoints a thread; the ratios use get_tuple at one checkpoint a thread)"
    )
    if not report["postgres_cpu_seen"]:
        print("(PostgreSQL's CPU: its processes are not on this machine, or not visible)")
    print(f"\n{'ratio (issue 32 target)':<44}{'ratio':>8}{'target':>10}")
    for ratio in report["ratios"]:
        if ratio["target"] is None:
            target, met = "-", "(no target)"
        else:
            target, met = f">= {ratio['target']}x", "met" if ratio["met"] else "not met"
        print(f"{ratio['name']:<44}{ratio['ratio']:>7.2f}x{target:>10}  {met}")


def bench(conninfo: str, clients: int, seconds: int, warmup: int, as_json: bool) -> None:
    try:
        report, failures = measure(conninfo, clients, seconds, warmup)
    except (BenchFailure, LoadFailure, FloorFailure, psycopg.Error) as failure:
        sys.exit(f"peer bench aborted: {failure}")
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    if failures:
        print(
            "\nFAILED: answers other than 200/201 (ops/s above count 2xx only):\n"
            + "\n".join(failures),
            file=sys.stderr,
        )
        sys.exit(EXIT_UNEXPECTED_ANSWERS)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", metavar="CONNINFO", help="a PostgreSQL database of your own")
    parser.add_argument("--seconds", type=int, default=10, help="time per figure (whole seconds)")
    parser.add_argument("--clients", type=int, default=16, help="connections / threads")
    parser.add_argument(
        "--warmup", type=int, default=1, help="unrecorded seconds before each figure (0: none)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    if args.seconds < 1 or args.clients < 1 or args.warmup < 0:
        parser.error("--seconds and --clients: 1 or more; --warmup: 0 or more")
    exit_on_sigterm()
    if args.store is not None:
        bench(args.store, args.clients, args.seconds, args.warmup, args.json)
        return
    try:
        with pg.server() as server:
            bench(server.create_database(), args.clients, args.seconds, args.warmup, args.json)
    except pg.PostgresMissing as failure:
        sys.exit(f"peer bench: no throwaway PostgreSQL: {failure}")


if __name__ == "__main__":
    main()
