"""OPA's lock-down alternatives side by side: OPA's CPU per decision in each (issue 32).

Starts the pinned OPA as the service starts its sidecar (`OpaSidecar`: the
policy set from policies/ as a bundle from the bundle server, console
decision log into opa.log), one shape after the other, and asks each for the
read decision's input (`allowed_input("read")`, the query the service's
`PolicyClient` sends: POST `/v1/data/sessionstate/read/decision?provenance=true`
over a kept-alive connection, `service.policy.transport.KeepAliveTransport`):

- a. today: TCP loopback, `--authentication=token --authorization=basic` with
  policies/system/authz;
- b. the same without token and authz: a reference only, never acceptable (any
  local user could ask anything of OPA, replace its policies too);
- c. a Unix domain socket (`--addr unix://DIR/opa.sock`, `--unix-socket-perm
  600`) in a directory of mode 0700 that only the service's user can open,
  without token and authz;
- d. that socket with token and authz;
- e. shape a asked N decisions per query (`--batches`, 1 4 16 by default)
  through the batch entrypoint `data.sessionstate.batch.decision` of
  `service.policy.batch.batch_module("batch")` (each item `{package, input}`),
  loaded beside a copy of policies/ with a bench-only authz rule that also
  admits POST /v1/data/sessionstate/batch/decision (policies/ is not changed);
- f. shape c asked the same batches: both levers together.

Load: `--clients` (16) concurrent clients, each a thread with its own
kept-alive connection, spread over `--processes` client processes (wrk speaks
no Unix sockets; `KeepAliveTransport` reaches the socket at its `http+unix://`
URL, as the service does). Every answer must be 200 with every decision allowed, or the run
stops. After an unrecorded warm-up of `--warmup` seconds, for `--seconds`: the
answers that arrived in that window are counted, and OPA's utime + stime from
/proc (bench/process_cpu.py) is read at its start and end. It prints, per
shape: decisions/s, OPA's CPU ms per decision (per item of a batch), the
query's p50 and p99 wall time at the client, and the wall time per decision
(query p50 / N). Its CPU is what matters: a faster client would change the
rate more than OPA's cost per decision.

Run (`make bench` runs every bench):

    SESSIONSTATE_OPA_BIN=$(scripts/tools.sh opa) .venv/bin/python bench/opa_lockdown_bench.py \\
        [--seconds 5] [--warmup 1] [--clients 16] [--processes 4] [--batches 1 4 16] \\
        [--shapes a b c d e f] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import process_cpu
from bench.processes import exit_on_sigterm
from service.api.v1 import DECISION_PACKAGES
from service.config.settings import Settings
from service.policy.batch import batch_answers, batch_document, batch_module
from service.policy.client import PROBE, EncodedInput, bundle_revision
from service.policy.sidecar import OpaSidecar
from service.policy.transport import KeepAliveTransport, unix_url
from store.canonical import canonical_json
from tests.support.policy_inputs import allowed_input

ROOT = Path(__file__).resolve().parent.parent
BATCH_PACKAGE = "batch"  # data.sessionstate.batch.decision
READ_PACKAGE = DECISION_PACKAGES["read"]
TIMEOUT = 10.0  # seconds a query may take before the run stops: a loaded machine is slow
SOCKET_NAME = "opa.sock"
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes

# Beside a copy of policies/ for shape e: the batch entrypoint, admitted like a decision.
BENCH_AUTHZ = """package system.authz

