"""The benchmarks still run: each once, with tiny counts. (Figures are not checked here:
performance is read from `make bench`, never asserted in tests.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SMALL_RUNS = {
    "store_bench.py": ["--seconds", "0.05"],
    "long_session_bench.py": [
        "--turns", "20", "100", "--exchanges", "2", "--warmup", "1", "--window", "16",
    ],
    "policy_bench.py": ["--requests", "5"],
    "decision_log_bench.py": ["--entries", "16", "--threads", "1", "4"],
    "slow_clients_bench.py": ["--seconds", "1", "--headers", "2", "--bodies", "2", "--pause", "0.5"],
    "service_bench.py": ["--seconds", "1", "--clients", "2", "--warmup", "0"],
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
        env={"SESSIONSTATE_OPA_BIN": opa_bin, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()
