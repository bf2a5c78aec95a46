"""Time per exchange of a long session: does a turn cost the same at 10,000 turns as at 100?

Starts the real `sessionstate serve` (hypercorn, its own OPA sidecar, LevelDB
in a temporary dir, durable writes on, the deployment's window of
`SESSIONSTATE_MAX_TURNS_KEPT` unless `--window` sets one), grants a workspace
approval and gives each history length its own session, preloaded through
the HTTP API: `PUT S/state` with `If-Match`, each write carrying the turns the
record keeps plus up to 2,048 in all, so 10,000 turns take a few writes.

Then it drives exchanges as `examples/model_service.py` does, through
`ModelServiceSession`: load (`GET S/state`), replay preview
(`POST S/replay-preview`) and a commit of 2 turns (`PUT S/state` with
`If-Match`). The sessions take turns, one exchange each per round, so drift on
a shared machine falls on all of them alike. Prints the median and mean time
per exchange at each history length and their ratios to the shortest; the
goal is every ratio within 1.2x. Each session's record is checked at the end:
at most the window kept, and kept + compacted = every turn written.

Run: `make bench` or `.venv/bin/python bench/long_session_bench.py [--turns 100 1000 10000
--exchanges 200 --warmup 10 --window N]`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sessionstate_client import ModelServiceSession, SessionStateClient
from sessionstate_client.models import SessionStateInput, TenantScope

from service.auth.tokens import mint_token
from service.config.settings import Settings
from store.record.bounds import MAX_TURNS_PER_WRITE
from tests.support.factories import state_input
from tests.support.live import JWT_SECRET
from tests.support.served import Served, start

GOAL = 1.2
TEMPLATE = SessionStateInput.model_validate(state_input(turns=[]))


class BenchFailure(RuntimeError):
    """A request did not get its expected answer, or a record is wrong; the run stops."""


def token(session: str | None) -> str:
    """A model-service token for one session, or (None) an operator's of tenant-a."""
    return mint_token(
        JWT_SECRET.encode(),
        sub="long-session-bench",
        roles=["model-service" if session else "operator"],
        tenant="tenant-a",
        workspace="ws-1" if session else None,
        session=session,
        ttl_seconds=3600,
    )


def scope_of(session: str) -> TenantScope:
    return TenantScope(tenant_id="tenant-a", workspace_id="ws-1", session_id=session)


def path_of(session: str) -> str:
    return f"/v1/tenants/tenant-a/workspaces/ws-1/sessions/{session}/state"


def preload_turns(start: int, count: int) -> list[dict[str, Any]]:
    return [
        {
            "turn_id": f"preload-{n}",
            "role": "user" if n % 2 == 0 else "assistant",
            "payload_digest": "sha256:" + hashlib.sha256(f"preloaded {n}".encode()).hexdigest(),
            "token_estimate": 12,
        }
        for n in range(start, start + count)
    ]


def preload(url: str, session: str, turns: int) -> None:
    """turns written into session through the API, in as few writes as the bounds allow."""
    with requests.Session() as http:
        http.headers["Authorization"] = f"Bearer {token(session)}"
        kept: list[dict[str, Any]] = []
        etag = None
        written = 0
        while written < turns:
            added = preload_turns(written, min(turns - written, MAX_TURNS_PER_WRITE - len(kept)))
            headers = {"If-None-Match": "*"} if etag is None else {"If-Match": etag}
            answer = http.put(
                url + path_of(session),
                json=state_input(turns=kept + added),
                headers=headers,
                timeout=60,
            )
            if answer.status_code not in (200, 201):
                raise BenchFailure(
                    f"preload of {session}: {answer.status_code} {answer.text[:300]}"
                )
            written += len(added)
            kept, etag = answer.json()["record"]["turns"], answer.headers["ETag"]


def exchange(session: ModelServiceSession, number: int) -> float:
    """One exchange of the echo model service, in ms: load, replay preview, commit 2 turns."""
    started = time.perf_counter()
    session.load()
    preview = session.replay()
    request = session.runtime_request(f"prompt {number}", preview)
    result = session.commit_turns(
        [session.turn("user", request.prompt), session.turn("assistant", f"echo {number}")]
    )
    elapsed = (time.perf_counter() - started) * 1000
    if not result.applied or result.attempts != 1:
        raise BenchFailure(f"exchange {number}: applied {result.applied}, {result.attempts} writes")
    return elapsed


