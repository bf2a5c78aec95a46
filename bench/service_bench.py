"""The governed hot path beside its floors, measured with wrk in the same run (issues 14, 32).

Starts the real `sessionstate serve` (hypercorn, its own OPA sidecar, LevelDB
in a temporary dir, durable writes on, rate limits off: every wrk connection
is one actor, whose limits would be measured instead of the service), grants
a workspace approval and stores one record, then drives with `wrk`
(bench/loadgen.py), at 1 and at 16 keep-alive connections:

- GET S/state (read), POST S/replay-preview, POST S/state/preview,
- PUT S/state (write, the approval in force; the same body each time, so each
  request replaces the record, durably),

then stops it and measures the floors the same way, one after the other:

- raw OPA: POST straight at an OPA sidecar over the same policies/ (its
  /v1/data/sessionstate/read/decision, the read decision's input), on
  loopback TCP with token and authz, since wrk cannot reach a Unix socket
  (the service's own sidecar listens on one, without them: its OPA CPU per
  decision is lower than this floor's);
- hello-world Flask served exactly as the service is (hypercorn, the same
  front, the same thread count and timeouts: bench/floors.py);
- the governed floor: that hello-world route made to do the least any governed
  read must, one read decision through the service's own `PolicyClient` and one
  synced LevelDB append of a decision entry's size, over a sidecar on a Unix
  socket, as the service's own;
- raw LevelDB get and synced put (plyvel, in-process, a stored record's bytes,
  1 and 16 threads).

Every answer must have its expected status (200; 200 or 201 for a write) and
no socket may fail, or the run stops. Each figure is preceded by an
unrecorded warm-up of `--warmup` seconds. It prints req/s, p50 and p99 of
each at 1 and 16, and beside each wrk figure the CPU each request cost: the
utime + stime the server's processes spent during the wrk run (from /proc,
bench/process_cpu.py), divided by the requests wrk counted; the service's
process(es) (the serve process and any worker below it, the floor's process)
apart from its OPA sidecar's. Then issue 32's targets beside the figures of
this run, all within the run (printed, never asserted): the governed floor
>= 0.45x hello-world req/s at 16; reads >= 0.8x and writes >= 0.6x the
governed floor's req/s at 16; a read's CPU (service + OPA) <= 1.5 ms at 16;
the one-client read p50 <= 1.2x the governed floor's. `--opa-grouped false`
runs the service and the governed floor with one OPA query per decision
(SESSIONSTATE_OPA_GROUPED), for the A/B of grouped decisions.

Run (needs `wrk`: `make wrk` installs it as root; `make bench` runs every bench):

    SESSIONSTATE_OPA_BIN=$(scripts/tools.sh opa) .venv/bin/python bench/service_bench.py \\
        [--seconds 10] [--clients 16] [--warmup 1] [--wrk-threads 1] [--opa-grouped true] [--json]

`--json` prints one JSON document (figures, each wrk figure with its
`cpu_ms_per_request` {service, opa, total}, targets, the governed floor's
ratios, settings) instead of the table, to copy figures into
docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import floors, process_cpu
from bench.instances import (
    DIGEST_KEY,
    JSON,
    SESSION,
    BenchFailure,
    Instances,
    bearer,
    check,
    grant_approval,
    stopped_report,
)
from bench.loadgen import Load, LoadFailure, Request, Result, run
from bench.process_cpu import ROLES
from bench.processes import exit_on_sigterm
from service.config.settings import Settings
from service.policy.sidecar import OpaSidecar
from service.runtime.serving import THREADS
from tests.support.factories import state_input

OK = frozenset({200})


@dataclass(frozen=True)
class Operation:
    key: str
    label: str
    method: str
    path: str
    body: bytes | None
    expected: frozenset[int]


def operations() -> list[Operation]:
    body = json.dumps(state_input()).encode()
    return [
        Operation("read", "GET state (read)", "GET", SESSION + "/state", None, OK),
        Operation(
            "replay-preview",
            "POST replay-preview",
            "POST",
            SESSION + "/replay-preview",
            json.dumps({"max_inputs": 16}).encode(),
            OK,
        ),
        Operation("preview", "POST state/preview", "POST", SESSION + "/state/preview", body, OK),
        Operation(
            "write",
            "PUT state (write, approval in force)",
            "PUT",
            SESSION + "/state",
            body,
            frozenset({200, 201}),
        ),
    ]


FLOOR_LABELS = {
    "opa": "raw OPA, TCP+token+authz, read, keep-alive",
    "hello-world": "hello-world Flask, same hypercorn settings",
    "governed": "governed floor: hello + 1 decision + 1 fsync",
    "leveldb-get": "raw LevelDB get (in-process)",
    "leveldb-put": "raw LevelDB synced put (in-process)",
}


def request_of(operation: Operation, auth: dict[str, str]) -> Request:
    headers = auth | (JSON if operation.body is not None else {})
    return Request(operation.method, operation.path, headers, operation.body)


def measured(load: Load, warmup: int, processes: tuple[int, ...]) -> dict[str, Any]:
    """An unrecorded warm-up of `warmup` seconds (checked all the same), then the figure,
    with the CPU per request of `processes` and every process below them."""
    if warmup > 0:
        run(replace(load, seconds=warmup, what=load.what + " warm-up"))
    before = process_cpu.sample(processes)
    result: Result = run(load)
    after = process_cpu.sample(processes)
    cpu = process_cpu.per_request(before, after, result.requests)
    return result.figures() | {"cpu_ms_per_request": cpu}


def wrk_load(
    url: str,
    request: Request,
    clients: int,
    args: argparse.Namespace,
    what: str,
    expected: frozenset[int] = OK,
) -> Load:
    """One request on `clients` keep-alive connections for `--seconds`."""
    return Load(
        url,
        (request,),
        connections=clients,
        threads=min(args.wrk_threads, clients),
        seconds=args.seconds,
        expected=expected,
        what=what,
    )


def grouping(args: argparse.Namespace) -> dict[str, str]:
    """The service's and the governed floor's `SESSIONSTATE_OPA_GROUPED`, as `--opa-grouped`."""
    return {"SESSIONSTATE_OPA_GROUPED": args.opa_grouped}


def measure_service(opa: str, tmp: Path, args: argparse.Namespace) -> dict[str, dict[int, Any]]:
    found: dict[str, dict[int, Any]] = {}
    with Instances(opa, tmp) as instances:
        try:
            served = instances.start(extra_env=grouping(args))
            grant_approval(served.url)
            ops = operations()
            write = ops[-1]
            seeded = requests.put(
                served.url + write.path,
                data=write.body,
                headers=bearer("model-service") | JSON,
                timeout=30,
            )
            check(seeded, write.expected, "seed write")
            for clients in (1, args.clients):
                for op in ops:
                    what = f"{op.key} at {clients} connections"
                    request = request_of(op, bearer("model-service"))
                    load = wrk_load(served.url, request, clients, args, what, op.expected)
                    pids = (served.process.pid,)  # its OPA sidecar and any worker below it
                    found.setdefault(op.key, {})[clients] = measured(load, args.warmup, pids)
        except (BenchFailure, LoadFailure) as failure:
            raise BenchFailure(f"{failure}\n{stopped_report(instances.stop_all())}") from None
        stopped = instances.stop_all()
    if any(code != 0 for _, code in stopped):
        raise BenchFailure("the service did not stop cleanly:\n" + stopped_report(stopped))
    return found


def measure_floors(
    opa: str, tmp: Path, args: argparse.Namespace
) -> tuple[dict[str, dict[int, Any]], int]:
    found: dict[str, dict[int, Any]] = {"opa": {}, "governed": {}, "hello-world": {}}
    counts = (1, args.clients)
    with floors.opa_sidecar(opa, tmp / "floor-opa") as (sidecar, decision):
        for clients in counts:
            load = wrk_load(sidecar.url, decision, clients, args, f"raw OPA at {clients}")
            found["opa"][clients] = measured(load, args.warmup, opa_pid(sidecar))
    with (
        floors.socket_sidecar(opa, tmp / "floor-socket-opa") as sidecar,
        floors.governed_floor(
            sidecar.url, sidecar.token, tmp / "floor-governed", grouping(args)
        ) as floor,
    ):
        pids = (floor.pid, *opa_pid(sidecar))
        for clients in counts:
            load = wrk_load(floor.url, Request(), clients, args, f"governed floor at {clients}")
            found["governed"][clients] = measured(load, args.warmup, pids)
    with floors.hello_world() as hello:
        for clients in counts:
            load = wrk_load(hello.url, Request(), clients, args, f"hello-world at {clients}")
            found["hello-world"][clients] = measured(load, args.warmup, (hello.pid,))
    leveldb, size = floors.leveldb_floor(tmp / "floor-leveldb", DIGEST_KEY, counts, args.seconds)
    found["leveldb-get"], found["leveldb-put"] = leveldb["get"], leveldb["put"]
    return found, size


def opa_pid(sidecar: OpaSidecar) -> tuple[int, ...]:
    """The sidecar's OPA process, for its CPU (none while it is being restarted)."""
    return () if sidecar.pid is None else (sidecar.pid,)


