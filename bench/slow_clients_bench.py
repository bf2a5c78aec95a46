"""Normal reads during a slow-client attack, beside the same reads without it, one run.

Starts the real `sessionstate serve` (its OPA sidecar, LevelDB in a temporary
dir), stores one record, then measures governed reads (GET S/state) with
`wrk` through bench/loadgen.py (so the load generator's CPU does not dominate):

1. quiet: no attack;
2. attacked: while 50 slow-header sockets (a header line every few seconds,
   never finishing) and 50 slow-body sockets (headers sent, then a byte of
   the body every few seconds) are held open for the whole run; each one the
   server cuts off is reopened at once, so the attack keeps its strength.

It prints requests/s, p50 and p99 of each, the p99 ratio (attacked / quiet),
how many attack sockets the server cut off, and any socket errors wrk saw
(counted, not fatal); an answer other than 200 stops the run.
The claim being measured: a slow client costs a socket, not a thread.

Run: `make bench`, or `.venv/bin/python bench/slow_clients_bench.py
[--seconds 60 --connections 16 --headers 50 --bodies 50]`. Needs `wrk` on
PATH (Debian's package; `make bench` installs it when run as root).
"""

from __future__ import annotations

import argparse
import select
import socket
import sys
import tempfile
import threading
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.instances import SESSION, Served, bearer, grant_approval, token
from bench.loadgen import INSTALL_HINT, Load, Request, Result, available, run
from service.config.settings import Settings
from tests.support.factories import state_input


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


def reads(url: str, seconds: int, connections: int) -> Result:
    """wrk's figures for GET S/state: socket errors are counted, not fatal (the attack may
    cost some); any answer but 200 stops the run."""
    load = Load(
        url,
        (Request("GET", SESSION + "/state", bearer("model-service")),),
        connections=connections,
        threads=min(2, connections) if connections % 2 == 0 else 1,
        seconds=seconds,
        what=f"GET S/state at {connections} connections",
    )
    return run(load, tolerate_socket_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=60, help="each measurement (default 60)")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections")
    parser.add_argument("--headers", type=int, default=50, help="slow-header sockets")
    parser.add_argument("--bodies", type=int, default=50, help="slow-body sockets")
    parser.add_argument("--pause", type=float, default=3.0, help="seconds between trickles")
    args = parser.parse_args()
    if not available():
        raise SystemExit(INSTALL_HINT)
    opa = Settings().resolved_opa_bin()
    with tempfile.TemporaryDirectory() as tmp:
        served = Served(opa, Path(tmp))
        try:
            served.wait_ready()
            grant_approval(served.url)
            requests.put(
                served.url + SESSION + "/state",
                json=state_input(),
                headers=bearer("model-service"),
                timeout=5,
            ).raise_for_status()
            quiet = reads(served.url, args.seconds, args.connections)
            attackers = Attackers("127.0.0.1", served.port, args.headers, args.bodies, args.pause)
            try:
                attacked = reads(served.url, args.seconds, args.connections)
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
            f"{name:>10} {row.requests_per_second:9.0f} {row.p50_ms:8.2f} {row.p99_ms:8.2f} "
            f"{row.non_2xx:8d} {row.socket_error_count:8d}"
        )
    print(
        f"p99 attacked / quiet: {attacked.p99_ms / quiet.p99_ms:.2f}; "
        f"req/s attacked / quiet: {attacked.requests_per_second / quiet.requests_per_second:.2f}"
    )
    print(
        f"attack sockets the server cut off (each reopened at once): {cut['header']} slow-header "
        f"(no complete headers within the keep-alive timeout), {cut['body']} slow-body "
        f"(408 at the body deadline)"
    )


if __name__ == "__main__":
    main()
