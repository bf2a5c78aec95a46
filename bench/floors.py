"""The floors the service is measured against, in the same run (bench/service_bench.py).

- `hello_world`: a hello-world Flask app served exactly as `sessionstate serve`
  serves the service: hypercorn on one listening socket, the same front
  (`BoundedWSGIWrapper`, `front_config` with the default timeouts), the same
  pool of `service.runtime.serving.THREADS` request threads, in a process of its own
  (`python bench/floors.py hello-world PORT`).
- `governed_floor`: the least a governed read does, served the same way: a
  Flask route that asks the service's own `PolicyClient` (keep-alive transport)
  for one read decision and appends one synced LevelDB put of a decision
  entry's size before answering (`python bench/floors.py governed PORT OPA_URL
  DIR`, a TCP sidecar's token in `SESSIONSTATE_BENCH_OPA_TOKEN`). Nothing else
  of a read: no token, record, chain, answer document, log line or metric. Its
  OPA is `socket_sidecar`'s, as the service's own.
- `opa_sidecar`: an OPA sidecar over policies/, configured as the service's
  own but on loopback TCP with token and authz (wrk cannot reach a Unix
  socket), and the request of a raw read decision (POST straight at its
  /v1/data/sessionstate/read/decision with the read's allowed input, the
  query the service's `PolicyClient` sends).
- `socket_sidecar`: the sidecar exactly as the service starts its own, on a
  Unix socket in a private directory, without token or authz.
- `leveldb_floor`: raw plyvel get and synced put of a stored record's bytes,
  in-process, at 1 and N threads.

`hello_world` and `governed_floor` give the floor's URL and the pid of its
process, whose CPU the bench reads from /proc (bench/process_cpu.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plyvel
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loadgen import Request
from bench.processes import held_signals, stop_group
from service.api.v1 import DECISION_PACKAGES
from service.policy.sidecar import OpaSidecar
from store.canonical import canonical_json
from store.digests import DigestKey
from store.session_state import state_key
from tests.support.factories import record
from tests.support.policy_inputs import allowed_input

ROOT = Path(__file__).resolve().parent.parent
ENTRY_BYTES = 1200  # about a read's decision entry as the journal stores it
TOKEN_VARIABLE = "SESSIONSTATE_BENCH_OPA_TOKEN"


class FloorFailure(RuntimeError):
    """A floor could not be measured as it should (not served, denied): the run stops."""


@dataclass(frozen=True)
class Floor:
    """A floor served in a process of its own: where it answers, and its process."""

    url: str
    pid: int


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_answering(url: str, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Until GET url answers 200; `FloorFailure` if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            if requests.get(url, timeout=1).status_code == 200:
                return
        if process.poll() is not None:
            break
        time.sleep(0.1)
    raise FloorFailure(f"{url} did not answer")


@contextlib.contextmanager
def served_floor(
    what: str, kind: str, *arguments: str, env: dict[str, str] | None = None
) -> Iterator[Floor]:
    """`floors.py KIND PORT ARGUMENTS...` in a process (and process group) of its own: its
    URL and pid."""
    port = free_port()
    process: subprocess.Popen[bytes] | None = None
    try:
        with held_signals():
            process = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), kind, str(port), *arguments],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                env=None if env is None else os.environ | env,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}"
        wait_answering(url + "/", process)
        yield Floor(url, process.pid)
    finally:
        if process is not None:
            stop_group(process, 15, what)


def hello_world() -> contextlib.AbstractContextManager[Floor]:
    """The hello-world floor, served: its URL and pid."""
    return served_floor("hello-world floor", "hello-world")


def governed_floor(
    opa_url: str, token: str | None, work_dir: Path, settings: dict[str, str] | None = None
) -> contextlib.AbstractContextManager[Floor]:
    """The governed floor, served over the OPA at opa_url and LevelDB in work_dir (with
    `settings`, service settings such as SESSIONSTATE_OPA_GROUPED): its URL and pid."""
    env = {} if token is None else {TOKEN_VARIABLE: token}
    return served_floor(
        "governed floor", "governed", opa_url, str(work_dir), env={**env, **(settings or {})}
    )


def serve_flask(flask_app: Any, port: int) -> None:
    """What `service.runtime.serving.serve_http` does, with flask_app for the app."""
    from hypercorn.asyncio.run import worker_serve

    from service.config.settings import Settings
    from service.http.front import BoundedWSGIWrapper, front_config
    from service.runtime import serving_heap
    from service.runtime.listeners import listen
    from service.runtime.serving import GRACEFUL_SECONDS, THREADS, raise_open_file_limit

    settings = Settings()  # the defaults: the service's timeouts
    listener = listen("127.0.0.1", port)
    raise_open_file_limit()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(THREADS, thread_name_prefix="request"))
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        app = BoundedWSGIWrapper(flask_app, body_timeout=settings.body_timeout_seconds)
        config = front_config(
            bind=f"fd://{listener.detach()}",
            read_timeout=settings.read_timeout_seconds,
            keep_alive_timeout=settings.keep_alive_seconds,
            graceful_timeout=GRACEFUL_SECONDS,
        )
        serving_heap.settle()  # as the service does
        await worker_serve(app, config, shutdown_trigger=stop.wait)

    asyncio.run(serve())


def serve_hello_world(port: int) -> None:
    from flask import Flask

    flask_app = Flask("hello")

    @flask_app.get("/")
    def hello() -> str:
        return "Hello, World!"

    serve_flask(flask_app, port)


def serve_governed(port: int, opa_url: str, store_dir: str) -> None:
    """Each request: one read decision as the service asks it, then one synced append."""
    from flask import Flask

    from service.config.settings import Settings
    from service.policy.client import PolicyClient

    client = PolicyClient(
        opa_url,
        os.environ.get(TOKEN_VARIABLE),
        timeout=Settings().opa_timeout_ms / 1000,
        transport="keep-alive",
        grouped=Settings().opa_grouped,
    )
    db = plyvel.DB(store_dir, create_if_missing=True, paranoid_checks=True, compression=None)
    question = allowed_input("read")
    entry = b"e" * ENTRY_BYTES
    sequence = itertools.count(1)
    flask_app = Flask("governed")

    @flask_app.get("/")
    def governed() -> tuple[str, int]:
        if not client.decide(question).allow:
            return "denied", 503
        db.put(next(sequence).to_bytes(8, "big"), entry, sync=True)
        return "Hello, World!", 200

    serve_flask(flask_app, port)


@contextlib.contextmanager
def socket_sidecar(opa: str, work_dir: Path) -> Iterator[OpaSidecar]:
    """A sidecar over policies/ exactly as the service starts its own (a Unix socket in a
    private directory, no token or authz)."""
    sidecar = OpaSidecar(opa, ROOT / "policies", work_dir)
    try:
        sidecar.start()
        yield sidecar
    finally:
        sidecar.stop()


@contextlib.contextmanager
def opa_sidecar(opa: str, work_dir: Path) -> Iterator[tuple[OpaSidecar, Request]]:
    """A sidecar over policies/ (as the service starts its own, but on loopback TCP with
    token and authz, where wrk can reach it), and the request of the raw read decision,
    checked once to be allowed."""
    sidecar = OpaSidecar(opa, ROOT / "policies", work_dir, listen="tcp")
    try:
        sidecar.start()
        path = f"/v1/data/sessionstate/{DECISION_PACKAGES['read']}/decision?provenance=true"
        body = json.dumps(
            {"input": allowed_input("read").model_dump(mode="json", by_alias=True)}
        ).encode()
        headers = {"Authorization": f"Bearer {sidecar.token}", "Content-Type": "application/json"}
        answer = requests.post(sidecar.url + path, data=body, headers=headers, timeout=5)
        if answer.status_code != 200 or answer.json().get("result", {}).get("allow") is not True:
            raise FloorFailure(f"raw OPA read decision: {answer.status_code}, not allowed")
        yield sidecar, Request("POST", path, headers, body)
    finally:
        sidecar.stop()


def timed_threads(operations: Sequence[Callable[[], object]], seconds: float) -> dict[str, float]:
    """ops/s, p50 and p99 in ms of one thread per operation, each calling its own in a
    loop for `seconds`."""
    samples: list[list[float]] = [[] for _ in operations]
    failures: list[BaseException] = []
    start = threading.Barrier(len(operations) + 1)
    deadline = [0.0]

    def work(operation: Callable[[], object], mine: list[float]) -> None:
        start.wait()
        try:
            while (began := time.perf_counter()) < deadline[0]:
                operation()
                mine.append((time.perf_counter() - began) * 1000)
        except BaseException as error:  # the run stops, and says why
            failures.append(error)
            deadline[0] = 0.0

    workers = [
        threading.Thread(target=work, args=(operation, mine), daemon=True)
        for operation, mine in zip(operations, samples, strict=True)
    ]
    for worker in workers:
        worker.start()
    began = time.perf_counter()
    deadline[0] = began + seconds
    start.wait()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    if failures:
        raise FloorFailure(f"an operation failed: {failures[0]!r}")
    every = sorted(sample for mine in samples for sample in mine)
    if not every:
        raise FloorFailure("no operation completed")
    return {
        "requests_per_second": round(len(every) / elapsed, 1),
        "p50_ms": round(statistics.median(every), 4),
        "p99_ms": round(every[min(len(every) - 1, int(0.99 * len(every)))], 4),
        "requests": len(every),
    }


def leveldb_floor(
    work_dir: Path, digest_key: str, clients: tuple[int, ...], seconds: float
) -> tuple[dict[str, dict[int, dict[str, float]]], int]:
    """Raw plyvel get and synced put (the options of `LevelDBLaneStore`) of a built record's
    bytes, at each client count: {"get"/"put": {clients: figures}}, and the record size."""
    built = record(DigestKey(digest_key.encode()))
    value = canonical_json(built.to_json())
    key = state_key(built.scope).encode()
    db = plyvel.DB(str(work_dir), create_if_missing=True, paranoid_checks=True, compression=None)
    found: dict[str, dict[int, dict[str, float]]] = {"get": {}, "put": {}}
    try:
        db.put(key, value, sync=True)
        for count in clients:
            found["get"][count] = timed_threads([lambda: db.get(key)] * count, seconds)
            found["put"][count] = timed_threads(
                [lambda: db.put(key, value, sync=True)] * count, seconds
            )
    finally:
        db.close()
    return found, len(value)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "hello-world":
        serve_hello_world(int(sys.argv[2]))
    elif len(sys.argv) == 5 and sys.argv[1] == "governed":
        serve_governed(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        sys.exit("usage: floors.py hello-world PORT | floors.py governed PORT OPA_URL DIR")
