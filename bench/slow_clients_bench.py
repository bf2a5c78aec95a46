"""Normal reads during a slow-client attack, beside the same reads without it, one run.

Starts the real `sessionstate serve` (its OPA sidecar, LevelDB in a temporary
dir), stores one record, then measures governed reads (GET S/state) with
`wrk` (so the load generator's CPU does not dominate):

1. quiet: no attack;
2. attacked: while 50 slow-header sockets (a header line every few seconds,
   never finishing) and 50 slow-body sockets (headers sent, then a byte of
   the body every few seconds) are held open for the whole run; each one the
   server cuts off is reopened at once, so the attack keeps its strength.

It prints requests/s, p50 and p99 of each, the p99 ratio (attacked / quiet),
how many attack sockets the server cut off, and any errors wrk saw.
The claim being measured: a slow client costs a socket, not a thread.

Run: `make bench`, or `.venv/bin/python bench/slow_clients_bench.py
[--seconds 60 --connections 16 --headers 50 --bodies 50]`. Needs `wrk` on
PATH (Debian's package; `make bench` installs it when run as root).
"""

from __future__ import annotations

import argparse
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.service_bench import SESSION, WORKSPACE, Served, token
from service.settings import Settings
from tests.factories import state_input


class Attackers:
    """Sockets that send their request as slowly as the server allows, reopened when it
    closes them, so the attack keeps its strength for the whole measurement."""

    def __init__(self, host: str, port: int, headers: int, bodies: int, pause: float) -> None:
        self.address = (host, port)
        self.pause = pause
        self.stop = threading.Event()
        self.closed_by_server = {"header": 0, "body": 0}
        head = (
            f"POST {SESSION}/state/preview HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {token('model-service')}\r\nContent-Type: application/json\r\n"
        )
        self.kinds = {
            "header": (head.encode(), b"X-Slow: 1\r\n"),
            "body": ((head + "Content-Length: 100000\r\n\r\n").encode(), b" "),
        }
        self.held: list[tuple[socket.socket, str]] = []
        for kind, count in (("header", headers), ("body", bodies)):
            for _ in range(count):
                self.held.append((self._open(kind), kind))
        self.thread = threading.Thread(target=self._trickle, daemon=True)
        self.thread.start()

    def _open(self, kind: str) -> socket.socket:
        connection = socket.create_connection(self.address, timeout=5)
        connection.sendall(self.kinds[kind][0])
        return connection

    def _trickle(self) -> None:
        while not self.stop.wait(self.pause):
            for index, (connection, kind) in enumerate(list(self.held)):
                try:
                    connection.sendall(self.kinds[kind][1])
                    readable, _, _ = select.select([connection], [], [], 0)
                    if readable:  # an answer (408) or EOF: the server let go of it
                        raise ConnectionResetError
                except OSError:
                    self.closed_by_server[kind] += 1
                    connection.close()
                    self.held[index] = (self._open(kind), kind)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for connection, _ in self.held:
            connection.close()


def wrk(url: str, seconds: int, connections: int) -> dict[str, float]:
    """wrk's figures for GET url: requests/s, p50 and p99 in ms, errors."""
    done = subprocess.run(
        [
            "wrk",
            f"-t{min(2, connections)}",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-H",
            f"Authorization: Bearer {token('model-service')}",
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    out = done.stdout

    def latency(label: str) -> float:
        match = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
        if match is None:
            raise RuntimeError("wrk printed no " + label + " latency:\n" + out)
        value, unit = float(match.group(1)), match.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": float(rate.group(1)) if rate else 0.0,
        "p50": latency("50%"),
        "p99": latency("99%"),
        "non2xx": float(non2xx.group(1)) if non2xx else 0.0,
        "socket_errors": 0.0
        if errors is None
        else float(sum(map(int, re.findall(r"\d+", errors.group(1))))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=60, help="each measurement (default 60)")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections")
    parser.add_argument("--headers", type=int, default=50, help="slow-header sockets")
    parser.add_argument("--bodies", type=int, default=50, help="slow-body sockets")
    parser.add_argument("--pause", type=float, default=3.0, help="seconds between trickles")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not on PATH: `make bench` installs it (apt-get install wrk)")
    opa = Settings().resolved_opa_bin()
    with tempfile.TemporaryDirectory() as tmp:
        served = Served(opa, Path(tmp))
        try:
            served.wait_ready()
            url = served.url + SESSION + "/state"
            operator = {"Authorization": f"Bearer {token('operator')}"}
            requests.post(
                served.url + WORKSPACE + "/approvals",
                json={"ttl_seconds": 3600, "reason": "bench"},
                headers=operator,
                timeout=5,
            ).raise_for_status()
            requests.put(
                url,
                json=state_input(),
                headers={"Authorization": f"Bearer {token('model-service')}"},
                timeout=5,
            ).raise_for_status()
            quiet = wrk(url, args.seconds, args.connections)
            attackers = Attackers("127.0.0.1", served.port, args.headers, args.bodies, args.pause)
            try:
                attacked = wrk(url, args.seconds, args.connections)
                cut = dict(attackers.closed_by_server)
            finally:
                attackers.close()
        finally:
            served.stop()
    print(
        f"GET S/state, {args.connections} wrk connections, {args.seconds}s each; attack: "
        f"{args.headers} slow-header + {args.bodies} slow-body sockets, a trickle every "
        f"{args.pause:g}s"
    )
    print(f"{'':>10} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'non-2xx':>8} {'sock err':>8}")
    for name, row in (("quiet", quiet), ("attacked", attacked)):
        print(
            f"{name:>10} {row['rps']:9.0f} {row['p50']:8.2f} {row['p99']:8.2f} "
            f"{row['non2xx']:8.0f} {row['socket_errors']:8.0f}"
        )
    print(
        f"p99 attacked / quiet: {attacked['p99'] / quiet['p99']:.2f}; "
        f"req/s attacked / quiet: {attacked['rps'] / max(quiet['rps'], 1):.2f}"
    )
    print(
        f"attack sockets the server cut off (each reopened at once): {cut['header']} slow-header "
        f"(no complete headers within the keep-alive timeout), {cut['body']} slow-body "
        f"(408 at the body deadline)"
    )


if __name__ == "__main__":
    main()
