"""`serve_http`: HTTP served on one listening socket until SIGTERM or SIGINT, by a single
serving process or by each worker of several (`service.runtime.workers`).

Requests are read by hypercorn on an event loop (`service.http.front`) and handed whole
to a pool of threads that run the Flask app; liveness and metrics are answered on the
event loop (`service.http.loop_answers`).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import socket
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from hypercorn.asyncio.run import worker_serve

from service.app import create_app
from service.config.settings import Settings
from service.context import ServiceContext
from service.http import request_tracing
from service.http.front import BoundedWSGIWrapper, front_config
from service.http.loop_answers import LoopAnswers
from service.policy.reload import write_pid
from service.runtime import serving_heap
from service.runtime.worker_beats import BEAT_SECONDS

log = logging.getLogger("sessionstate.serve")
THREADS = 16  # requests run at once; reading them costs no thread
GRACEFUL_SECONDS = 10.0


@dataclass(frozen=True)
class Reloads:
    """What the process `sessionstate policy reload` signals does on SIGHUP (`reload`), and
    whether a SIGHUP came before its event loop handled them (`early`). A worker of several
    has none: reloads are its parent's."""

    reload: Callable[[], None]
    early: threading.Event


async def serve_http(
    settings: Settings,
    context: ServiceContext,
    listener: socket.socket,
    *,
    on_ready: Callable[[], None] | None = None,
    reloads: Reloads | None = None,
    shutdown: Callable[[], Awaitable[object]] | None = None,
) -> None:
    """Serve HTTP on listener until SIGTERM or SIGINT (one process, or one worker of several),
    or, given `shutdown`, until it returns (a service in a thread of another program, as
    the tests run one: no signal handlers, and the heap left to that program)."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(THREADS, thread_name_prefix="request"))
    own_process = shutdown is None  # its signals and its heap are ours
    if shutdown is None:
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        shutdown = stop.wait
    if reloads is not None:
        loop.add_signal_handler(signal.SIGHUP, reloads.reload)
        if reloads.early.is_set():
            reloads.reload()
        # From here a SIGHUP reloads: `sessionstate policy reload` may find the pid.
        write_pid(settings.data_dir)
    app = front_app(settings, context)
    config = front_config(
        # hypercorn takes the socket over (and closes it when it stops).
        bind=f"fd://{listener.detach()}",
        read_timeout=settings.read_timeout_seconds,
        keep_alive_timeout=settings.keep_alive_seconds,
        graceful_timeout=GRACEFUL_SECONDS,
    )
    if own_process:
        serving_heap.settle()  # what serves is built: out of the collector's way
    if on_ready is not None:
        # The socket already listens: connections wait in its backlog until hypercorn accepts.
        loop.call_soon(on_ready)
    beating = None if context.workers is None else loop.create_task(_beat(context))
    try:
        await worker_serve(app, config, shutdown_trigger=shutdown)
    finally:
        if beating is not None:
            beating.cancel()
    log.info("service_stopped")


def front_app(settings: Settings, context: ServiceContext) -> BoundedWSGIWrapper:
    """The Flask app as the front runs it: traced, bounded, liveness on the event loop."""
    flask_app = create_app(context)
    request_tracing.instrument(flask_app)  # the request span, with OTel export configured
    return BoundedWSGIWrapper(
        flask_app,
        body_timeout=settings.body_timeout_seconds,
        refused=context.metrics.refused_before_app,
        loop_answers=LoopAnswers(context),
    )


async def _beat(context: ServiceContext) -> None:
    """A worker of several, from its event loop: its metrics read from its store copied into
    the shared files, and its beat (`service.runtime.worker_beats`), every BEAT_SECONDS."""
    assert context.workers is not None
    while True:
        try:
            context.metrics.sync()
            context.workers.beat()
        except Exception as error:  # a full disk, say: the others see no beat
            log.warning("worker_beat_failed", extra={"error_type": type(error).__name__})
        await asyncio.sleep(BEAT_SECONDS)


def raise_open_file_limit() -> None:
    """Idle and slow clients cost a socket each: allow as many as the hard limit admits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 65_536 if hard == resource.RLIM_INFINITY else hard
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, target), hard))
