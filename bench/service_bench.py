"""End-to-end latency of the served process beside its floor, measured in the same run.

Starts the real `sessionstate serve` (hypercorn, one process, 16 threads,
its own OPA sidecar, LevelDB in a temporary dir, durable writes enabled),
grants a workspace approval, stores one record, then drives four operations
over loopback HTTP: preview (POST S/state/preview), write (PUT S/state with a
fixed body, so each request replaces the record), read (GET S/state) and
replay-preview (POST S/replay-preview). Each runs at 1 and at 16 concurrent
clients (threads, each with its own requests.Session and a fixed number of
requests, after a short untimed warm-up); every response must carry its
expected status or the run aborts. Prints p50/p99 latency, requests/s, and the
p50 overhead ratio against a floor measured beforehand in the same run:

- OPA: `PolicyClient.decide` against its own sidecar over policies/, with the
  allowed input of the operation's action, at 1 client;
- LevelDB: raw plyvel get and synced put (same options as `LaneStore`) of the
  bytes of a built record, at 1 client.

floor p50 = OPA p50 of the action + LevelDB get p50 (the record read of read
and replay, the approval lookup of preview), + synced put p50 for write (which
does the approval lookup and the compare-and-set read too).

Run: `make bench` or `.venv/bin/python bench/service_bench.py [--requests 200
--concurrent-requests 50 --floor-requests 1000]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import plyvel
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.auth import mint_token
from service.policy.client import PolicyClient
from service.policy.input import PolicyInput
from service.policy.sidecar import OpaSidecar
from service.settings import Settings
from store.canonical import canonical_json
from store.digests import DigestKey
from store.session_state import state_key
from tests.factories import record, state_input
from tests.policy_inputs import allowed_input

ROOT = Path(__file__).resolve().parent.parent
JWT_SECRET = "jwt-secret-for-service-bench-0123456789abcdef"
DIGEST_KEY = "digest-key-for-service-bench-0123456789abcdef"
WORKSPACE = "/v1/tenants/tenant-a/workspaces/ws-1"
SESSION = WORKSPACE + "/sessions/chat-1"
JSON = {"Content-Type": "application/json"}


class BenchFailure(RuntimeError):
    """A request did not get its expected answer; the run stops."""


@dataclass(frozen=True)
class Operation:
    name: str
    method: str
    path: str
    body: bytes | None
    expected: frozenset[int]
    action: str  # the policy action, for the OPA floor
    synced_put: bool  # the floor adds a synced put


@dataclass(frozen=True)
class Figures:
    p50: float
    p99: float


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def figures(samples: list[float]) -> Figures:
    return Figures(statistics.median(samples), percentile(samples, 0.99))


def timed(operation: Callable[[], object], count: int, warmup: int) -> Figures:
    """p50/p99 in ms of operation() called count times after warmup untimed calls."""
    for _ in range(warmup):
        operation()
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        operation()
        samples.append((time.perf_counter() - started) * 1000)
    return figures(samples)


def opa_floor(opa: str, actions: list[str], count: int, tmp: Path) -> dict[str, Figures]:
    """Decision round trip through PolicyClient, per action, at 1 client."""
    sidecar = OpaSidecar(opa, ROOT / "policies", tmp / "floor-opa")
    sidecar.start()
    client = PolicyClient(sidecar.url, sidecar.token, timeout=1.0)
    try:
        found: dict[str, Figures] = {}
        for action in actions:
            policy_input = allowed_input(action)

            def decide(policy_input: PolicyInput = policy_input) -> None:
                trace = client.decide(policy_input)
                if not trace.allow:
                    raise BenchFailure(f"OPA floor: {trace.action} denied: {trace.reasons}")

            found[action] = timed(decide, count, warmup=50)
        return found
    finally:
        client.close()
        sidecar.stop()


def leveldb_floor(count: int, tmp: Path) -> tuple[Figures, Figures, int]:
    """Raw plyvel get and synced put of a built record's bytes, at 1 client."""
    built = record(DigestKey(DIGEST_KEY.encode()))
    value = canonical_json(built.to_json())
    key = state_key(built.scope).encode()
    db = plyvel.DB(
        str(tmp / "floor-leveldb"), create_if_missing=True, paranoid_checks=True, compression=None
    )
    try:
        db.put(key, value, sync=True)
        get = timed(lambda: db.get(key), count, warmup=100)
        put = timed(lambda: db.put(key, value, sync=True), count, warmup=10)
    finally:
        db.close()
    return get, put, len(value)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Served:
    """`python -m service.cli serve` in its own process group, stopped with SIGTERM."""

    def __init__(self, opa: str, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "serve.log"
        env = {
            key: value for key, value in os.environ.items() if not key.startswith("SESSIONSTATE_")
        }
        env |= {
            "SESSIONSTATE_DATA_DIR": str(tmp / "var"),
            "SESSIONSTATE_PORT": str(self.port),
            "SESSIONSTATE_DURABLE_WRITES": "true",
            "SESSIONSTATE_JWT_SECRET": JWT_SECRET,
            "SESSIONSTATE_DIGEST_KEY": DIGEST_KEY,
            "SESSIONSTATE_OPA_BIN": opa,
            # Every client is one actor: its rate limits would be measured, not the service.
            "SESSIONSTATE_RATE_LIMIT": "off",
            "SESSIONSTATE_DENIAL_RATE_LIMIT": "off",
        }
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "service.cli", "serve"],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise BenchFailure("the service did not become ready:\n" + self.log_tail())

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, wait; SIGKILL the process group if it lingers. The exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"service still running {timeout:.0f}s after SIGTERM: killing its group")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        return self.process.wait()


