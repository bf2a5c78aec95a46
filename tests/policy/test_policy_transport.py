"""The hot path's decision transport against a scripted server.

What a real OPA cannot be made to do on cue (garbage, a cut answer, a second answer, an
answer a byte at a time, a connection closed while idle) comes from `ScriptedOpa`: it
reads each request whole and sends the next scripted reply. It listens on loopback TCP
(an OPA of the operator's) or on a Unix socket (the sidecar the service starts), and
every test runs on both. Real OPA's failures (killed, restarted, paused, a wrong token)
are tests/policy/test_policy_engine.py's.
"""

from __future__ import annotations

import json
import select
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httptools
import pytest

from service.policy.client import PolicyClient
from service.policy.transport import (
    MAX_SOCKET_PATH,
    REFUSED,
    KeepAliveTransport,
    endpoint,
    unix_url,
)
from tests.support.policy_inputs import allowed_input

TOKEN = "t0ken-of-the-sidecar"
DECIDED = {"result": {"allow": True, "reasons": []}, "decision_id": "d-1"}
BODY = json.dumps(DECIDED, separators=(",", ":")).encode()
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)


@dataclass
class Reply:
    data: bytes
    then: Literal["keep", "close"] = "keep"  # the connection, once the reply is sent
    trickle: bool = False  # one byte at a time, 20 ms apart
    late: bytes = b""  # sent after data once `release_late` is set


class _Request:
    """httptools' callbacks on the server side: the request is whole."""

    def __init__(self) -> None:
        self.complete = False

    def on_message_complete(self) -> None:
        self.complete = True


class ScriptedOpa:
    """Answers the requests it reads, on any connection, with the next of its replies;
    with none left it reads the request and closes the connection without a byte."""

    def __init__(self, replies: list[Reply], unix_path: Path | None = None) -> None:
        self.replies = list(replies)
        self.requests: list[bytes] = []
        self.connections = 0
        self.finished = 0
        self.transports: list[KeepAliveTransport] = []
        self.changed = threading.Condition()
        self.release_late = threading.Event()
        self.late_sent = threading.Event()
        if unix_path is None:
            self.listener = socket.socket()
            self.listener.bind(("127.0.0.1", 0))
            self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        else:
            self.listener = socket.socket(socket.AF_UNIX)
            self.listener.bind(str(unix_path))
            self.url = unix_url(unix_path)
        self.listener.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def transport(self, timeout: float = 1.0, token: str | None = TOKEN) -> KeepAliveTransport:
        """A transport to this server, closed with it."""
        made = KeepAliveTransport(self.url, token, timeout)
        self.transports.append(made)
        return made

    def client(self, timeout: float = 1.0) -> PolicyClient:
        return PolicyClient(self.url, TOKEN, timeout=timeout, transport="keep-alive")

    def wait_finished(self, count: int) -> bool:
        """Wait until count connections have ended on the server's side."""
        with self.changed:
            return self.changed.wait_for(lambda: self.finished >= count, timeout=10)

    def close(self) -> None:
        for transport in self.transports:
            transport.close()
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with self.changed:
                self.connections += 1
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        try:
            with connection:
                while (raw := _read_request(connection)) is not None:
                    self.requests.append(raw)
                    reply = self.replies.pop(0) if self.replies else Reply(b"", "close")
                    if reply.trickle:
                        for byte in reply.data:
                            connection.sendall(bytes([byte]))
                            time.sleep(0.02)
                    else:
                        connection.sendall(reply.data)
                    if reply.late and self.release_late.wait(10):
                        connection.sendall(reply.late)
                        self.late_sent.set()
                    if reply.then == "close":
                        return
        except OSError:
            pass  # the client went away
        finally:
            with self.changed:
                self.finished += 1
                self.changed.notify_all()


def _read_request(connection: socket.socket) -> bytes | None:
    """One whole request's bytes, or None when the client closed the connection."""
    request = _Request()
    parser = httptools.HttpRequestParser(request)
    raw = bytearray()
    while not request.complete:
        data = connection.recv(65536)
        if not data:
            return None
        raw += data
        parser.feed_data(data)
    return bytes(raw)


def answer(status: str, body: bytes, *fields: str) -> bytes:
    head = [f"HTTP/1.1 {status}", *fields]
    if not any(field.lower().startswith("transfer-encoding") for field in fields):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@pytest.fixture(params=["tcp", "unix"])
