"""How a decision query reaches OPA: the hot path's own keep-alive connection, or opa-python-client.

`OpaClientTransport` is opa-python-client's `OpaClient.query_rule` (requests
underneath): the client the project uses everywhere a decision is not on a
request's hot path (readiness probes, reload checks, engine checks).

`KeepAliveTransport` asks the same question, the same way (POST
`/v1/data/sessionstate/<package>/decision?provenance=true`, body
`{"input": ...}`, the sidecar's bearer token), over one persistent
`http.client` connection per thread. requests spends most of its time per
call on work a loopback query to one fixed host never needs (proxy and netrc
lookups in the environment, merging settings, building a prepared request,
a connection pool's bookkeeping); bench/policy_bench.py measures both (see
docs/performance.md). Nothing about failing closed changes: any error, a
timeout (`timeout` bounds the connect and each read), a status other than
200 or a body that is not JSON is an answer of `None`, and 401/403 is
`REFUSED`. A connection reused from an earlier call that turns out closed
before any answer arrived (OPA restarted, an idle connection dropped) is
opened once more within the same call: a decision query changes nothing, so
asking again is safe.
"""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any, Protocol
from urllib.parse import urlsplit

import requests
from opa_client.opa import OpaClient
from requests.adapters import HTTPAdapter

from service import tracing

REFUSING_STATUSES = (401, 403)  # OPA's authentication or its system.authz said no
REFUSED = "refused"


class DecisionTransport(Protocol):
    def query(self, package: str, document: dict[str, Any], encoded: bytes) -> Any:
        """OPA's answer (a dict), `REFUSED` for 401/403, `None` for anything else.

        `encoded` is `document` as JSON (its canonical bytes, which the trace digests too)."""
        ...

    def close(self) -> None: ...


def _endpoint(url: str) -> tuple[str, int, bool]:
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or parts.hostname is None:
        raise ValueError("OPA url must be http(s)://host:port")
    secure = parts.scheme == "https"
    return parts.hostname, parts.port or (443 if secure else 80), secure


class OpaClientTransport:
    """opa-python-client's `query_rule`."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
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


class KeepAliveTransport:
    """One persistent `http.client` connection per thread to the sidecar."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        self._host, self._port, secure = _endpoint(url)
        self._connection_class = (
            http.client.HTTPSConnection if secure else http.client.HTTPConnection
        )
        self._timeout = timeout
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._local = threading.local()
        self._opened: list[http.client.HTTPConnection] = []
        self._opened_guard = threading.Lock()

    def query(self, package: str, document: dict[str, Any], encoded: bytes) -> Any:
        path = f"/v1/data/sessionstate/{package}/decision?provenance=true"
        body = b'{"input":' + encoded + b"}"
        for fresh in (False, True):
            connection, reused = self._connection(fresh)
            try:
                connection.request("POST", path, body, tracing.outgoing(self._headers))
                answer = connection.getresponse()
                data = answer.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._drop(connection)
                if reused:
                    continue  # closed while idle: ask once more on a new connection
                return None
            except Exception:  # a timeout, a refused connection, a broken answer: deny
                self._drop(connection)
                return None
            if answer.will_close:
                self._drop(connection)
            if answer.status in REFUSING_STATUSES:
                return REFUSED
            if answer.status != 200:
                return None
            try:
                return json.loads(data)
            except ValueError:
                return None
        return None

    def _connection(self, fresh: bool) -> tuple[http.client.HTTPConnection, bool]:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is not None and not fresh:
            return connection, True
        connection = self._connection_class(self._host, self._port, timeout=self._timeout)
        self._local.connection = connection
        with self._opened_guard:
            self._opened.append(connection)
        return connection, False

    def _drop(self, connection: http.client.HTTPConnection) -> None:
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