# Bench only (bench/opa_lockdown_bench.py): the service's token may also ask the batch
# entrypoint, with the same parameters as a decision.
allow if {
	_service_token_presented
	input.method == "POST"
	_only_params({"provenance"})
	input.path == ["v1", "data", "sessionstate", "batch", "decision"]
}
"""


class LockdownFailure(RuntimeError):
    """A shape could not be measured (OPA not ready, an answer refused or not allowed)."""


@dataclass(frozen=True)
class Shape:
    key: str
    label: str
    authz: bool
    unix: bool
    batched: bool = False


SHAPES = (
    Shape("a", "a. TCP, token + authz, console log (today)", authz=True, unix=False),
    Shape("b", "b. TCP, no token/authz (reference only)", authz=False, unix=False),
    Shape("c", "c. Unix socket in 0700 dir, no token/authz", authz=False, unix=True),
    Shape("d", "d. Unix socket in 0700 dir, token + authz", authz=True, unix=True),
    Shape("e", "e. TCP, token + authz, N per query", authz=True, unix=False, batched=True),
    Shape("f", "f. Unix socket, no token/authz, N per query", authz=False, unix=True, batched=True),
)


def transport_to(address: str, token: str | None, timeout: float) -> KeepAliveTransport:
    """A kept-alive transport to an `http://` URL, or to a Unix socket's path."""
    if address.startswith("http://"):
        return KeepAliveTransport(address, token, timeout)
    return KeepAliveTransport(unix_url(address), token, timeout)


class ShapedSidecar(OpaSidecar):
    """The service's sidecar (bundle, config, console decision log), listening and locked
    down as a shape says. Ready once a decision query names the served revision (its own
    transport, so a Unix socket is asked the same way)."""

    def __init__(
        self, opa: str, policy_dir: Path, work_dir: Path, shape: Shape, socket_dir: Path | None
    ) -> None:
        # A port and a token for every shape; each shape's own command says what OPA listens on.
        super().__init__(opa, policy_dir, work_dir, listen="tcp")
        self.shape = shape
        self.socket_path = None if socket_dir is None else socket_dir / SOCKET_NAME
        self._asker = transport_to(self.address, self.token, 1.0)

    @property
    def address(self) -> str:
        """Where the bench's clients connect: the URL, or the socket's path."""
        return self.url if self.socket_path is None else str(self.socket_path)

    def _command(self) -> list[str]:
        listen = (
            f"127.0.0.1:{self.port}" if self.socket_path is None else f"unix://{self.socket_path}"
        )
        lock = ["--authentication=token", "--authorization=basic"] if self.shape.authz else []
        return [
            self.opa_bin,
            "run",
            "--server",
            "--addr",
            listen,
            "--unix-socket-perm",
            "600",
            *lock,
            "--skip-version-check",
            "--config-file",
            str(self.work_dir / "opa-config.json"),
        ]

    def deciding_revision(self) -> str | None:
        probe = EncodedInput.of(PROBE)
        answer = self._asker.query(DECISION_PACKAGES[PROBE.action], probe.document, probe.encoded)
        if not isinstance(answer, dict):
            return None
        provenance = answer.get("provenance")
        return bundle_revision(provenance) if isinstance(provenance, dict) else None

    def ready(self) -> bool:
        return self.deciding_revision() == self.policies.served.revision

    def stop(self, timeout: float = 5.0) -> None:
        super().stop(timeout)
        self._asker.close()


def batch_policies(copy: Path) -> Path:
    """A copy of policies/ at `copy`, with the batch entrypoint and the bench's authz rule
    beside it."""
    shutil.copytree(ROOT / "policies", copy)
    (copy / "sessionstate" / BATCH_PACKAGE).mkdir()
    (copy / "sessionstate" / BATCH_PACKAGE / "batch.rego").write_text(batch_module(BATCH_PACKAGE))
    (copy / "system" / "authz" / "bench_batch.rego").write_text(BENCH_AUTHZ)
    return copy


@dataclass(frozen=True)
class Question:
    """What every client asks: a package and its input's bytes, and how many decisions
    one answer holds."""

    package: str
    encoded: bytes
    decisions: int
    batched: bool


def question(batch: int | None) -> Question:
    document = allowed_input("read").model_dump(mode="json", by_alias=True)
    if batch is None:
        return Question(READ_PACKAGE, canonical_json(document), 1, False)
    items = [(READ_PACKAGE, document)] * batch
    return Question(BATCH_PACKAGE, canonical_json(batch_document(items)), batch, True)


def allowed(answer: Any, asked: Question) -> bool:
    """Every decision of the answer is an allow."""
    if not isinstance(answer, dict):
        return False
    result = answer.get("result")
    decisions = batch_answers(result, asked.decisions) if asked.batched else [result]
    return all(isinstance(d, dict) and d.get("allow") is True for d in decisions)