def token(role: str) -> str:
    """A token for role: an operator of tenant-a, or the model service of chat-1."""
    session = role == "model-service"
    return mint_token(
        JWT_SECRET.encode(),
        sub="bench",
        roles=[role],
        tenant="tenant-a",
        workspace="ws-1" if session else None,
        session="chat-1" if session else None,
        ttl_seconds=3600,
    )


def check(answer: requests.Response, expected: frozenset[int], what: str) -> None:
    if answer.status_code not in expected:
        wanted = "/".join(str(code) for code in sorted(expected))
        raise BenchFailure(
            f"{what}: expected {wanted}, got {answer.status_code}: {answer.text[:300]}"
        )


def send(http: requests.Session, url: str, operation: Operation, what: str) -> None:
    answer = http.request(
        operation.method,
        url + operation.path,
        data=operation.body,
        headers=JSON if operation.body is not None else None,
        timeout=30,
    )
    check(answer, operation.expected, what)


def drive(
    url: str, operation: Operation, clients: int, per_client: int, warmup: int, auth: str
) -> tuple[Figures, float]:
    """p50/p99 in ms and requests/s of operation at `clients` concurrent clients."""
    samples: list[list[float]] = [[] for _ in range(clients)]
    failures: list[BaseException] = []
    stop = threading.Event()
    start = threading.Barrier(clients + 1)

    def client(number: int) -> None:
        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {auth}"
        mine = samples[number]
        try:
            for i in range(warmup):
                send(http, url, operation, f"{operation.name} warm-up {i}")
            start.wait()
            for i in range(per_client):
                if stop.is_set():
                    return
                what = f"{operation.name} at {clients} clients, client {number} request {i}"
                started = time.perf_counter()
                send(http, url, operation, what)
                mine.append((time.perf_counter() - started) * 1000)
        except threading.BrokenBarrierError:
            pass
        except BaseException as error:
            failures.append(error)
            stop.set()
            start.abort()
        finally:
            http.close()

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    if failures:
        error = failures[0]
        if isinstance(error, BenchFailure):
            raise error
        raise BenchFailure(f"{operation.name} at {clients} clients: {error!r}") from error
    every = [sample for mine in samples for sample in mine]
    return figures(every), len(every) / elapsed