def targets(figures: dict[str, dict[int, Any]], clients: int) -> list[dict[str, Any]]:
    """Issue 32's targets beside this run's figures (ratios within the run): name, value,
    bound, met. Issue 14's absolute ones are retired: docs/performance.md says why."""

    def ratio(key: str, floor: str, count: int, figure: str) -> float:
        return float(figures[key][count][figure]) / float(figures[floor][count][figure])

    def target(name: str, value: float, bound: float, at_least: bool) -> dict[str, Any]:
        met = value >= bound if at_least else value <= bound
        return {
            "target": name,
            "value": round(value, 3),
            "bound": bound,
            "at_least": at_least,
            "met": met,
        }

    rate = "requests_per_second"
    return [
        target(
            f"governed floor req/s / hello-world req/s, {clients} conn",
            ratio("governed", "hello-world", clients, rate),
            0.45,
            True,
        ),
        target(
            f"read req/s / governed floor req/s, {clients} conn",
            ratio("read", "governed", clients, rate),
            0.8,
            True,
        ),
        target(
            f"write req/s / governed floor req/s, {clients} conn",
            ratio("write", "governed", clients, rate),
            0.6,
            True,
        ),
        target(
            f"CPU ms per read, service + OPA, {clients} conn",
            figures["read"][clients]["cpu_ms_per_request"]["total"],
            1.5,
            False,
        ),
        target(
            "read p50 / governed floor p50, 1 conn",
            ratio("read", "governed", 1, "p50_ms"),
            1.2,
            False,
        ),
    ]


