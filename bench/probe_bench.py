"""Probes and scrapes beside the hot path: what they cost, and what they cost the reads (issue 32).

Starts the real `sessionstate serve` (as bench/service_bench.py does: hypercorn,
its own OPA sidecar, LevelDB, durable writes, rate limits off), grants a
workspace approval and stores one record, then drives with `wrk`
(bench/loadgen.py):

- GET /healthz alone, at `--clients` connections;
- GET /metrics alone, at 4 connections (a scrape is rarer and larger);
- GET S/state (a read) alone, at `--clients` connections;
- the same reads with GET /healthz on `--probe-clients` more connections,
  run together: the reads' req/s, and the probes' p50 and p99 while every
  request thread has a read to do (what a kubelet's liveness probe waits);
- the same reads with GET /metrics on one more connection, run together.

Beside each figure, the CPU each request cost the service's process and its
OPA sidecar (utime + stime from /proc over the run / the requests wrk counted,
bench/process_cpu.py; for a pair run together, over both loads' requests).
Each figure is preceded by an unrecorded warm-up of `--warmup` seconds.

Run (needs `wrk`: `make wrk` installs it as root):

    SESSIONSTATE_OPA_BIN=$(scripts/tools.sh opa) .venv/bin/python bench/probe_bench.py \\
        [--seconds 10] [--clients 16] [--probe-clients 2] [--warmup 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import process_cpu
from bench.instances import (
    JSON,
    SESSION,
    BenchFailure,
    Instances,
    Served,
    bearer,
    check,
    grant_approval,
    stopped_report,
)
from bench.loadgen import Load, LoadFailure, Request, Result, run, run_together
from bench.processes import exit_on_sigterm
from bench.service_bench import cpu_cell
from service.api.v1 import HEALTHZ, METRICS
from service.config.settings import Settings
from tests.support.factories import state_input

SCRAPERS = 4  # connections for /metrics alone


def load(url: str, request: Request, clients: int, args: argparse.Namespace, what: str) -> Load:
    return Load(url, (request,), connections=clients, seconds=args.seconds, what=what)


def measured_together(loads: list[Load], warmup: int, pid: int) -> list[dict[str, Any]]:
    """The loads run at once (after a warm-up), each with its wrk figures; the CPU per
    request over all their requests, on the first."""
    if warmup > 0:
        run_together([replace(each, seconds=warmup, what=each.what + " warm-up") for each in loads])
    before = process_cpu.sample((pid,))
    results: list[Result] = run_together(loads) if len(loads) > 1 else [run(loads[0])]
    after = process_cpu.sample((pid,))
    cpu = process_cpu.per_request(before, after, sum(result.requests for result in results))
    figures: list[dict[str, Any]] = [dict(result.figures()) for result in results]
    figures[0]["cpu_ms_per_request"] = cpu
    return figures


def seeded(served: Served) -> None:
    grant_approval(served.url)
    answer = requests.put(
        served.url + SESSION + "/state",
        data=json.dumps(state_input()).encode(),
        headers=bearer("model-service") | JSON,
        timeout=30,
    )
    check(answer, frozenset({200, 201}), "seed write")


def measure(served: Served, args: argparse.Namespace) -> dict[str, Any]:
    url, pid = served.url, served.process.pid
    read = Request("GET", SESSION + "/state", bearer("model-service"))
    reads = load(url, read, args.clients, args, "reads")
    healthz = load(url, Request("GET", HEALTHZ), args.clients, args, "healthz")
    scrapes = load(url, Request("GET", METRICS), SCRAPERS, args, "metrics")
    probes = replace(healthz, connections=args.probe_clients, what="healthz beside reads")
    scrape = replace(scrapes, connections=1, what="metrics beside reads")
    found: dict[str, Any] = {}
    found["healthz"] = measured_together([healthz], args.warmup, pid)
    found["metrics"] = measured_together([scrapes], args.warmup, pid)
    found["reads"] = measured_together([reads], args.warmup, pid)
    found["reads+healthz"] = measured_together([reads, probes], args.warmup, pid)
    found["reads+metrics"] = measured_together([reads, scrape], args.warmup, pid)
    return found


def measured_service(opa: str, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    with Instances(opa, tmp) as instances:
        try:
            served = instances.start()
            seeded(served)
            found = measure(served, args)
        except (BenchFailure, LoadFailure) as failure:
            raise BenchFailure(f"{failure}\n{stopped_report(instances.stop_all())}") from None
        stopped = instances.stop_all()
    if any(code != 0 for _, code in stopped):
        raise BenchFailure("the service did not stop cleanly:\n" + stopped_report(stopped))
    return found


ROWS = {
    "healthz": ["GET /healthz alone"],
    "metrics": [f"GET /metrics alone, {SCRAPERS} conn"],
    "reads": ["GET S/state alone"],
    "reads+healthz": ["GET S/state, with probes", "  GET /healthz, beside the reads"],
    "reads+metrics": ["GET S/state, with a scraper", "  GET /metrics, beside the reads"],
}


def print_report(report: dict[str, Any]) -> None:
    settings = report["settings"]
    print(
        f"served: hypercorn, its OPA sidecar, durable writes, rate limits off; reads at "
        f"{settings['clients']} conn, probes beside them at {settings['probe_clients']}; "
        f"{settings['seconds']} s per figure after {settings['warmup']} s warm-up; CPU ms per "
        "request (utime + stime from /proc / requests, both loads of a pair): service / OPA"
    )
    print(f"{'figure':<40}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'CPU svc/OPA':>14}")
    for key, labels in ROWS.items():
        for label, figure in zip(labels, report["figures"][key], strict=True):
            cell = cpu_cell(figure) if "cpu_ms_per_request" in figure else ""
            print(
                f"{label:<40}{figure['requests_per_second']:>10,.0f}{figure['p50_ms']:>9.3f}"
                f"{figure['p99_ms']:>9.3f}{cell:>14}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=10, help="wrk duration per figure")
    parser.add_argument("--clients", type=int, default=16, help="connections of the reads")
    parser.add_argument("--probe-clients", type=int, default=2, help="probes beside the reads")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded seconds per figure")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    if min(args.seconds, args.clients, args.probe_clients) < 1 or args.warmup < 0:
        parser.error(
            "--seconds, --clients and --probe-clients must be 1 or more, --warmup 0 or more"
        )
    exit_on_sigterm()
    opa = Settings().resolved_opa_bin()
    with tempfile.TemporaryDirectory(prefix="probe-bench-") as tmp_name:
        try:
            figures = measured_service(opa, Path(tmp_name), args)
        except (BenchFailure, LoadFailure) as failure:
            sys.exit(f"probe bench aborted: {failure}")
    settings = {
        key: getattr(args, key) for key in ("seconds", "clients", "probe_clients", "warmup")
    }
    report = {"settings": settings, "figures": figures}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)


if __name__ == "__main__":
    main()
