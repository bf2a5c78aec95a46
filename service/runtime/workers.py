"""`serve --workers N`: N worker processes on one port, one OPA sidecar for all.

The parent (`service.runtime.process`) holds the data dir, binds the port and
starts the sidecar (and its bundle server) once; then it spawns N workers, each a
`python -m service.runtime.workers FD` process that inherits a listening socket of
its own, opens its own `ServiceContext` (its own store connections, journal
and group commit) against the parent's sidecar, and serves HTTP with
hypercorn as a single process does. The N sockets listen on the one port with
SO_REUSEPORT, so the kernel spreads new connections over them evenly (by a
hash of each connection's addresses and ports): from one socket that every
worker accepted from, whichever worker woke first accepted every waiting
connection, and under keep-alive load one worker answered everything. The
parent keeps each worker's socket open, so connections waiting in the
backlog of a worker that died are accepted by the worker started in its place.
Workers die with the parent even on SIGKILL (PR_SET_PDEATHSIG), a worker that
dies is started again, and SIGTERM or SIGINT to the parent stops every worker
gracefully (SIGTERM, then SIGKILL after the grace period). Only a store that
several processes may open (PostgreSQL) admits more than one worker.

To clients and to Prometheus the workers are one service. The parent makes the workers'
directory in the data dir afresh at each start (`workers/`, the parent's and its workers'
alone): prometheus-client's multiprocess mode keeps every worker's metrics in `metrics/`
(PROMETHEUS_MULTIPROC_DIR), which any worker's `/metrics` adds up; the parent publishes its
policy health in `policy-health.json` (`service.policy.health`), which every worker's
`/readyz` and `/metrics` tell; and each worker beats in `beats/`, so any worker's `/readyz`
covers all of them (`service.runtime.worker_beats`). When a worker dies, the parent drops
its live gauges (`mark_process_dead`) and its beat; its counts stay in the sums.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.multiprocess import mark_process_dead

from service.config.settings import Settings
from service.context import ServiceContext
from service.observability import tracing
from service.observability.logs import configure_logging
from service.observability.metrics import MULTIPROC_DIR_VARIABLE
from service.policy.sidecar import OpaSidecar, _die_with_parent
from service.runtime.serving import raise_open_file_limit, serve_http
from service.runtime.sidecars import Sidecars
from service.runtime.worker_beats import BEATS_DIR, WorkerBeats, forget_beat

log = logging.getLogger("sessionstate.workers")
POLL_SECONDS = 0.2
RESTART_BACKOFF_SECONDS = 1.0  # a worker that keeps dying at start is not spun in a loop
STOP_GRACE_SECONDS = 15.0
WORKERS_DIR = "workers"  # in the data dir: what the parent shares with its workers
METRICS_DIR = "metrics"
POLICY_HEALTH_FILE = "policy-health.json"


def workers_dir(data_dir: Path) -> Path:
    return data_dir / WORKERS_DIR


def fresh_workers_dir(data_dir: Path) -> Path:
    """The workers' directory, emptied: an earlier run's metrics and beats are not this one's."""
    shared = workers_dir(data_dir)
    shutil.rmtree(shared, ignore_errors=True)
    for made in (shared, shared / METRICS_DIR, shared / BEATS_DIR):
        made.mkdir(mode=0o700, exist_ok=True)
    return shared