def scripted(request: pytest.FixtureRequest) -> Iterator[Callable[..., ScriptedOpa]]:
    """Makes a scripted OPA with the replies given, on a loopback port or a Unix socket."""
    started: list[ScriptedOpa] = []
    # A short directory: a Unix socket's path holds at most 107 bytes.
    sockets = Path(tempfile.mkdtemp(prefix="opa-")) if request.param == "unix" else None

    def make(*replies: Reply) -> ScriptedOpa:
        path = None if sockets is None else sockets / f"{len(started)}.sock"
        server = ScriptedOpa(list(replies), path)
        started.append(server)
        return server

    yield make
    for server in started:
        server.close()
    if sockets is not None:
        shutil.rmtree(sockets)


def _host_field(opa: ScriptedOpa) -> bytes:
    """What Host says: the port's address, or `localhost` on a Unix socket."""
    if opa.url.startswith("http+unix://"):
        return b"localhost"
    return b"127.0.0.1:" + opa.url.rsplit(":", 1)[1].encode()


# --- the request ----------------------------------------------------------------------


class _Seen:
    """httptools' callbacks: what a server reads of the request."""

    def __init__(self) -> None:
        self.url = b""
        self.fields: list[tuple[bytes, bytes]] = []
        self.body = b""
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


@pytest.mark.parametrize("token", [TOKEN, None])
def test_the_request_on_the_wire_is_one_well_formed_decision_query(
    scripted: Callable[..., ScriptedOpa], token: str | None
) -> None:
    opa = scripted(Reply(OK))
    document = allowed_input("write").model_dump(mode="json", by_alias=True)
    encoded = json.dumps(document, separators=(",", ":")).encode()
    transport = opa.transport(token=token)
    assert transport.query("write", document, encoded) == DECIDED
    (raw,) = opa.requests
    seen = _Seen()
    parser = httptools.HttpRequestParser(seen)
    parser.feed_data(raw)
    assert seen.complete  # and nothing after it: feed_data raises on trailing bytes
    assert parser.get_method() == b"POST"
    assert parser.get_http_version() == "1.1"
    assert parser.should_keep_alive()
    assert seen.url == b"/v1/data/sessionstate/write/decision?provenance=true"
    fields = dict(seen.fields)
    assert len(fields) == len(seen.fields)  # no field twice
    expected = {
        b"host": _host_field(opa),
        b"content-type": b"application/json",
        b"content-length": str(len(seen.body)).encode(),
    }
    if token is not None:
        expected[b"authorization"] = f"Bearer {token}".encode()
    assert fields == expected
    assert seen.body == b'{"input":' + encoded + b"}"
    assert json.loads(seen.body) == {"input": document}


def test_an_unusable_package_name_is_not_asked(scripted: Callable[..., ScriptedOpa]) -> None:
    opa = scripted(Reply(OK))
    transport = opa.transport()
    climbing = "read/" + "/".join([".."] * 2) + "/v1/policies"  # up and out of the package path
    assert transport.query(climbing, {}, b"{}") is None
    assert transport.query("read decision", {}, b"{}") is None
    transport.close()
    assert opa.requests == []


# --- answers --------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["401 Unauthorized", "403 Forbidden"])
def test_401_and_403_are_a_refusal_and_keep_the_connection(
    scripted: Callable[..., ScriptedOpa], status: str
) -> None:
    body = b'{"code":"unauthorized","message":"the token is wrong"}'
    opa = scripted(Reply(answer(status, body)), Reply(OK))
    transport = opa.transport()
    assert transport.query("read", {}, b"{}") == REFUSED
    assert transport.query("read", {}, b"{}") == DECIDED
    assert opa.connections == 1
    trace = scripted(Reply(answer(status, body))).client().decide(allowed_input("read"))
    assert trace.allow is False
    assert trace.reasons == ["policy_engine_refused"]


def test_a_chunked_answer_is_read_whole(scripted: Callable[..., ScriptedOpa]) -> None:
    """OPA sends a large answer (an impact batch's) in chunks."""
    body = json.dumps({"result": {str(i): {"allow": True} for i in range(2000)}}).encode()
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 4096]), body[i : i + 4096])
        for i in range(0, len(body), 4096)
    )
    opa = scripted(Reply(answer("200 OK", chunks + b"0\r\n\r\n", "Transfer-Encoding: chunked")))
    transport = opa.transport()
    assert transport.query("read", {}, b"{}") == json.loads(body)


