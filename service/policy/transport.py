"""How a decision query reaches OPA: the hot path's own keep-alive socket, or opa-python-client.

`OpaClientTransport` is opa-python-client's `OpaClient.query_rule` (requests
underneath): the client the project uses everywhere a decision is not on a
request's hot path (readiness probes, reload checks, engine checks).

`KeepAliveTransport` asks the same question, the same way (POST
`/v1/data/sessionstate/<package>/decision?provenance=true`, body
`{"input": ...}`, the sidecar's bearer token, the decision span's
`traceparent`), over one persistent socket per thread: TCP (TLS for an
`https://` OPA), or the Unix domain socket an `http+unix://` URL names (the
socket's path percent-encoded, `unix_url`: how the service reaches the
sidecar it starts itself, which opa-python-client and requests cannot
speak). `status` asks it for a GET's status (`/health`) the same way.
Each request is written whole in one send, and OPA's
answer is parsed by httptools (llhttp, the C parser uvicorn uses).
requests spends most of its time per call on work a loopback query to one
fixed host never needs (proxy and netrc lookups in the environment, merging
settings, a connection pool's bookkeeping), and http.client parses every
answer's headers through the `email` package; bench/policy_bench.py measures
the transports (see docs/performance.md).

Nothing about failing closed changes: any error, a timeout, a status other
than 200, a body that is not a JSON object, or an answer cut short is an
answer of `None`, and 401/403 is `REFUSED`. `timeout` bounds the connect and
each read, and the whole call too: an OPA that trickles its answer a byte at
a time cannot stretch a decision past it. A connection reused from an
earlier call that turns out closed before any byte of the answer arrived
(OPA restarted, an idle connection dropped) is opened once more within the
same call: a decision query changes nothing, so asking again is safe. A
connection is kept for the next call only after a whole, single answer that
OPA (`Connection: close`) or its HTTP version does not ask to close, and is
used again only if nothing arrived on it since: a late byte would otherwise
be read as the start of the next question's answer.
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, unquote, urlsplit

import httptools
import requests
from requests.adapters import HTTPAdapter

from service.observability import tracing

REFUSING_STATUSES = (401, 403)  # OPA's authentication or its system.authz said no
REFUSED = "refused"


class DecisionTransport(Protocol):
    def query(self, package: str, document: dict[str, Any], encoded: bytes) -> Any:
        """OPA's answer (a dict), `REFUSED` for 401/403, `None` for anything else.

        `encoded` is `document` as JSON (its canonical bytes, which the trace digests too)."""
        ...

    def close(self) -> None: ...


UNIX_SCHEME = "http+unix"
UNIX_HOST = "localhost"  # the Host field of a request over a Unix socket
# AF_UNIX's sun_path holds 108 bytes on Linux, the terminating NUL among them.
MAX_SOCKET_PATH = 107


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where an OPA listens: a host and port (TLS for https), or a Unix socket's path."""

    host: str
    port: int
    secure: bool = False
    unix_path: str | None = None


def unix_url(path: Path | str) -> str:
    """The URL of an OPA on the Unix socket at `path`: `http+unix://` and the path,
    percent-encoded (so that its slashes do not read as the URL's)."""
    return f"{UNIX_SCHEME}://{quote(str(path), safe='')}"


def is_unix_url(url: str) -> bool:
    return url.startswith(f"{UNIX_SCHEME}://")


def endpoint(url: str) -> Endpoint:
    """The endpoint of an `http(s)://host[:port]` or `http+unix://<encoded path>` URL."""
    parts = urlsplit(url)
    if parts.scheme == UNIX_SCHEME:
        path = unquote(parts.netloc)
        if (
            not path.startswith("/")
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
            or "\x00" in path
            or len(path.encode()) > MAX_SOCKET_PATH
        ):
            raise ValueError("an OPA url on a Unix socket must be http+unix://<encoded path>")
        return Endpoint(UNIX_HOST, 80, unix_path=path)
    if parts.scheme not in {"http", "https"} or parts.hostname is None:
        raise ValueError("OPA url must be http(s)://host:port")
    secure = parts.scheme == "https"
    return Endpoint(parts.hostname, parts.port or (443 if secure else 80), secure)


def _endpoint(url: str) -> tuple[str, int, bool]:
    """A TCP endpoint's host, port and TLS, for opa-python-client (which has no other)."""
    found = endpoint(url)
    if found.unix_path is not None:
        raise ValueError("opa-python-client cannot reach an OPA on a Unix socket")
    return found.host, found.port, found.secure