def operations() -> list[Operation]:
    ok = frozenset({200})
    body = json.dumps(state_input()).encode()
    return [
        Operation("preview", "POST", SESSION + "/state/preview", body, ok, "preview", False),
        Operation("write", "PUT", SESSION + "/state", body, frozenset({200, 201}), "write", True),
        Operation("read", "GET", SESSION + "/state", None, ok, "read", False),
        Operation(
            "replay-preview",
            "POST",
            SESSION + "/replay-preview",
            json.dumps({"max_inputs": 16}).encode(),
            ok,
            "replay",
            False,
        ),
    ]


def prepare(url: str, write: Operation) -> None:
    """A workspace-wide approval, and one stored record for read and replay."""
    with requests.Session() as http:
        granted = http.post(
            url + WORKSPACE + "/approvals",
            json={"ttl_seconds": 3600, "reason": "service bench"},
            headers={"Authorization": f"Bearer {token('operator')}"},
            timeout=30,
        )
        check(granted, frozenset({201}), "approval grant")
        http.headers["Authorization"] = f"Bearer {token('model-service')}"
        send(http, url, write, "seed write")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=200, help="requests per client at c=1")
    parser.add_argument(
        "--concurrent-requests", type=int, default=50, help="requests per client at c=16"
    )
    parser.add_argument("--clients", type=int, default=16, help="the concurrent client count")
    parser.add_argument("--warmup", type=int, default=5, help="untimed requests per client")
    parser.add_argument("--floor-requests", type=int, default=1000, help="samples per floor figure")
    args = parser.parse_args()
    opa = Settings().resolved_opa_bin()
    ops = operations()
    auth = token("model-service")
    rows = []

    with tempfile.TemporaryDirectory(prefix="service-bench-") as tmp_name:
        tmp = Path(tmp_name)
        opa_p = opa_floor(opa, [op.action for op in ops], args.floor_requests, tmp)
        get, put, size = leveldb_floor(args.floor_requests, tmp)

        served = Served(opa, tmp)
        try:
            served.wait_ready()
            prepare(served.url, ops[1])
            for clients, per_client in (
                (1, args.requests),
                (args.clients, args.concurrent_requests),
            ):
                for op in ops:
                    latency, rate = drive(served.url, op, clients, per_client, args.warmup, auth)
                    floor = opa_p[op.action].p50 + get.p50 + (put.p50 if op.synced_put else 0.0)
                    rows.append((op.name, clients, clients * per_client, latency, rate, floor))
        except BenchFailure as failure:
            code = served.stop()
            sys.exit(f"service bench aborted: {failure}\n(service exit code {code})")
        code = served.stop()
        if code != 0:
            sys.exit(f"service exited with {code} after SIGTERM:\n{served.log_tail()}")

    print(
        f"served: hypercorn, one process x 16 threads, OPA sidecar, durable writes; "
        f"record {size} bytes; {os.cpu_count()} CPUs shared by clients, service and OPA"
    )
    print(
        f"{'operation':<16}{'clients':>8}{'requests':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'req/s':>9}{'floor p50':>11}{'p50/floor':>11}"
    )
    for name, clients, count, latency, rate, floor in rows:
        print(
            f"{name:<16}{clients:>8}{count:>10}{latency.p50:>9.2f}{latency.p99:>9.2f}"
            f"{rate:>9.0f}{floor:>11.2f}{latency.p50 / floor:>10.1f}x"
        )
    print(f"\nfloor, 1 client, {args.floor_requests} samples each")
    print(f"{'component':<34}{'p50 ms':>9}{'p99 ms':>9}")
    for op in ops:
        label = f"OPA decide ({op.action})"
        print(f"{label:<34}{opa_p[op.action].p50:>9.4f}{opa_p[op.action].p99:>9.4f}")
    print(f"{'LevelDB get':<34}{get.p50:>9.4f}{get.p99:>9.4f}")
    print(f"{'LevelDB synced put':<34}{put.p50:>9.4f}{put.p99:>9.4f}")


if __name__ == "__main__":
    main()
