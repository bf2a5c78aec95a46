"""Liveness and metrics answered on the event loop, without a request thread.

`GET /healthz` and `GET /metrics` (and `HEAD`) need nothing a request thread
gives: no token, no decision, no store, no body. Handed to a thread they cost
two hops under the GIL, and while every request thread is busy (a slow OPA, a
flood of writes) a liveness probe waits behind them, and a kubelet may restart
a process that is alive. The HTTP front (`service.http.front`) asks `LoopAnswers`
first, once the request has fully arrived; what it does not answer goes to the
app. `/readyz` is not answered here: it asks OPA and the store, which may block.

An answer here is the app's answer: the same body, `Cache-Control: no-store`,
`X-Request-Id` (the caller's when well formed), the worker's header, a count in
`sessionstate_http_requests` and the `request` log line. Rendering the metrics
failing is not answered here: the app then answers, as it would have.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypercorn.typing import HTTPScope

from service.api.v1 import HEALTHZ, METRICS, REQUEST_ID, WORKER
from service.api.wire import Health
from service.context import ServiceContext
from service.http.request_ids import request_id

log = logging.getLogger("sessionstate.http")  # the app's request log
_METHODS = ("GET", "HEAD")
_REQUEST_ID_HEADER = REQUEST_ID.lower().encode("latin-1")


@dataclass(frozen=True)
class _Route:
    body: Callable[[], bytes]
    content_type: bytes


class LoopAnswers:
    """The routes the event loop answers itself, for one `ServiceContext`."""

    def __init__(self, context: ServiceContext) -> None:
        self._context = context
        self._routes = {
            HEALTHZ: _Route(_health, b"application/json"),
            METRICS: _Route(context.metrics.render, b"text/plain; version=0.0.4; charset=utf-8"),
        }

    def answer(self, scope: HTTPScope) -> list[dict[str, Any]] | None:
        """The ASGI messages of the answer, or None: the app answers this request."""
        route = self._routes.get(scope["path"])
        if route is None or scope["method"] not in _METHODS:
            return None
        started = time.perf_counter()
        try:
            body = route.body()
        except Exception:  # the app answers (and logs) it, as it would have
            return None
        rid = request_id(_incoming_id(scope))
        self._count(scope, rid, started)
        return [
            {
                "type": "http.response.start",
                "status": 200,
                "headers": self._headers(route, body, rid),
            },
            {
                "type": "http.response.body",
                "body": b"" if scope["method"] == "HEAD" else body,
                "more_body": False,
            },
        ]

    def _headers(self, route: _Route, body: bytes, rid: str) -> list[tuple[bytes, bytes]]:
        headers = [
            (b"content-type", route.content_type),
            (b"content-length", str(len(body)).encode()),
            (_REQUEST_ID_HEADER, rid.encode()),
            (b"cache-control", b"no-store"),
        ]
        worker = self._context.worker_label
        if worker is not None:
            headers.append((WORKER.lower().encode(), worker.encode()))
        return headers

    def _count(self, scope: HTTPScope, rid: str, started: float) -> None:
        path, method = scope["path"], scope["method"]
        self._context.metrics.requests.labels(path, method, "200").inc()
        log.info(
            "request",
            extra={
                "request_id": rid,
                "method": method,
                "route": path,
                "status": 200,
                "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                "actor": None,
                "decision_id": None,
                "allow": None,
                "reason": None,
            },
        )


def _health() -> bytes:
    return Health().model_dump_json().encode()


def _incoming_id(scope: HTTPScope) -> str:
    for name, value in scope["headers"]:
        if name == _REQUEST_ID_HEADER:
            return value.decode("latin-1")
    return ""