def stop(served: Served) -> int:
    served.process.send_signal(signal.SIGTERM)
    try:
        return served.process.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(served.process.pid, signal.SIGKILL)
        return served.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, nargs="+", default=[100, 1_000, 10_000])
    parser.add_argument("--exchanges", type=int, default=200, help="timed exchanges per session")
    parser.add_argument("--warmup", type=int, default=10, help="untimed exchanges per session")
    parser.add_argument("--window", type=int, help="SESSIONSTATE_MAX_TURNS_KEPT (default: its own)")
    args = parser.parse_args()
    opa = Settings().resolved_opa_bin()
    window = args.window or Settings.model_fields["max_turns_kept"].default
    env = {"SESSIONSTATE_RATE_LIMIT": "off", "SESSIONSTATE_DENIAL_RATE_LIMIT": "off"}
    env["SESSIONSTATE_MAX_TURNS_KEPT"] = str(window)
    samples: dict[int, list[float]] = {turns: [] for turns in args.turns}
    shape: dict[int, tuple[int, int]] = {}

    with tempfile.TemporaryDirectory(prefix="long-session-bench-") as tmp_name:
        tmp = Path(tmp_name)
        served = start(opa, tmp / "var", tmp, env)
        try:
            granted = requests.post(
                served.url + "/v1/tenants/tenant-a/workspaces/ws-1/approvals",
                json={"ttl_seconds": 3600, "reason": "long session bench"},
                headers={"Authorization": f"Bearer {token(None)}"},
                timeout=30,
            )
            if granted.status_code != 201:
                raise BenchFailure(f"approval grant: {granted.status_code}")
            clients = {}
            sessions = {}
            for turns in args.turns:
                name = f"chat-{turns}"
                preload(served.url, name, turns)
                clients[turns] = SessionStateClient(served.url, token(name), timeout=60)
                sessions[turns] = ModelServiceSession(clients[turns], scope_of(name), TEMPLATE)
            for number in range(args.warmup):
                for session in sessions.values():
                    exchange(session, number)
            for turns, session in sessions.items():
                shape[turns] = (len(session.state.turns), session.compacted.count)
            for number in range(args.exchanges):
                for turns, session in sessions.items():
                    samples[turns].append(exchange(session, args.warmup + number))
            for turns, client in clients.items():
                record = client.get_state(scope_of(f"chat-{turns}")).read_report.record
                written = turns + 2 * (args.warmup + args.exchanges)
                if (
                    record is None
                    or len(record.turns) > window
                    or record.summary.count + len(record.turns) != written
                ):
                    raise BenchFailure(f"chat-{turns}: the record does not hold {written} turns")
                client.close()
        except BenchFailure as failure:
            code = stop(served)
            sys.exit(f"long session bench aborted: {failure}\n(service exit code {code})")
        code = stop(served)
        if code != 0:
            sys.exit(f"service exited with {code} after SIGTERM:\n{served.log.read_text()[-3000:]}")

    report(args, window, samples, shape)


def report(
    args: argparse.Namespace,
    window: int,
    samples: dict[int, list[float]],
    shape: dict[int, tuple[int, int]],
) -> None:
    print(
        f"served: hypercorn, one process, OPA sidecar, durable writes; window {window} turns; "
        f"{os.cpu_count()} CPUs shared by the client, the service and OPA"
    )
    print(
        f"per exchange (load, replay preview, commit of 2 turns through ModelServiceSession); "
        f"{args.exchanges} timed after {args.warmup} untimed, sessions taking turns"
    )
    base = min(samples)
    p50s = {turns: statistics.median(found) for turns, found in samples.items()}
    means = {turns: statistics.fmean(found) for turns, found in samples.items()}
    print(
        f"{'turns before':>12}{'kept':>7}{'compacted':>11}{'p50 ms':>9}{'mean ms':>9}"
        f"{'p50 ratio':>11}{'mean ratio':>12}"
    )
    for turns in sorted(samples):
        kept, compacted = shape[turns]
        print(
            f"{turns:>12,}{kept:>7}{compacted:>11,}{p50s[turns]:>9.2f}{means[turns]:>9.2f}"
            f"{p50s[turns] / p50s[base]:>10.2f}x{means[turns] / means[base]:>11.2f}x"
        )
    spread = max(max(p50s.values()) / min(p50s.values()), max(means.values()) / min(means.values()))
    verdict = "met" if spread <= GOAL else "not met"
    print(f"goal: within {GOAL}x of each other: {verdict} (widest spread {spread:.2f}x)")


if __name__ == "__main__":
    main()
