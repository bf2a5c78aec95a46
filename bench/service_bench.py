"""The governed hot path beside its floors, measured with wrk in the same run (issue 14).

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
  /v1/data/sessionstate/read/decision, the read decision's input);
- hello-world Flask served exactly as the service is (hypercorn, the same
  front, the same thread count and timeouts: bench/floors.py);
- raw LevelDB get and synced put (plyvel, in-process, a stored record's bytes,
  1 and 16 threads).

Every answer must have its expected status (200; 200 or 201 for a write) and
no socket may fail, or the run stops. It prints req/s, p50 and p99 of each at
1 and 16, then the issue's targets beside the figures of this run (printed,
never asserted): reads >= 0.3x hello-world req/s at 16; one-client read p50
<= 2x (raw OPA p50 + hello-world p50); each operation's p99 at 16 <= 50 ms;
reads and replay-previews >= 1,000 req/s, previews >= 700, writes >= 500.
Each figure is preceded by an unrecorded warm-up of `--warmup` seconds.

Run (needs `wrk`: `make wrk` installs it as root; `make bench` runs every bench):

    SESSIONSTATE_OPA_BIN=$(scripts/tools.sh opa) .venv/bin/python bench/service_bench.py \\
        [--seconds 10] [--clients 16] [--warmup 1] [--wrk-threads 1] [--json]

`--json` prints one JSON document (figures, targets, settings) instead of
the table, to copy figures into docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import floors
from bench.loadgen import Load, LoadFailure, Request, Result, run
from bench.processes import exit_on_sigterm, held_signals, stop_group
from service.auth import mint_token
from service.serve import GRACEFUL_SECONDS, THREADS
from service.settings import Settings
from tests.factories import state_input

ROOT = Path(__file__).resolve().parent.parent
JWT_SECRET = "jwt-secret-for-service-bench-0123456789abcdef"
DIGEST_KEY = "digest-key-for-service-bench-0123456789abcdef"
TENANT = "tenant-a"
WORKSPACE = f"/v1/tenants/{TENANT}/workspaces/ws-1"
SESSION = WORKSPACE + "/sessions/chat-1"
JSON = {"Content-Type": "application/json"}
OK = frozenset({200})


class BenchFailure(RuntimeError):
    """A request did not get its expected answer; the run stops."""


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
    "opa": "raw OPA, read decision, keep-alive",
    "hello-world": "hello-world Flask, same hypercorn settings",
    "leveldb-get": "raw LevelDB get (in-process)",
    "leveldb-put": "raw LevelDB synced put (in-process)",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Served:
    """`python -m service.cli serve` in its own process group, stopped with SIGTERM.

    Durable writes on, rate limits off, its own OPA sidecar, data in `data_dir`
    (default tmp/var); `extra_env` adds settings (e.g. SESSIONSTATE_STORE).
    """

    def __init__(
        self,
        opa: str,
        tmp: Path,
        *,
        data_dir: Path | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"serve-{self.port}.log"
        env = {
            key: value for key, value in os.environ.items() if not key.startswith("SESSIONSTATE_")
        }
        env |= {
            "SESSIONSTATE_DATA_DIR": str(data_dir or tmp / "var"),
            "SESSIONSTATE_PORT": str(self.port),
            "SESSIONSTATE_DURABLE_WRITES": "true",
            "SESSIONSTATE_JWT_SECRET": JWT_SECRET,
            "SESSIONSTATE_DIGEST_KEY": DIGEST_KEY,
            "SESSIONSTATE_OPA_BIN": opa,
            # Every client is one actor: its rate limits would be measured, not the service.
            "SESSIONSTATE_RATE_LIMIT": "off",
            "SESSIONSTATE_DENIAL_RATE_LIMIT": "off",
        }
        env |= extra_env or {}
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "service.cli", "serve"],
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(requests.RequestException):
                if requests.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise BenchFailure("the service did not become ready:\n" + self.log_tail())

    def stop(self, timeout: float = GRACEFUL_SECONDS + 5) -> int | None:
        """SIGTERM, wait; SIGKILL the process group if it lingers (a clean stop takes at
        most the service's graceful period). The exit code."""
        return stop_group(self.process, timeout, f"service on port {self.port}")


class Instances:
    """The service processes a bench started: every one is stopped on the way out of the
    `with` block, however it is left (an error, Ctrl-C, SIGTERM after `exit_on_sigterm`)."""

    def __init__(self, opa: str, tmp: Path) -> None:
        self.opa = opa
        self.tmp = tmp
        self.running: list[Served] = []

    def start(self, **options: Any) -> Served:
        """A new instance (options as `Served`'s), once it is ready."""
        with held_signals():
            served = Served(self.opa, self.tmp, **options)
            self.running.append(served)
        served.wait_ready()
        return served

    def stop_all(self) -> list[tuple[Served, int | None]]:
        """Stop every instance still running; each with its exit code."""
        stopped = [(served, served.stop()) for served in self.running]
        self.running = []
        return stopped

    def __enter__(self) -> Instances:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop_all()


def token(role: str, session: str = "chat-1") -> str:
    """A token for role: an operator of tenant-a, or the model service of one session."""
    model_service = role == "model-service"
    return mint_token(
        JWT_SECRET.encode(),
        sub="bench",
        roles=[role],
        tenant=TENANT,
        workspace="ws-1" if model_service else None,
        session=session if model_service else None,
        ttl_seconds=3600,
    )


def bearer(role: str, session: str = "chat-1") -> dict[str, str]:
    return {"Authorization": f"Bearer {token(role, session)}"}


def check(answer: requests.Response, expected: frozenset[int], what: str) -> None:
    if answer.status_code not in expected:
        wanted = "/".join(str(code) for code in sorted(expected))
        raise BenchFailure(
            f"{what}: expected {wanted}, got {answer.status_code}: {answer.text[:300]}"
        )


def grant_approval(url: str) -> None:
    """A workspace-wide approval, so writes and previews of every session are allowed."""
    granted = requests.post(
        url + WORKSPACE + "/approvals",
        json={"ttl_seconds": 3600, "reason": "bench"},
        headers=bearer("operator"),
        timeout=30,
    )
    check(granted, frozenset({201}), "approval grant")


def request_of(operation: Operation, auth: dict[str, str]) -> Request:
    headers = auth | (JSON if operation.body is not None else {})
    return Request(operation.method, operation.path, headers, operation.body)


def measured(load: Load, warmup: int) -> Result:
    """An unrecorded warm-up of `warmup` seconds (checked all the same), then the figure."""
    if warmup > 0:
        run(replace(load, seconds=warmup, what=load.what + " warm-up"))
    return run(load)


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


def measure_service(opa: str, tmp: Path, args: argparse.Namespace) -> dict[str, dict[int, Any]]:
    found: dict[str, dict[int, Any]] = {}
    with Instances(opa, tmp) as instances:
        try:
            served = instances.start()
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
                    found.setdefault(op.key, {})[clients] = measured(load, args.warmup).figures()
        except (BenchFailure, LoadFailure) as failure:
            raise BenchFailure(f"{failure}\n{stopped_report(instances.stop_all())}") from None
        stopped = instances.stop_all()
    if any(code != 0 for _, code in stopped):
        raise BenchFailure("the service did not stop cleanly:\n" + stopped_report(stopped))
    return found


def stopped_report(stopped: list[tuple[Served, int | None]]) -> str:
    """Each stopped instance's exit code and the end of its log."""
    return "\n".join(
        f"service on port {served.port} exited with {code}; its log ends:\n{served.log_tail()}"
        for served, code in stopped
    )


def measure_floors(
    opa: str, tmp: Path, args: argparse.Namespace
) -> tuple[dict[str, dict[int, Any]], int]:
    found: dict[str, dict[int, Any]] = {"opa": {}, "hello-world": {}}
    counts = (1, args.clients)
    with floors.opa_sidecar(opa, tmp / "floor-opa") as (url, decision):
        for clients in counts:
            load = wrk_load(url, decision, clients, args, f"raw OPA at {clients} connections")
            found["opa"][clients] = measured(load, args.warmup).figures()
    with floors.hello_world() as hello:
        for clients in counts:
            load = wrk_load(hello, Request(), clients, args, f"hello-world at {clients}")
            found["hello-world"][clients] = measured(load, args.warmup).figures()
    leveldb, size = floors.leveldb_floor(tmp / "floor-leveldb", DIGEST_KEY, counts, args.seconds)
    found["leveldb-get"], found["leveldb-put"] = leveldb["get"], leveldb["put"]
    return found, size


def targets(figures: dict[str, dict[int, Any]], clients: int) -> list[dict[str, Any]]:
    """The issue's targets beside this run's figures: name, value, bound, met."""

    def rate(key: str) -> float:
        return float(figures[key][clients]["requests_per_second"])

    def target(name: str, value: float, bound: float, at_least: bool) -> dict[str, Any]:
        met = value >= bound if at_least else value <= bound
        return {
            "target": name,
            "value": round(value, 3),
            "bound": bound,
            "at_least": at_least,
            "met": met,
        }

    read_floor = figures["opa"][1]["p50_ms"] + figures["hello-world"][1]["p50_ms"]
    found = [
        target(
            f"read req/s / hello-world req/s, {clients} conn",
            rate("read") / rate("hello-world"),
            0.3,
            True,
        ),
        target(
            "read p50 / (raw OPA p50 + hello-world p50), 1 conn",
            figures["read"][1]["p50_ms"] / read_floor,
            2.0,
            False,
        ),
    ]
    for key, bound in (("read", 1000), ("replay-preview", 1000), ("preview", 700), ("write", 500)):
        found.append(target(f"{key} req/s, {clients} conn", rate(key), bound, True))
    for op in operations():
        found.append(
            target(
                f"{op.key} p99 ms, {clients} conn", figures[op.key][clients]["p99_ms"], 50, False
            )
        )
    return found


def ms(value: float) -> str:
    """Milliseconds to three decimals; a figure under 10 µs to four."""
    return f"{value:.4f}" if value < 0.01 else f"{value:.3f}"


def print_report(report: dict[str, Any]) -> None:
    settings, figures = report["settings"], report["figures"]
    counts = (1, settings["clients"])
    print(
        f"served: hypercorn, one process x {settings['threads']} threads, OPA sidecar, durable "
        f"writes, rate limits off; record {settings['record_bytes']} bytes; wrk "
        f"{settings['wrk_threads']} thread(s), {settings['seconds']} s per figure after "
        f"{settings['warmup']} s warm-up; {settings['cpus']} CPUs shared by wrk, service and OPA"
    )
    head = "".join(f"{f'{n} conn: req/s':>16}{'p50 ms':>9}{'p99 ms':>9}" for n in counts)
    print(f"{'figure':<44}{head}")
    labels = {op.key: op.label for op in operations()} | FLOOR_LABELS
    for key, label in labels.items():
        cells = "".join(
            f"{figures[key][n]['requests_per_second']:>16,.0f}{ms(figures[key][n]['p50_ms']):>9}"
            f"{ms(figures[key][n]['p99_ms']):>9}"
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