def ms(value: float) -> str:
    """Milliseconds to three decimals; a figure under 10 µs to four."""
    return f"{value:.4f}" if value < 0.01 else f"{value:.3f}"


def cpu_cell(figure: dict[str, Any]) -> str:
    """The CPU per request as `service/OPA` ms, "-" for a part with no process (or a figure
    with no CPU read: the in-process LevelDB floors)."""
    cpu = figure.get("cpu_ms_per_request") or {}
    return "/".join("-" if cpu.get(role) is None else f"{cpu[role]:.2f}" for role in ROLES)


def print_report(report: dict[str, Any]) -> None:
    settings, figures = report["settings"], report["figures"]
    counts = (1, settings["clients"])
    print(
        f"served: hypercorn, one process x {settings['threads']} threads, OPA sidecar, decisions "
        f"{'grouped' if settings['opa_grouped'] else 'one per query'}, durable writes, rate "
        f"limits off; record {settings['record_bytes']} bytes; wrk "
        f"{settings['wrk_threads']} thread(s), {settings['seconds']} s per figure after "
        f"{settings['warmup']} s warm-up; {settings['cpus']} CPUs shared by wrk, service and OPA; "
        "CPU ms per request (utime + stime from /proc during the wrk run / requests): the "
        "service's process(es) / its OPA sidecar"
    )
    head = "".join(
        f"{f'{n} conn: req/s':>16}{'p50 ms':>9}{'p99 ms':>9}{'CPU svc/OPA':>14}" for n in counts
    )
    print(f"{'figure':<44}{head}")
    labels = {op.key: op.label for op in operations()} | FLOOR_LABELS
    for key, label in labels.items():
        cells = "".join(
            f"{figures[key][n]['requests_per_second']:>16,.0f}{ms(figures[key][n]['p50_ms']):>9}"
            f"{ms(figures[key][n]['p99_ms']):>9}{cpu_cell(figures[key][n]):>14}"
            for n in counts
        )
        print(f"{label:<44}{cells}")
    print(f"\n{'target (this run)':<52}{'value':>10}{'bound':>10}  met")
    for row in report["targets"]:
        bound = f"{'>=' if row['at_least'] else '<='} {row['bound']:g}"
        print(
            f"{row['target']:<52}{row['value']:>10.2f}{bound:>10}  {'yes' if row['met'] else 'no'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=10, help="wrk duration per figure")
    parser.add_argument("--clients", type=int, default=16, help="the concurrent connection count")
    parser.add_argument(
        "--warmup", type=int, default=1, help="unrecorded seconds before each figure"
    )
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk threads (at most clients)")
    parser.add_argument(
        "--opa-grouped",
        choices=("true", "false"),
        default="true",
        help="SESSIONSTATE_OPA_GROUPED for the service and the governed floor (default true, "
        "the service's default): false asks OPA one query per decision",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    if args.seconds < 1 or args.clients < 1 or args.warmup < 0 or args.wrk_threads < 1:
        parser.error("--seconds, --clients and --wrk-threads must be 1 or more, --warmup 0 or more")
    if args.clients % min(args.wrk_threads, args.clients):
        parser.error("--clients must be a multiple of --wrk-threads")
    exit_on_sigterm()
    opa = Settings().resolved_opa_bin()
    with tempfile.TemporaryDirectory(prefix="service-bench-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            figures = measure_service(opa, tmp, args)
            floor_figures, size = measure_floors(opa, tmp, args)
        except (BenchFailure, LoadFailure, floors.FloorFailure) as failure:
            sys.exit(f"service bench aborted: {failure}")
    figures |= floor_figures
    report = {
        "settings": {
            "seconds": args.seconds,
            "clients": args.clients,
            "warmup": args.warmup,
            "wrk_threads": args.wrk_threads,
            "threads": THREADS,
            "opa_grouped": args.opa_grouped == "true",
            "record_bytes": size,
            "cpus": os.cpu_count(),
        },
        "figures": figures,
        "targets": targets(figures, args.clients),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)


if __name__ == "__main__":
    main()
