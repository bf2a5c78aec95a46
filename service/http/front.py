"""The HTTP front: hypercorn reads every request on an event loop, then a thread runs the app.

Why hypercorn and not gunicorn's threads: a gthread worker hands a connection
to a thread as soon as its first byte arrives, and that thread then blocks
until the client has sent its headers and body, however slowly. Eight slow
clients took all eight threads. Here headers and body are read on the event
loop, where a slow client costs a socket and a coroutine, and a thread is
taken only for a request that has fully arrived. Reads are bounded three ways:
an idle timeout between reads (headers and body), a total deadline for the
body, limits on the request target (8 KiB) and
headers (16 KiB), and the 1 MiB body limit, which answers 413 before the app runs whatever
the framing (Content-Length, chunked, or neither).

Liveness and metrics are answered on the event loop itself, once the request has
arrived (`service.http.loop_answers`); every other request runs in a thread.

A method no route serves (`service.api.v1.METHODS`) and a request that
carries both `Content-Length` and `Transfer-Encoding` are answered 400 here,
with the connection closed, before any route runs.

Answers given here, before the app, are the same problem documents the app
gives, and each closes its connection; hypercorn's own answers to malformed HTTP are bare (status, no body),
so no part of a request is ever echoed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from functools import partial
from typing import Any

from hypercorn.app_wrappers import WSGIWrapper, _build_environ
from hypercorn.config import Config
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, HTTPScope
from prometheus_client import Counter

from service.api.reasons import Reason
from service.api.v1 import METHODS
from service.http.body import MAX_BODY_BYTES
from service.http.loop_answers import LoopAnswers
from service.http.problems import Problem

MAX_TARGET_BYTES = 8 * 1024  # path and query
MAX_HEADER_BYTES = 16 * 1024  # all header lines together
_END = {"type": "http.response.body", "body": b"", "more_body": False}  # an answer's end
_ANSWER_HEADERS = [
    (b"content-type", b"application/problem+json"),
    (b"cache-control", b"no-store"),
    (b"connection", b"close"),
]


class BoundedWSGIWrapper(WSGIWrapper):
    """hypercorn's WSGI wrapper with the service's body limit and body deadline."""

    def __init__(
        self,
        app: Any,
        *,
        body_timeout: float,
        refused: Counter | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        loop_answers: LoopAnswers | None = None,
    ) -> None:
        super().__init__(app, max_body_bytes)
        self.body_timeout = body_timeout
        self.refused = refused
        self.loop_answers = loop_answers

    async def handle_http(
        self,
        scope: HTTPScope,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        sync_spawn: Callable[..., Any],
        call_soon: Callable[..., Any],
    ) -> None:
        refusal = _refusal(scope, self.max_body_size)
        if refusal is not None:
            await self._answer(send, Problem(refusal))
            return
        body = bytearray()
        deadline = asyncio.get_running_loop().time() + self.body_timeout
        while True:
            try:
                async with asyncio.timeout_at(deadline):  # no task per read, as wait_for makes
                    message = await receive()
            except TimeoutError:
                await self._answer(send, Problem(Reason.REQUEST_TIMEOUT))
                return
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            body.extend(chunk if isinstance(chunk, bytes) else b"")
            if len(body) > self.max_body_size:
                await self._answer(send, Problem(Reason.BODY_TOO_LARGE))
                return
            if not message.get("more_body"):
                break
        answered = None if self.loop_answers is None else self.loop_answers.answer(scope)
        if answered is not None:  # liveness, metrics: no thread (`service.http.loop_answers`)
            await _send_all(send, answered)
            return
        try:
            environ = _build_environ(scope, bytes(body))
        except Exception:  # a path outside the root path, or undecodable
            await self._answer(send, Problem(Reason.MALFORMED_REQUEST))
            return
        # The body is whole: say how long it is, whatever the framing, so the app reads all of it.
        environ["CONTENT_LENGTH"] = str(len(body))
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        last = await sync_spawn(self.run_whole, environ, partial(call_soon, _send_all, send))
        await _send_all(send, last or [_END])

    def run_whole(
        self, environ: dict[str, Any], relay: Callable[[list[Any]], None]
    ) -> list[Any] | None:
        """Run the app in a request thread, as hypercorn's `run_app` does, and return what is
        left to send once it is done: the start of the answer, its last chunk and its end,
        which the event loop sends once the thread's work is done (one hop, the one that
        ends the thread's work), without this thread waiting for the send (hypercorn's way
        relays them in a hop of their own and waits). A streamed answer's other chunks are
        relayed one hop each, waited for, so they keep their order and the client's pace.
        None when the app gave no answer at all."""
        started: list[Any] = []

        def start_response(
            status: str, response_headers: list[tuple[str, str]], exc_info: Any = None
        ) -> None:
            headers = [
                (name.lower().encode("latin-1"), value.encode("latin-1"))
                for name, value in response_headers
            ]
            started[:] = [
                {
                    "type": "http.response.start",
                    "status": int(status.split(" ", 1)[0]),
                    "headers": headers,
                }
            ]

        answer = self.app(environ, start_response)
        try:
            pending: list[Any] = []
            held: bytes | None = None
            for output in answer:
                if not started:
                    raise RuntimeError("WSGI app did not call start_response")
                if not pending and held is None:
                    pending.append(started[0])
                if held is not None:
                    pending.append({"type": "http.response.body", "body": held, "more_body": True})
                    relay(pending)
                    pending = []
                held = output
            if held is None and not started:
                return None
            if held is None:
                pending.append(started[0])
            pending.append({"type": "http.response.body", "body": held or b"", "more_body": False})
            return pending
        finally:
            if hasattr(answer, "close"):
                answer.close()

    async def _answer(self, send: ASGISendCallable, problem: Problem) -> None:
        if self.refused is not None:
            self.refused.labels(problem.reason).inc()
        body = json.dumps(problem.document()).encode()
        headers = [*_ANSWER_HEADERS, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": problem.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_all(send: ASGISendCallable, messages: list[Any]) -> None:
    for message in messages:
        await send(message)


def _refusal(scope: HTTPScope, max_body_size: int) -> Reason | None:
    """Why the request is answered here, before any route runs (and its connection closed),
    or None. A method no route serves is refused whatever the path, and so is a request
    framed two ways: h11 reads a body by `Transfer-Encoding` and ignores `Content-Length`,
    while a proxy in front may read it by `Content-Length`, and what one takes for the
    body the other takes for the next request (request smuggling)."""
    if scope["method"] not in METHODS:
        return Reason.UNKNOWN_METHOD
    names = {name for name, _ in scope["headers"]}
    if b"content-length" in names and b"transfer-encoding" in names:
        return Reason.CONFLICTING_FRAMING
    if len(scope["raw_path"]) + len(scope["query_string"]) > MAX_TARGET_BYTES:
        return Reason.REQUEST_TARGET_TOO_LONG
    if sum(len(name) + len(value) + 4 for name, value in scope["headers"]) > MAX_HEADER_BYTES:
        return Reason.REQUEST_HEADERS_TOO_LARGE
    if _declared_length(scope) > max_body_size:
        return Reason.BODY_TOO_LARGE
    return None


def _declared_length(scope: HTTPScope) -> int:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0  # h11 refuses a malformed Content-Length before we get here
    return 0


def front_config(
    *,
    bind: str,
    read_timeout: int,
    keep_alive_timeout: float,
    graceful_timeout: float,
) -> Config:
    """hypercorn's settings for the service: bounded reads, no banner, our logging."""
    config = Config()
    config.bind = [bind]
    config.read_timeout = read_timeout
    config.keep_alive_timeout = keep_alive_timeout
    config.graceful_timeout = graceful_timeout
    config.h11_max_incomplete_size = 16 * 1024  # request line and headers together
    config.include_server_header = False
    config.include_date_header = True
    config.backlog = 1024
    config.accesslog = None
    config.errorlog = None
    config.alpn_protocols = ["http/1.1"]
    return config