class Workers:
    """The parent's view of its workers: spawn, restart the dead, stop them all."""

    def __init__(self, listeners: list[socket.socket], sidecars: Sidecars, shared: Path) -> None:
        self._count = count = len(listeners)  # a worker for each listening socket
        self._fds = [listener.fileno() for listener in listeners]
        for fd in self._fds:
            os.set_inheritable(fd, True)
        self._shared = shared
        # Read by prometheus-client as it is imported: each worker's metrics go to files there.
        self._env = dict(os.environ) | {MULTIPROC_DIR_VARIABLE: str(shared / METRICS_DIR)}
        sidecar, shadow = sidecars.live, sidecars.shadow
        if sidecar is not None:  # else the workers use SESSIONSTATE_OPA_URL as the parent does
            self._reach(sidecar, "SESSIONSTATE_OPA_URL", "SESSIONSTATE_OPA_TOKEN")
        if shadow is not None:  # the workers ask the parent's shadow sidecar
            self._reach(shadow, "SESSIONSTATE_SHADOW_OPA_URL", "SESSIONSTATE_SHADOW_OPA_TOKEN")
        # Without the parent's sidecar, a worker learns the live revision from OPA's answers.
        self._observes = "observe" if sidecar is None else "follow"
        self._processes: list[subprocess.Popen[bytes] | None] = [None] * count
        self._started: list[float] = [0.0] * count

    def _reach(self, sidecar: OpaSidecar, url: str, token: str) -> None:
        """The workers reach the parent's sidecar where it listens (its Unix socket, which
        the workers' user may open too: it is the parent's), with its token if it has one."""
        self._env[url] = sidecar.url
        if sidecar.token is None:
            self._env.pop(token, None)
        else:
            self._env[token] = sidecar.token

    def start(self) -> None:
        for slot in range(self._count):
            self._spawn(slot)

    def _spawn(self, slot: int) -> None:
        fd = self._fds[slot]
        process = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            [
                sys.executable,
                "-m",
                "service.runtime.workers",
                str(fd),
                str(slot),
                str(self._count),
                self._observes,
            ],
            env=self._env,
            stdin=subprocess.DEVNULL,
            pass_fds=(fd,),
            preexec_fn=_die_with_parent,
        )
        self._processes[slot] = process
        self._started[slot] = time.monotonic()
        log.info("worker_started", extra={"worker": slot, "pid": process.pid})

    def supervise(self, stop: threading.Event) -> None:
        """Restart workers that die, until stop is set."""
        while not stop.wait(POLL_SECONDS):
            for slot, process in enumerate(self._processes):
                if process is None or process.poll() is None:
                    continue
                log.error("worker_died", extra={"worker": slot, "exit_code": process.returncode})
                self._forget(slot, process.pid)
                young = time.monotonic() - self._started[slot] < RESTART_BACKOFF_SECONDS
                if young and stop.wait(RESTART_BACKOFF_SECONDS):
                    return
                self._spawn(slot)

    def stop(self) -> None:
        """SIGTERM to every worker; SIGKILL to those still there after the grace period."""
        running = [p for p in self._processes if p is not None and p.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for slot, exited in enumerate(self._processes):
            if exited is not None:
                self._forget(slot, exited.pid)
        log.info("workers_stopped", extra={"workers": len(running)})

    def _forget(self, slot: int, pid: int) -> None:
        """A worker that exited: its live gauges leave the sums (its counts stay), its beat goes."""
        mark_process_dead(pid, str(self._shared / METRICS_DIR))  # type: ignore[no-untyped-call]
        forget_beat(self._shared, slot)


def supervise(
    listeners: list[socket.socket],
    sidecars: Sidecars,
    shared: Path,
    on_ready: Callable[[], None] | None,
    reload: Callable[[], None],
) -> None:
    """Run a worker on each listening socket until SIGTERM or SIGINT; SIGHUP reloads the
    sidecar."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    signal.signal(signal.SIGHUP, lambda _signum, _frame: reload())
    workers = Workers(listeners, sidecars, shared)
    try:
        workers.start()
        if on_ready is not None:
            on_ready()  # the sockets listen: connections wait in their backlogs for a worker
        workers.supervise(stop)
    finally:
        workers.stop()
        for listener in listeners:
            listener.close()
    log.info("service_stopped")


def worker_main(fd: int, slot: int, count: int, observes: bool = False) -> None:
    """One worker: its own context on the parent's socket and sidecar, until SIGTERM."""
    configure_logging()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # reloads are the parent's
    settings = Settings()
    listener = socket.socket(fileno=fd)
    assert settings.opa_url is not None  # the parent set it
    tracing.start()  # the parent checked the OTEL_* variables
    context = ServiceContext.open(
        settings,
        opa_url=settings.opa_url,
        opa_token=settings.opa_token,
        shadow_url=settings.shadow_opa_url,
        shadow_token=settings.shadow_opa_token,
        owns_live=False,  # the parent's
        observes_live=observes,
        published_policy=workers_dir(settings.data_dir) / POLICY_HEALTH_FILE,
    )
    context.worker_label = f"{slot}:{os.getpid()}"
    context.workers = WorkerBeats(workers_dir(settings.data_dir), slot, count, context.lanes)
    try:
        raise_open_file_limit()
        asyncio.run(serve_http(settings, context, listener))  # reloads are the parent's
    finally:
        context.close()
        tracing.shutdown()


if __name__ == "__main__":
    worker_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:] == ["observe"])