UNUSABLE: dict[str, Reply] = {
    "not HTTP": Reply(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"),
    "a body that is not JSON": Reply(answer("200 OK", b"<html>OPA</html>")),
    "JSON that is not an object": Reply(answer("200 OK", b"[" + BODY + b"]")),
    "another status": Reply(answer("500 Internal Server Error", b'{"code":"internal_error"}')),
    "a redirect": Reply(answer("307 Temporary Redirect", b"", "Location: http://elsewhere/")),
    "an interim answer only": Reply(b"HTTP/1.1 100 Continue\r\n\r\n", "close"),
    "headers cut short": Reply(b"HTTP/1.1 200 OK\r\nContent-Le", "close"),
    "a body cut short": Reply(OK[:-5], "close"),
    "a chunked body cut short": Reply(
        answer("200 OK", b"%x\r\n%s\r\n" % (len(BODY), BODY), "Transfer-Encoding: chunked"),
        "close",
    ),
    "a second answer nobody asked for": Reply(OK + answer("200 OK", b"")),
    "a Content-Length that lies": Reply(OK.replace(b"Length: %d" % len(BODY), b"Length: 9")),
}


@pytest.mark.parametrize("reply", UNUSABLE.values(), ids=UNUSABLE.keys())
def test_an_unusable_answer_fails_closed_and_the_next_call_gets_its_own_answer(
    scripted: Callable[..., ScriptedOpa], reply: Reply
) -> None:
    opa = scripted(reply, Reply(OK))
    client = opa.client()
    try:
        trace = client.decide(allowed_input("read"))
        assert trace.allow is False
        assert trace.reasons == ["policy_engine_unavailable"]
        assert trace.decision_id.startswith("local-")
        # Nothing left of the broken exchange is taken for the next answer.
        assert client.decide(allowed_input("read")).decision_id == "d-1"
    finally:
        client.close()


def test_a_trickling_answer_is_cut_at_the_deadline(scripted: Callable[..., ScriptedOpa]) -> None:
    """Each byte comes well within the timeout; the whole answer does not."""
    opa = scripted(Reply(OK, trickle=True))  # about 100 bytes, 20 ms apart
    transport = opa.transport(timeout=0.25)
    assert transport.query("read", {}, b"{}") is None


def test_a_server_that_never_answers_times_out(scripted: Callable[..., ScriptedOpa]) -> None:
    opa = scripted(Reply(b""))  # reads the request, keeps the connection, says nothing
    trace = opa.client(timeout=0.25).decide(allowed_input("read"))
    assert trace.reasons == ["policy_engine_unavailable"]


# --- the connection -------------------------------------------------------------------


def test_one_connection_carries_call_after_call(scripted: Callable[..., ScriptedOpa]) -> None:
    opa = scripted(*[Reply(OK)] * 5)
    transport = opa.transport()
    assert [transport.query("read", {}, b"{}") for _ in range(5)] == [DECIDED] * 5
    assert opa.connections == 1


CLOSING: dict[str, bytes] = {
    "Connection: close": answer("200 OK", BODY, "Connection: close"),
    "HTTP/1.0": answer("200 OK", BODY).replace(b"HTTP/1.1", b"HTTP/1.0", 1),
}


@pytest.mark.parametrize("reply", CLOSING.values(), ids=CLOSING.keys())
def test_an_answer_that_closes_the_connection_is_taken_and_the_connection_is_not_reused(
    scripted: Callable[..., ScriptedOpa], reply: bytes
) -> None:
    opa = scripted(Reply(reply), Reply(OK))  # the server itself keeps the connection open
    transport = opa.transport()
    assert transport.query("read", {}, b"{}") == DECIDED
    assert transport.query("read", {}, b"{}") == DECIDED
    assert opa.connections == 2


def test_a_connection_closed_while_idle_is_opened_again_within_the_call(
    scripted: Callable[..., ScriptedOpa],
) -> None:
    opa = scripted(Reply(OK, then="close"), Reply(OK))
    transport = opa.transport()
    assert transport.query("read", {}, b"{}") == DECIDED
    assert opa.wait_finished(1)
    assert transport.query("read", {}, b"{}") == DECIDED
    assert opa.connections == 2


def test_a_reused_connection_closed_before_the_answer_is_asked_again_once(
    scripted: Callable[..., ScriptedOpa],
) -> None:
    """Closed after the request was sent (OPA restarting): the same call asks again."""
    opa = scripted(Reply(OK), Reply(b"", then="close"), Reply(OK))
    transport = opa.transport()
    assert transport.query("read", {}, b"{}") == DECIDED
    assert transport.query("read", {}, b"{}") == DECIDED
    assert opa.connections == 2
    assert len(opa.requests) == 3


def test_a_new_connection_closed_before_the_answer_is_not_asked_again(
    scripted: Callable[..., ScriptedOpa],
) -> None:
    opa = scripted(Reply(b"", then="close"), Reply(b"", then="close"))
    transport = opa.transport()
    assert transport.query("read", {}, b"{}") is None
    assert opa.connections == 1


def test_bytes_arriving_after_an_answer_are_never_the_next_answer(
    scripted: Callable[..., ScriptedOpa],
) -> None:
    stale = answer("200 OK", b'{"result":"stale"}')
    opa = scripted(Reply(OK, late=stale), Reply(OK))
    transport = opa.transport()
    assert transport.query("read", {}, b"{}") == DECIDED
    opa.release_late.set()
    assert opa.late_sent.wait(10)
    connection = transport._local.connection  # the late answer is there to be read
    assert select.select([connection], [], [], 10)[0] == [connection]
    assert transport.query("read", {}, b"{}") == DECIDED
    assert opa.connections == 2


def test_close_closes_the_connection_of_every_thread(scripted: Callable[..., ScriptedOpa]) -> None:
    opa = scripted(Reply(OK), Reply(OK))
    transport = opa.transport()
    answers: list[Any] = []
    threads = [
        threading.Thread(target=lambda: answers.append(transport.query("read", {}, b"{}")))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [DECIDED, DECIDED]
    assert opa.connections == 2
    assert opa.finished == 0
    transport.close()
    assert opa.wait_finished(2)


# --- a GET's status (/health) ---------------------------------------------------------


@pytest.mark.parametrize("token", [TOKEN, None])
def test_a_get_is_well_formed_and_its_status_is_read(
    scripted: Callable[..., ScriptedOpa], token: str | None
) -> None:
    opa = scripted(Reply(answer("200 OK", b"{}")), Reply(answer("500 Internal Server Error", b"")))
    transport = opa.transport(token=token)
    assert transport.status("/health?bundles=true") == 200
    assert transport.status("/health?bundles=true") == 500
    assert opa.connections == 1
    seen = _Seen()
    parser = httptools.HttpRequestParser(seen)
    parser.feed_data(opa.requests[0])
    assert seen.complete
    assert parser.get_method() == b"GET"
    assert seen.url == b"/health?bundles=true"
    expected = {b"host": _host_field(opa)}
    if token is not None:
        expected[b"authorization"] = f"Bearer {token}".encode()
    assert dict(seen.fields) == expected
    assert seen.body == b""


def test_a_get_without_an_answer_has_no_status(scripted: Callable[..., ScriptedOpa]) -> None:
    opa = scripted(Reply(b""), Reply(b"HTTP/1.1 200 OK\r\nContent-Le", "close"))
    transport = opa.transport(timeout=0.25)
    assert transport.status("/health") is None  # never answered
    assert transport.status("/health") is None  # cut short
    assert transport.status("/health HTTP/1.1\r\nX: y") is None  # never sent
    assert len(opa.requests) == 2


def test_probes_reach_an_opa_on_a_unix_socket(scripted: Callable[..., ScriptedOpa]) -> None:
    """opa-python-client cannot reach a Unix socket: there the probe takes the kept-alive
    socket, and so does every decision, whatever transport the client was asked for."""
    opa = scripted(Reply(OK), Reply(OK))
    client = PolicyClient(opa.url, TOKEN, timeout=1.0)
    try:
        assert client.probe().decision_id == "d-1"
        assert client.decide(allowed_input("read")).decision_id == "d-1"
    finally:
        client.close()


# --- where OPA listens ----------------------------------------------------------------


def test_a_unix_url_names_its_socket_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "dir with space%" / "opa.sock"
    found = endpoint(unix_url(path))
    assert (found.unix_path, found.host) == (str(path), "localhost")
    assert endpoint("http://127.0.0.1:8181").unix_path is None
    for wrong in (
        "http+unix://opa.sock",  # not an absolute path
        "http+unix://%2Frun%2Fopa.sock/v1/data",  # a path after the socket
        "http+unix://%2Frun%2Fopa.sock?x=1",
        "http+unix://%2Frun%2Fopa%00.sock",
        unix_url("/" + "s" * MAX_SOCKET_PATH),  # longer than a socket's path can be
        "unix:///run/opa.sock",
    ):
        with pytest.raises(ValueError):
            endpoint(wrong)


def test_a_socket_nobody_listens_on_fails_closed_at_once(tmp_path: Path) -> None:
    transport = KeepAliveTransport(unix_url(tmp_path / "gone.sock"), None, 1.0)
    started = time.monotonic()
    assert transport.query("read", {}, b"{}") is None
    assert transport.status("/health") is None
    assert time.monotonic() - started < 0.5