def drive(
    address: str,
    token: str,
    asked: Question,
    threads: int,
    warmup: float,
    seconds: float,
    barrier: Barrier,
    results: Any,
) -> None:
    """One client process: `threads` clients asking over their own connections from the
    barrier on; the answers that arrived within the measured window are counted. Puts
    (count, latencies in ms, error or None) on `results`."""
    transport = transport_to(address, token, TIMEOUT)
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[str] = []
    window = [0.0, 0.0]
    stop = threading.Event()

    def client(mine: list[float]) -> None:
        try:
            while not stop.is_set():
                began = time.monotonic()
                answer = transport.query(asked.package, {}, asked.encoded)
                ended = time.monotonic()
                if not allowed(answer, asked):
                    raise LockdownFailure(f"not an allow: {str(answer)[:300]}")
                if ended >= window[1]:
                    return
                if began >= window[0]:
                    mine.append((ended - began) * 1000)
        except Exception as error:  # the run stops, and says why
            errors.append(repr(error))
            stop.set()

    try:
        transport.query(asked.package, {}, asked.encoded)  # connected before the barrier
        barrier.wait(timeout=60)
        window[0] = time.monotonic() + warmup
        window[1] = window[0] + seconds
        workers = [threading.Thread(target=client, args=(mine,)) for mine in latencies]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    except Exception as error:
        errors.append(repr(error))
    finally:
        transport.close()
    every = [sample for mine in latencies for sample in mine]
    results.put((len(every), every, errors[0] if errors else None))


