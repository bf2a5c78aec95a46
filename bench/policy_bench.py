"""Decision round trip through PolicyClient beside `opa bench`, in the same run.

For each decision package: p50/p99 of `PolicyClient.decide` against the real
locked-down sidecar (HTTP, token check, system.authz, provenance, decision
logging) over each transport (service.policy.transport: the hot path's
kept-alive socket on the sidecar's TCP port, and opa-python-client), beside
`opa bench` evaluating the same query on the same input in-process, and the
ratio of the two transports' medians. Run: `make bench`, or `.venv/bin/python
bench/policy_bench.py [--requests 2000] [--actions read write]`.
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

from service.api.v1 import DECISION_PACKAGES
from service.config.settings import Settings
from service.policy.client import PolicyClient
from service.policy.input import PolicyInput
from service.policy.sidecar import OpaSidecar
from tests.support.policy_inputs import allowed_input

ROOT = Path(__file__).resolve().parent.parent
ACTIONS = ("write", "read", "replay", "approval.grant", "decisions.read")
TRANSPORTS = ("keep-alive", "opa-python-client")


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def opa_bench(opa: str, action: str, tmp: Path) -> tuple[float, float]:
    """Median and p99 in ms of in-process evaluation, from `opa bench`'s histogram."""
    input_file = tmp / f"{action}.json"
    policy_input = allowed_input(action)
    input_file.write_text(json.dumps(policy_input.model_dump(mode="json", by_alias=True)))
    query = f"data.sessionstate.{DECISION_PACKAGES[policy_input.action]}.decision"
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
    parser.add_argument("--actions", nargs="+", choices=ACTIONS, default=list(ACTIONS))
    args = parser.parse_args()
    opa = Settings().resolved_opa_bin()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        # On loopback TCP: opa-python-client, one of the transports compared, has no other.
        sidecar = OpaSidecar(opa, ROOT / "policies", tmp / "opa", listen="tcp")
        sidecar.start()
        clients = {
            transport: PolicyClient(sidecar.url, sidecar.token, timeout=1.0, transport=transport)
            for transport in TRANSPORTS
        }
        print(
            f"{args.requests} decisions per package through PolicyClient over each transport; "
            "opa bench in-process; one client"
        )
        print(
            f"{'package':<10}{'keep-alive p50/p99 ms':>24}{'opa-python-client p50/p99 ms':>31}"
            f"{'opa bench p50/p99 ms':>23}{'keep-alive / opa-python-client':>32}"
        )
        try:
            for action in args.actions:
                figures = {
                    transport: _decisions(client, allowed_input(action), args.requests)
                    for transport, client in clients.items()
                }
                bench = opa_bench(opa, action, tmp)
                fast, slow = figures["keep-alive"], figures["opa-python-client"]
                print(
                    f"{DECISION_PACKAGES[action]:<10}{_pair(fast):>24}{_pair(slow):>31}"
                    f"{_pair(bench):>23}{fast[0] / slow[0]:>31.2f}x"
                )
        finally:
            for client in clients.values():
                client.close()
            sidecar.stop()


def _decisions(client: PolicyClient, policy_input: PolicyInput, count: int) -> tuple[float, float]:
    """p50 and p99 in ms of `decide`, after a warm-up of the connection and OPA's caches."""
    for _ in range(50):
        client.decide(policy_input)
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        trace = client.decide(policy_input)
        samples.append((time.perf_counter() - started) * 1000)
        assert trace.allow, trace.reasons
    return statistics.median(samples), percentile(samples, 0.99)


def _pair(figures: tuple[float, float]) -> str:
    return f"{figures[0]:.3f} / {figures[1]:.3f}"


if __name__ == "__main__":
    main()
