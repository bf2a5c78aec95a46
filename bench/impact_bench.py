"""`sessionstate policy impact` over a big decision log, beside `opa eval` over the same inputs.

Builds a decision log of `--entries` decisions directly through the store API
(one tenant's chain, as bench/scale_bench.py builds it: unsynced batches,
entries sealed as the chain seals them), then times:

- `sessionstate policy impact policies/ --format json` as a process, end to end:
  the `opa check --strict` of the candidate, the read-only copy of the LevelDB,
  the sidecar's start, every decision asked over keep-alive connections, the
  comparison and the report;
- the floor: one `opa eval` of the same policies with a data document holding
  every input and a comprehension that decides each (no HTTP, no JSON per
  decision, no Python): what OPA itself needs for these evaluations.

Prints entries/s of both and their ratio. Checks that the impact run evaluated
every entry and that `opa eval` decided as many.

Run: `make bench` or `.venv/bin/python bench/impact_bench.py [--entries 100000]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scale_bench import TENANT, build_chain  # noqa: E402
from service.api.v1 import DECISION_PACKAGES  # noqa: E402
from service.config.settings import Settings  # noqa: E402
from service.decisions.reader import DecisionLogReader  # noqa: E402
from store.backends.leveldb import LevelDBLaneStore  # noqa: E402

POLICY_DIR = ROOT / "policies"
IMPACT = [sys.executable, "-m", "service.cli", "policy", "impact"]
FLOOR_QUERY = (
    "count([d | some x in data.impact_bench.inputs; "
    "d := data.sessionstate[x.package].decision with input as x.input])"
)


class BenchFailure(RuntimeError):
    """A run did not do what it must; the bench stops."""


def build(data_dir: Path, entries: int) -> list[dict[str, object]]:
    """The log, and every entry's (package, input) for the floor."""
    lanes = LevelDBLaneStore(data_dir / "leveldb")
    try:
        build_chain(lanes, TENANT, entries, datetime.now(UTC) - timedelta(days=1))
        return [
            {"package": DECISION_PACKAGES[entry.input["action"]], "input": entry.input}
            for entry in DecisionLogReader(lanes).entries(TENANT)
        ]
    finally:
        lanes.close()


def time_impact(opa: str, data_dir: Path, entries: int) -> float:
    env = {
        **os.environ,
        "SESSIONSTATE_DATA_DIR": str(data_dir),
        "SESSIONSTATE_OPA_BIN": opa,
        "SESSIONSTATE_POLICY_DIR": str(POLICY_DIR),
    }
    env.pop("SESSIONSTATE_STORE", None)
    started = time.perf_counter()
    done = subprocess.run(
        [*IMPACT, str(POLICY_DIR), "--format", "json", "--examples", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise BenchFailure(f"policy impact exited {done.returncode}: {done.stderr[-500:]}")
    evaluated = json.loads(done.stdout)["evaluated"]
    if evaluated != entries:
        raise BenchFailure(f"policy impact evaluated {evaluated} of {entries} entries")
    return seconds


def time_floor(opa: str, inputs: list[dict[str, object]], scratch: Path) -> float:
    data = scratch / "inputs.json"
    data.write_text(json.dumps({"impact_bench": {"inputs": inputs}}))
    started = time.perf_counter()
    done = subprocess.run(
        [opa, "eval", "--format", "raw", "-d", str(POLICY_DIR), "-d", str(data), FLOOR_QUERY],
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0 or done.stdout.strip() != str(len(inputs)):
        raise BenchFailure(f"opa eval did not decide every input: {done.stderr[-500:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    args = parser.parse_args()
    opa = Settings().resolved_opa_bin()
    with tempfile.TemporaryDirectory(prefix="impact-bench-") as tmp:
        scratch = Path(tmp)
        started = time.perf_counter()
        inputs = build(scratch / "var", args.entries)
        print(f"built {args.entries} logged decisions in {time.perf_counter() - started:.1f}s")
        impact = time_impact(opa, scratch / "var", args.entries)
        floor = time_floor(opa, inputs, scratch)
    rows = [
        ("sessionstate policy impact (end to end)", impact),
        ("opa eval, one data document (floor)", floor),
    ]
    print(f"{'':42} {'seconds':>9} {'entries/s':>10}")
    for label, seconds in rows:
        print(f"{label:42} {seconds:9.2f} {args.entries / seconds:10.0f}")
    print(f"policy impact takes {impact / floor:.1f}x the floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