class OpaClientTransport:
    """opa-python-client's `query_rule`."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        # Imported here: it brings aiohttp (a fifth of the CLI's start-up), which only this
        # transport needs, and the default one is the keep-alive socket.
        from opa_client.opa import OpaClient

        host, port, secure = _endpoint(url)
        self._opa = OpaClient(
            host=host,
            port=port,
            ssl=secure,
            token=token,
            retries=0,  # a retry would stretch the deadline; failing closed is the answer
            timeout=timeout,
        )
        # The decision span's `traceparent` on each query, when tracing is on.
        traced = _TracedAdapter(max_retries=0)
        for prefix in ("http://", "https://"):
            self._opa._session.mount(prefix, traced)

    def query(self, package: str, document: dict[str, Any], encoded: bytes) -> Any:
        try:
            return self._opa.query_rule(
                input_data=document,
                package_path=f"sessionstate.{package}",
                rule_name="decision",
                query_params={"provenance": "true"},
            )
        except requests.HTTPError as error:
            status = None if error.response is None else error.response.status_code
            return REFUSED if status in REFUSING_STATUSES else None
        except Exception:  # any failure to get an answer denies
            return None

    def close(self) -> None:
        self._opa.close_connection()


class _TracedAdapter(HTTPAdapter):
    """requests' adapter, which adds the current span's W3C trace context to each request."""

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> Any:
        tracing.inject(request.headers)
        return super().send(request, *args, **kwargs)


_PACKAGE = re.compile(r"[a-z][a-z0-9_]*")  # a decision package, one segment of the path
_NOT_IN_A_FIELD = re.compile(r"[\r\n\x00]")
_BODY_START, _BODY_END = b'{"input":', b"}"
RECEIVE_BYTES = 65536


class _ClosedBeforeAnswer(Exception):
    """The connection was found closed before any byte of the answer arrived."""


class _Answer:
    """httptools' callbacks for one answer: its status, its body, whether it is whole, and
    whether the connection may carry the next request."""

    __slots__ = ("body", "complete", "keep", "messages", "parser", "status")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.keep = False
        self.body = bytearray()
        self.complete = False
        self.messages = 0  # more than one: bytes after the answer, which nobody asked for

    def on_message_begin(self) -> None:
        self.messages += 1

    def on_headers_complete(self) -> None:
        # Read here: once the message is complete, the parser has reset for the next one.
        self.status = self.parser.get_status_code()
        self.keep = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


def _field(name: str, value: str) -> bytes:
    if _NOT_IN_A_FIELD.search(name) or _NOT_IN_A_FIELD.search(value):
        raise ValueError("a header field may not hold CR, LF or NUL")
    return f"{name}: {value}\r\n".encode("latin-1")


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the decision's deadline passed")
    return left


class KeepAliveTransport:
    """One persistent socket per thread to OPA (TCP, or a Unix socket); httptools reads."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        self._endpoint = found = endpoint(url)
        self._host, self._port = found.host, found.port
        self._tls = ssl.create_default_context() if found.secure else None
        self._timeout = timeout
        host = f"[{self._host}]" if ":" in self._host else self._host
        if found.unix_path is None and self._port != (443 if found.secure else 80):
            host = f"{host}:{self._port}"
        fields: dict[str, str] = {"Host": host}
        if token:
            fields["Authorization"] = f"Bearer {token}"
        try:
            # A GET's fields (`status`), then a decision query's.
            self._get_fields: bytes | None = b"".join(_field(*item) for item in fields.items())
            self._fields: bytes | None = self._get_fields + _field(
                "Content-Type", "application/json"
            )
        except ValueError:  # a token no header can carry: every query fails closed
            self._get_fields = self._fields = None
        self._heads: dict[str, bytes] = {}  # by package: the request line and fixed fields
        self._local = threading.local()
        self._opened: list[socket.socket] = []
        self._opened_guard = threading.Lock()

    def query(self, package: str, document: dict[str, Any], encoded: bytes) -> Any:
        deadline = time.monotonic() + self._timeout
        try:
            request = self._request(package, encoded)
        except ValueError:
            return None
        answered = self._ask(request, deadline)
        if answered is None:
            return None
        status, body = answered
        if status in REFUSING_STATUSES:
            return REFUSED
        if status != 200:
            return None
        try:
            answer = json.loads(body)
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None

    def status(self, target: str) -> int | None:
        """The status of OPA's answer to `GET target` (`/health?bundles=true`, say); None when
        none came within the timeout."""
        if self._get_fields is None or _NOT_IN_A_FIELD.search(target) or " " in target:
            return None
        request = f"GET {target} HTTP/1.1\r\n".encode() + self._get_fields + b"\r\n"
        answered = self._ask(request, time.monotonic() + self._timeout)
        return None if answered is None else answered[0]

    def _ask(self, request: bytes, deadline: float) -> tuple[int, bytearray] | None:
        """Send request on this thread's connection and read its whole answer: its status
        and body; None when none came (refused, a timeout, a reset, a broken or cut answer).
        A reused connection found closed before any byte of the answer is opened once more."""
        for fresh in (False, True):
            try:
                connection, reused = self._connection(fresh, deadline)
            except Exception:  # refused, a timeout: deny
                return None
            try:
                status, body, keep = _exchange(connection, request, deadline)
            except _ClosedBeforeAnswer:
                self._drop(connection)
                if reused:
                    continue  # closed as it was asked: once more on a new connection
                return None
            except Exception:  # a timeout, a reset, a broken or cut answer: deny
                self._drop(connection)
                return None
            if not keep:
                self._drop(connection)
            return status, body
        return None

    def _request(self, package: str, encoded: bytes) -> bytes:
        """The whole request: its line and fields, then `{"input": <encoded>}`."""
        head = self._heads.get(package)
        if head is None:
            if self._fields is None or not _PACKAGE.fullmatch(package):
                raise ValueError("no request can be made")
            line = f"POST /v1/data/sessionstate/{package}/decision?provenance=true HTTP/1.1\r\n"
            head = self._heads[package] = line.encode("ascii") + self._fields
        traced: dict[str, str] = {}
        tracing.inject(traced)  # the decision span's `traceparent`, when tracing is on
        return b"".join(
            (
                head,
                *(_field(name, value) for name, value in traced.items()),
                b"Content-Length: %d\r\n\r\n" % (len(_BODY_START) + len(encoded) + len(_BODY_END)),
                _BODY_START,
                encoded,
                _BODY_END,
            )
        )

    def _connection(self, fresh: bool, deadline: float) -> tuple[socket.socket, bool]:
        connection: socket.socket | None = getattr(self._local, "connection", None)
        if connection is not None and not fresh:
            if self._tls is not None or _quiet(connection):
                return connection, True
            self._drop(connection)
        connection = self._connect(deadline)
        self._local.connection = connection
        with self._opened_guard:
            self._opened.append(connection)
        return connection, False

    def _connect(self, deadline: float) -> socket.socket:
        if self._endpoint.unix_path is not None:
            return _connect_unix(self._endpoint.unix_path, deadline)
        connection = socket.create_connection(
            (self._host, self._port), timeout=_remaining(deadline)
        )
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                connection.settimeout(_remaining(deadline))
                return self._tls.wrap_socket(connection, server_hostname=self._host)
        except BaseException:
            connection.close()
            raise
        return connection

    def _drop(self, connection: socket.socket) -> None:
        connection.close()
        if getattr(self._local, "connection", None) is connection:
            self._local.connection = None
        with self._opened_guard:
            if connection in self._opened:
                self._opened.remove(connection)

    def close(self) -> None:
        with self._opened_guard:
            opened, self._opened = self._opened, []
        for connection in opened:
            connection.close()
        self._local = threading.local()


