"""The HTTP front of the served process: slow or hostile clients, bodies, malformed HTTP.

Everything here runs against `sessionstate serve` as a real process (hypercorn,
the OPA sidecar, LevelDB), over raw sockets where the attack needs them.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from service.auth.tokens import mint_token
from tests.support.live import JWT_SECRET
from tests.support.served import Served, start

SESSION = "/v1/tenants/tenant-a/workspaces/ws-1/sessions/chat-1"
CANARY = "front-canary-7f3a9c"
STATE = {
    "runtime_profile": {
        "task_profile": "coding",
        "model_id": "m",
        "tokenizer": "t",
        "context_window": 4096,
        "max_tokens": 512,
        "streaming": True,
    },
    "memory_anchors": [{"anchor_id": "memory:active", "evidence": "e"}],
    "gene_anchors": [{"anchor_id": "gene:rust-coding", "evidence": "g"}],
    "turns": [{"turn_id": "turn-1", "role": "user", "payload": "hello"}],
}


def _token() -> str:
    return mint_token(
        JWT_SECRET.encode(),
        sub="front-test",
        roles=["model-service"],
        tenant="tenant-a",
        workspace="ws-1",
        session="chat-1",
        ttl_seconds=600,
    )


@pytest.fixture
def front(opa_bin: str, tmp_path) -> Iterator[Served]:  # type: ignore[no-untyped-def]
    """A served process with short read deadlines, so the tests need not wait long."""
    running = start(
        opa_bin,
        tmp_path / "var",
        tmp_path,
        extra_env={
            "SESSIONSTATE_READ_TIMEOUT_SECONDS": "3",
            "SESSIONSTATE_BODY_TIMEOUT_SECONDS": "4",
        },
    )
    yield running
    if running.process.poll() is None:
        running.process.terminate()
        running.process.wait(20)


def _address(served: Served) -> tuple[str, int]:
    host, port = served.url.removeprefix("http://").split(":")
    return host, int(port)


def _exchange(served: Served, raw: bytes, timeout: float = 10) -> bytes:
    with socket.create_connection(_address(served), timeout=timeout) as connection:
        connection.sendall(raw)
        answer = b""
        try:
            while chunk := connection.recv(65536):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    return answer


def _status(answer: bytes) -> int:
    return int(answer.split(b"\r\n", 1)[0].split()[1])


def _body(answer: bytes) -> dict[str, object]:
    document: dict[str, object] = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    return document


def _post_head(served: Served, extra: str) -> bytes:
    host, port = _address(served)
    return (
        f"POST {SESSION}/state/preview HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {_token()}\r\nContent-Type: application/json\r\n{extra}\r\n"
    ).encode()


class _SlowClients:
    """Sockets that send a request as slowly as the server lets them, until stopped."""

    def __init__(self, served: Served, headers: int, bodies: int, pause: float) -> None:
        self.served = served
        self.pause = pause
        self.stop = threading.Event()
        self.sockets: list[tuple[socket.socket, bytes]] = []
        for _ in range(headers):
            self._open(_post_head(self.served, "")[:-2], slow=b"X-Slow: a\r\n")
        for _ in range(bodies):
            self._open(_post_head(self.served, "Content-Length: 100000\r\n"), slow=b" ")
        self.thread = threading.Thread(target=self._trickle, daemon=True)
        self.thread.start()

    def _open(self, head: bytes, slow: bytes) -> None:
        connection = socket.create_connection(_address(self.served), timeout=5)
        connection.sendall(head)
        self.sockets.append((connection, slow))

    def _trickle(self) -> None:
        while not self.stop.wait(self.pause):
            for held in list(self.sockets):
                try:
                    held[0].sendall(held[1])
                except OSError:
                    self.sockets.remove(held)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for connection, _ in self.sockets:
            connection.close()


def test_fifty_slow_header_and_fifty_slow_body_clients_do_not_stop_others(front: Served) -> None:
    attackers = _SlowClients(front, headers=50, bodies=50, pause=1.0)
    try:
        time.sleep(1.5)  # every attacker has its request half sent
        answered = []
        for _ in range(20):
            health = requests.get(front.url + "/healthz", timeout=5)
            read = requests.get(
                front.url + SESSION + "/state",
                headers={"Authorization": f"Bearer {_token()}"},
                timeout=5,
            )
            answered.append((health.status_code, read.status_code))
        assert answered == [(200, 404)] * 20
        assert len(attackers.sockets) >= 90  # they were still connected while others were served
    finally:
        attackers.close()


def test_a_stalled_request_is_cut_off_after_the_read_timeout(front: Served) -> None:
    with socket.create_connection(_address(front), timeout=15) as connection:
        connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        # Closed by the server, nothing answered; a server that never closed it would make
        # this recv raise at the socket's own 15 s timeout instead.
        assert connection.recv(100) == b""


def test_a_body_that_trickles_past_its_deadline_is_408(front: Served) -> None:
    with socket.create_connection(_address(front), timeout=15) as connection:
        connection.sendall(_post_head(front, "Content-Length: 1000\r\n"))
        answer = b""
        give_up = time.monotonic() + 30
        # Half a byte a second: never idle for the read timeout, never done by the deadline.
        while not answer and time.monotonic() < give_up:
            readable, _, _ = select.select([connection], [], [], 0.5)
            if readable:
                while chunk := connection.recv(65536):
                    answer += chunk
                break
            connection.sendall(b" ")
    assert _status(answer) == 408
    assert _body(answer)["reason"] == "request_timeout"


def test_a_chunked_body_over_the_limit_is_413_and_nothing_is_written(front: Served) -> None:
    document = json.dumps(STATE).encode() + b" " * (3 * 1024 * 1024)
    chunks = b"".join(
        f"{len(document[i : i + 65536]):x}\r\n".encode() + document[i : i + 65536] + b"\r\n"
        for i in range(0, len(document), 65536)
    )
    head = _post_head(front, "Transfer-Encoding: chunked\r\n").replace(b"/state/preview", b"/state")
    answer = _exchange(front, head.replace(b"POST", b"PUT", 1) + chunks + b"0\r\n\r\n")
    assert _status(answer) == 413
    body = _body(answer)
    assert body["reason"] == "body_too_large"
    assert b"no-store" in answer.split(b"\r\n\r\n", 1)[0].lower()
    read = requests.get(
        front.url + SESSION + "/state", headers={"Authorization": f"Bearer {_token()}"}, timeout=5
    )
    assert read.status_code == 404


def test_a_declared_length_over_the_limit_is_413_before_the_body_is_sent(front: Served) -> None:
    answer = _exchange(front, _post_head(front, f"Content-Length: {3 * 1024 * 1024}\r\n"))
    assert _status(answer) == 413
    assert _body(answer)["reason"] == "body_too_large"


def test_a_chunked_body_within_the_limit_is_read_whole(front: Served) -> None:
    document = json.dumps(STATE).encode()
    head = _post_head(front, "Transfer-Encoding: chunked\r\nConnection: close\r\n")
    chunked = b"".join(
        f"{len(document[i : i + 7]):x}\r\n".encode() + document[i : i + 7] + b"\r\n"
        for i in range(0, len(document), 7)
    )
    answer = _exchange(front, head + chunked + b"0\r\n\r\n")
    assert _status(answer) == 200
    assert _body(answer)["record"]["turns"][0]["turn_id"] == "turn-1"  # type: ignore[index]


@pytest.mark.parametrize(
    "raw",
    [
        # two different Content-Lengths
        f"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\nX-{CANARY}: 1\r\n\r\nab",
        # a header line without a colon
        f"GET /healthz HTTP/1.1\r\nHost: x\r\n{CANARY}\r\n\r\n",
        # an over-long request line
        f"GET /{CANARY}{'a' * 20000} HTTP/1.1\r\nHost: x\r\n\r\n",
        # an over-long header
        f"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: {CANARY}{'a' * 20000}\r\n\r\n",
        # not HTTP at all
        f"{CANARY} {CANARY}\r\n\r\n",
    ],
    ids=["two-lengths", "no-colon", "long-line", "long-header", "garbage"],
)
def test_malformed_http_gets_a_plain_answer_that_echoes_nothing(front: Served, raw: str) -> None:
    answer = _exchange(front, raw.encode())
    assert _status(answer) in {400, 414, 431}
    assert CANARY.encode() not in answer
    assert b"<html" not in answer.lower()
    # and the service still answers
    assert requests.get(front.url + "/healthz", timeout=5).status_code == 200


def _exchange_to_close(served: Served, raw: bytes) -> tuple[bytes, bool]:
    """What the service answered to raw, and whether it closed the connection (the socket's
    own timeout is only a guard: a connection left open shows as not closed)."""
    with socket.create_connection(_address(served), timeout=15) as connection:
        connection.sendall(raw)
        answer = b""
        try:
            while chunk := connection.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
        except TimeoutError:
            return answer, False
    return answer, True


_PIPELINED = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"  # would be answered on an open connection


@pytest.mark.parametrize(
    ("head", "reason"),
    [
        (
            f"PUT {SESSION}/state HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            f"Transfer-Encoding: chunked\r\n\r\n5\r\n{CANARY[:5]}\r\n0\r\n\r\n",
            "conflicting_framing",
        ),
        (
            f"PUT {SESSION}/state HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            f"Content-Length: 5\r\n\r\n0\r\n\r\n",
            "conflicting_framing",
        ),
        (f"BREW{CANARY} /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "unknown_method"),
        (f"{CANARY}{'M' * 7000} {SESSION}/state HTTP/1.1\r\nHost: x\r\n\r\n", "unknown_method"),
        ("PATCH /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "unknown_method"),  # served by no route
    ],
    ids=["length-then-chunked", "chunked-then-length", "unknown-method", "7kb-method", "patch"],
)
def test_ambiguous_framing_and_unknown_methods_are_400_and_close_the_connection(
    front: Served, head: str, reason: str
) -> None:
    answer, closed = _exchange_to_close(front, head.encode() + _PIPELINED)
    assert closed
    assert answer.count(b"HTTP/1.1 ") == 1  # the pipelined request was never read
    assert _status(answer) == 400
    assert _body(answer)["reason"] == reason
    assert CANARY.encode() not in answer
    assert b"connection: close" in answer.split(b"\r\n\r\n", 1)[0].lower()
    # No route ran: the front counted it, the app logged no request, nothing of it is logged.
    metrics = requests.get(front.url + "/metrics", timeout=5).text
    assert f'sessionstate_http_refused_before_app_total{{reason="{reason}"}} 1.0' in metrics
    assert 'method="OTHER"' not in metrics and "PATCH" not in metrics
    logged = front.log.read_text()
    assert CANARY not in logged
    assert '"status":400' not in logged
    assert requests.get(front.url + "/healthz", timeout=5).status_code == 200


def test_a_request_framed_one_way_is_still_served_on_its_kept_alive_connection(
    front: Served,
) -> None:
    document = json.dumps(STATE).encode()
    head = _post_head(front, f"Content-Length: {len(document)}\r\n")
    with socket.create_connection(_address(front), timeout=15) as connection:
        connection.sendall(head + document + _PIPELINED)
        answer = b""
        while answer.count(b"HTTP/1.1 ") < 2 or not answer.endswith(b'{"status":"ok"}'):
            chunk = connection.recv(65536)
            assert chunk, answer
            answer += chunk
    assert _status(answer) == 200
