"""The benchmarks still run: each once, with tiny counts, and leave no process behind.
(Figures are not checked here: performance is read from `make bench`, never asserted in
tests.)"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tests.support.paths import ROOT
from tests.support.served import processes_using

pytestmark = pytest.mark.slow  # long end to end: `make test-quick` skips it

SMALL_RUNS = {
    "store_bench.py": ["--seconds", "0.05"],
    "long_session_bench.py": [
        "--turns", "20", "100", "--exchanges", "2", "--warmup", "1", "--window", "16",
    ],
    "policy_bench.py": ["--requests", "5", "--actions", "read"],
    "decision_log_bench.py": ["--entries", "16", "--threads", "1", "4"],
    "slow_clients_bench.py": ["--seconds", "1", "--headers", "2", "--bodies", "2", "--pause", "0.5"],
    "scale_bench.py": ["--sizes", "300", "600", "--approvals", "5", "50", "--repeat", "1"],
    "service_bench.py": ["--seconds", "1", "--clients", "2", "--warmup", "0"],
    "impact_bench.py": ["--entries", "50"],
    "merkle_bench.py": ["--sizes", "100", "300", "--proofs", "20"],
    "merkle_store_bench.py": ["--entries", "50", "--batch", "1", "8", "--repeat", "1", "--sizes", "100", "300", "--proofs", "20"],
    "peer_bench.py": ["--seconds", "1", "--clients", "2", "--warmup", "0"],
    "opa_lockdown_bench.py": ["--seconds", "1", "--warmup", "0", "--clients", "2", "--processes", "1", "--batches", "1", "4"],
    "probe_bench.py": ["--seconds", "1", "--warmup", "0", "--clients", "2", "--probe-clients", "1"],
}  # fmt: skip
PRINTED_ROWS = {  # rows a run must print, beside whatever else it prints
    "service_bench.py": [
        "hello-world Flask", "governed floor: hello + 1 decision + 1 fsync",
        "read req/s / governed floor req/s", "CPU svc/OPA", "CPU ms per read, service + OPA",
    ],
    "opa_lockdown_bench.py": [
        "a. TCP, token + authz", "c. Unix socket in 0700 dir, no token/authz",
        "e. TCP, token + authz, N per query",
    ],
    "probe_bench.py": [
        "GET /healthz alone", "GET /metrics alone", "GET S/state, with probes",
        "GET /healthz, beside the reads", "GET /metrics, beside the reads",
    ],
    "peer_bench.py": [
        "governed write: PUT S/state", "governed read: GET S/state", "PostgresSaver.put",
        "PostgresSaver.get_tuple", "governed write / PostgresSaver.put",
        "governed read / PostgresSaver.get_tuple",
    ],
}  # fmt: skip


def test_every_bench_script_has_a_small_run() -> None:
    assert {path.name for path in (ROOT / "bench").glob("*_bench.py")} == set(SMALL_RUNS)


@pytest.mark.parametrize(("script", "args"), sorted(SMALL_RUNS.items()))
def test_bench_runs(script: str, args: list[str], opa_bin: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        # /usr/sbin: as root, peer_bench.py's throwaway PostgreSQL runs as its own user (runuser)
        env={"SESSIONSTATE_OPA_BIN": opa_bin, "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
    )
    assert done.returncode == 0, _why(done.stderr)
    assert done.stdout.strip()
    for row in PRINTED_ROWS.get(script, []):
        assert row in done.stdout


def bench_env(opa_bin: str, tmp_path: Path) -> dict[str, str]:
    """The bench's temporary files (service data dirs, wrk scripts) land under tmp_path, so
    every process it starts names tmp_path in its command line or environment."""
    return {"SESSIONSTATE_OPA_BIN": opa_bin, "PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)}


def test_store_bench_on_postgresql(postgres_conninfo: str, opa_bin: str, tmp_path: Path) -> None:
    """`--store`: through one and two service instances, one of two workers, and raw
    psycopg, figures printed (and the answers of each worker);
    afterwards no process it started is left, nor its scratch table. Every write through
    the two instances is answered 200/201 (exit 3 names any other answer: writers of one
    chain once lost races until they gave up with 503)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "store_bench.py"), "--store", postgres_conninfo,
         "--seconds", "1", "--clients", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=bench_env(opa_bin, tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for row in ("through one service instance", "through two instances", "raw psycopg"):
        assert row in done.stdout
    assert "through one instance, --workers 2" in done.stdout
    assert "answers per worker (slot:pid)" in done.stdout
    assert processes_using(tmp_path) == []
    with psycopg.connect(postgres_conninfo) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'bench_raw_inserts_%'"
        ).fetchone()
    assert left == (0,)


def test_peer_bench_on_postgresql(postgres_conninfo: str, opa_bin: str, tmp_path: Path) -> None:
    """`--store`: the service and LangGraph's PostgresSaver on the same database, figures,
    CPU per operation and ratios printed as JSON; afterwards no process it started is
    left, nor the schema of LangGraph's tables."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "peer_bench.py"), "--store", postgres_conninfo,
         "--seconds", "1", "--clients", "2", "--warmup", "0", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=bench_env(opa_bin, tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert set(report["figures"]) == {
        "governed write: PUT S/state", "governed read: GET S/state",
        "PostgresSaver.put", "PostgresSaver.get_tuple", "PostgresSaver.get_tuple, after puts",
    }  # fmt: skip
    for figures in report["figures"].values():
        assert figures["operations"] > 0
        assert figures["cpu_ms_per_op"] is not None
    assert [ratio["target"] for ratio in report["ratios"]] == [0.3, 0.4, None]
    assert processes_using(tmp_path) == []
    with psycopg.connect(postgres_conninfo) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'bench_peer_%'"
        ).fetchone()
    assert left == (0,)


def test_store_bench_stops_what_it_started_when_terminated(
    postgres_conninfo: str, opa_bin: str, tmp_path: Path
) -> None:
    """SIGTERM while wrk drives a service instance: the bench exits, and takes the
    instance, its OPA sidecar and wrk with it."""
    bench = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "store_bench.py"), "--store", postgres_conninfo,
         "--seconds", "60", "--clients", "2"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=bench_env(opa_bin, tmp_path),
    )  # fmt: skip
    try:
        wait_for_wrk(tmp_path, bench)
        bench.send_signal(signal.SIGTERM)
        _, err = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 128 + signal.SIGTERM, err.decode()[-3000:]
    assert processes_using(tmp_path) == []


def wait_for_wrk(tmp_path: Path, bench: subprocess.Popen[bytes]) -> None:
    """Until a wrk of the bench runs (a service instance and its sidecar serve it)."""
    deadline = time.monotonic() + 120
    while True:
        assert bench.poll() is None, bench.stderr.read().decode() if bench.stderr else ""
        for pid in processes_using(tmp_path):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"wrk\0"):
                    return
        assert time.monotonic() < deadline, "the bench never started wrk"
        time.sleep(0.2)


def _why(stderr: str) -> str:
    """The bench's own reason (its last line naming why it aborted, which the service logs
    it quotes would push out of a tail), then the tail."""
    aborted = stderr.rfind("bench aborted: ")
    reason = stderr[stderr.rfind("\n", 0, aborted) + 1 :][:1500] if aborted >= 0 else ""
    return f"{reason}\n...\n{stderr[-1500:]}"