def _connect_unix(path: str, deadline: float) -> socket.socket:
    """A connection to the Unix socket at path (EACCES for a user the socket's directory
    or mode keeps out)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.settimeout(_remaining(deadline))
        connection.connect(path)
    except BaseException:
        connection.close()
        raise
    return connection


def _quiet(connection: socket.socket) -> bool:
    """Nothing arrived on a kept connection since its last answer: neither bytes nobody
    asked for (which the next call would take for its answer) nor its close."""
    connection.settimeout(0)
    try:
        connection.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def _exchange(
    connection: socket.socket, request: bytes, deadline: float
) -> tuple[int, bytearray, bool]:
    """Send request and read one whole answer: its status, its body, and whether the
    connection may carry the next request."""
    try:
        connection.settimeout(_remaining(deadline))
        connection.sendall(request)
    except (BrokenPipeError, ConnectionResetError) as closed:
        raise _ClosedBeforeAnswer from closed
    answer = _Answer()
    try:
        received = False
        while not answer.complete:
            connection.settimeout(_remaining(deadline))
            try:
                data = connection.recv(RECEIVE_BYTES)
            except ConnectionResetError as reset:
                if received:
                    raise
                raise _ClosedBeforeAnswer from reset
            if not data:
                if received:
                    raise ConnectionError("the connection closed in the middle of the answer")
                raise _ClosedBeforeAnswer
            received = True
            answer.parser.feed_data(data)
    finally:
        del answer.parser  # it holds the answer: no cycle left for the garbage collector
    if answer.messages != 1:
        raise ConnectionError("more than one answer to one request")
    keep = answer.keep and answer.status >= 200  # after an interim 1xx, the rest follows
    return answer.status, answer.body, keep
