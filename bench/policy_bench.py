"""Decision round trip through PolicyClient beside `opa bench`, in the same run.

For each decision package: p50/p99 of `PolicyClient.decide` against the real
locked-down sidecar (HTTP, token check, system.authz, provenance, decision
logging), beside `opa bench` evaluating the same query on the same input
in-process, and the overhead ratio of the two medians. Run: `make bench`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.contract import DECISION_PACKAGES
from service.policy.client import PolicyClient
from service.policy.sidecar import OpaSidecar
from service.settings import Settings
from tests.policy_inputs import allowed_input

ROOT = Path(__file__).resolve().parent.parent
ACTIONS = ("write", "read", "replay", "approval.grant", "decisions.read")


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def opa_bench(opa: str, action: str, tmp: Path) -> tuple[float, float]:
    """Median and p99 in ms of in-process evaluation, from `opa bench`'s histogram."""
    input_file = tmp / f"{action}.json"
    input_file.write_text(json.dumps(allowed_input(action).model_dump(mode="json", by_alias=True)))
    query = f"data.sessionstate.{DECISION_PACKAGES[action]}.decision"
    out = subprocess.run(
        [
            opa,
            "bench",
            "--data",
            str(ROOT / "policies" / "sessionstate"),
            "--input",
            str(input_file),
            "--format",
            "json",
            "--benchmem=false",
            query,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    extra = json.loads(out)["Extra"]
    return (
        extra["histogram_timer_rego_query_eval_ns_median"] / 1e6,
        extra["histogram_timer_rego_query_eval_ns_99%"] / 1e6,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000, help="decisions per package")
    args = parser.parse_args()
    opa = Settings().resolved_opa_bin()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sidecar = OpaSidecar(opa, ROOT / "policies", tmp / "opa")
        sidecar.start()
        client = PolicyClient(sidecar.url, sidecar.token, timeout=1.0)
        print(f"{args.requests} decisions per package through PolicyClient; opa bench for 1 s each")
        print(
            f"{'package':<12}{'client p50':>12}{'client p99':>12}{'opa bench p50':>15}"
            f"{'opa bench p99':>15}{'p50 ratio':>11}"
        )
        try:
            for action in ACTIONS:
                policy_input = allowed_input(action)
                for _ in range(50):  # warm the connection and OPA's caches
                    client.decide(policy_input)
                samples = []
                for _ in range(args.requests):
                    started = time.perf_counter()
                    trace = client.decide(policy_input)
                    samples.append((time.perf_counter() - started) * 1000)
                    assert trace.allow, trace.reasons
                bench_p50, bench_p99 = opa_bench(opa, action, tmp)
                p50, p99 = statistics.median(samples), percentile(samples, 0.99)
                print(
                    f"{DECISION_PACKAGES[action]:<12}{p50:>10.3f}ms{p99:>10.3f}ms"
                    f"{bench_p50:>13.3f}ms{bench_p99:>13.3f}ms{p50 / bench_p50:>10.1f}x"
                )
        finally:
            client.close()
            sidecar.stop()


if __name__ == "__main__":
    main()