def measure(sidecar: ShapedSidecar, asked: Question, args: argparse.Namespace) -> dict[str, float]:
    """Decisions/s, OPA's CPU per decision, and the query's wall time, at `--clients`."""
    context = multiprocessing.get_context("spawn")
    processes = min(args.processes, args.clients)
    barrier = context.Barrier(processes + 1)
    results = context.Queue()
    shares = [args.clients // processes + (i < args.clients % processes) for i in range(processes)]
    clients = [
        context.Process(
            target=drive,
            args=(sidecar.address, sidecar.token, asked, share, args.warmup, args.seconds),
            kwargs={"barrier": barrier, "results": results},
            daemon=True,
        )
        for share in shares
    ]
    for process in clients:
        process.start()
    try:
        barrier.wait(timeout=120)
        began = time.monotonic() + args.warmup
        time.sleep(max(0.0, began - time.monotonic()))
        pids = () if sidecar.pid is None else (sidecar.pid,)
        before = process_cpu.sample(pids)
        time.sleep(max(0.0, began + args.seconds - time.monotonic()))
        after = process_cpu.sample(pids)
        answers = [results.get(timeout=TIMEOUT + 60) for _ in clients]
    except (threading.BrokenBarrierError, queue.Empty) as failure:
        raise LockdownFailure(f"the clients did not run: {failure!r}") from None
    finally:
        for process in clients:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()
    failed = [error for _, _, error in answers if error is not None]
    if failed:
        raise LockdownFailure(f"a client failed: {failed[0]}")
    latencies = sorted(sample for _, samples, _ in answers for sample in samples)
    queries = len(latencies)
    if not queries:
        raise LockdownFailure("no query completed")
    decisions = queries * asked.decisions
    opa_seconds = process_cpu.spent(before, after).get("opa", 0.0)
    p50 = statistics.median(latencies)
    return {
        "decisions_per_second": round(decisions / args.seconds, 1),
        "queries_per_second": round(queries / args.seconds, 1),
        "opa_cpu_ms_per_decision": round(opa_seconds * 1000 / decisions, 4),
        "query_p50_ms": round(p50, 3),
        "query_p99_ms": round(latencies[min(queries - 1, int(0.99 * queries))], 3),
        "wall_ms_per_decision": round(p50 / asked.decisions, 4),
        "decisions": decisions,
    }


def measure_shape(
    opa: str, shape: Shape, tmp: Path, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Each figure of one shape (one per batch size for shape e)."""
    socket_dir = None
    if shape.unix:
        socket_dir = Path(tempfile.mkdtemp(prefix=f"sock-{shape.key}-", dir=tmp))
        socket_dir.chmod(0o700)
        if len(str(socket_dir / SOCKET_NAME)) > MAX_SOCKET_PATH:
            raise LockdownFailure(f"socket path too long for AF_UNIX: {socket_dir}")
    policies = batch_policies(tmp / f"policies-{shape.key}") if shape.batched else ROOT / "policies"
    sidecar = ShapedSidecar(opa, policies, tmp / f"opa-{shape.key}", shape, socket_dir)
    found = []
    try:
        sidecar.start()
        for batch in args.batches if shape.batched else [None]:
            figures = measure(sidecar, question(batch), args)
            found.append({"shape": shape.key, "label": shape.label, "batch": batch or 1} | figures)
    finally:
        sidecar.stop()
    return found


def print_report(report: dict[str, Any]) -> None:
    settings = report["settings"]
    print(
        f"OPA {settings['opa_version']}, read decision's input, {settings['clients']} clients "
        f"over {settings['processes']} process(es), {settings['seconds']} s per figure after "
        f"{settings['warmup']} s warm-up; OPA's CPU from /proc (utime + stime) / decisions; "
        f"{settings['cpus']} CPUs shared by clients and OPA"
    )
    reference = next((row for row in report["figures"] if row["shape"] == "a"), None)
    print(
        f"{'shape':<46}{'N':>4}{'decisions/s':>13}{'OPA CPU ms/dec':>16}{'vs a':>7}"
        f"{'query p50':>11}{'p99':>9}{'wall ms/dec':>13}"
    )
    for row in report["figures"]:
        versus = (
            f"{row['opa_cpu_ms_per_decision'] / reference['opa_cpu_ms_per_decision']:.2f}x"
            if reference and reference["opa_cpu_ms_per_decision"]
            else "-"
        )
        print(
            f"{row['label']:<46}{row['batch']:>4}{row['decisions_per_second']:>13,.0f}"
            f"{row['opa_cpu_ms_per_decision']:>16.3f}{versus:>7}{row['query_p50_ms']:>11.3f}"
            f"{row['query_p99_ms']:>9.3f}{row['wall_ms_per_decision']:>13.3f}"
        )


def opa_version(opa: str) -> str:
    out = subprocess.run([opa, "version"], capture_output=True, text=True, check=True).stdout
    versions = (line.split(":", 1)[1].strip() for line in out.splitlines() if ":" in line)
    return next(versions, "?")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5, help="measured seconds per figure")
    parser.add_argument("--warmup", type=float, default=1, help="unrecorded seconds before")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients")
    parser.add_argument("--processes", type=int, default=4, help="client processes")
    parser.add_argument(
        "--batches", type=int, nargs="+", default=[1, 4, 16], help="decisions per query (e)"
    )
    parser.add_argument(
        "--shapes", nargs="+", choices=[s.key for s in SHAPES], default=[s.key for s in SHAPES]
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    if args.seconds <= 0 or args.warmup < 0 or args.clients < 1 or args.processes < 1:
        parser.error("--seconds, --clients and --processes must be positive, --warmup 0 or more")
    if any(batch < 1 for batch in args.batches):
        parser.error("--batches must be 1 or more")
    exit_on_sigterm()
    opa = Settings().resolved_opa_bin()
    figures: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="opa-lockdown-") as tmp_name:
        try:
            for shape in SHAPES:
                if shape.key in args.shapes:
                    figures += measure_shape(opa, shape, Path(tmp_name), args)
        except LockdownFailure as failure:
            sys.exit(f"OPA lock-down bench aborted: {failure}")
    report = {
        "settings": {
            "seconds": args.seconds,
            "warmup": args.warmup,
            "clients": args.clients,
            "processes": min(args.processes, args.clients),
            "opa_version": opa_version(opa),
            "cpus": os.cpu_count(),
        },
        "figures": figures,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)


if __name__ == "__main__":
    main()
