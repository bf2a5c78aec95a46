"""`sessionstate serve`: the OPA sidecar, the store and the app, in one process.

The process holds the data dir (a flock), starts the sidecar (unless
SESSIONSTATE_OPA_URL names an OPA already running), opens the store, and
serves HTTP with hypercorn (`service.http.front`): requests are read on an
event loop and handed whole to a pool of threads that run the Flask app.
SIGTERM or SIGINT stops it gracefully; the sidecar stops with it, and dies
with it even on SIGKILL (PR_SET_PDEATHSIG, see `service.policy.sidecar`).
SIGHUP reloads the sidecar's policy snapshot (`service.policy.reload`).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from hypercorn.asyncio.run import worker_serve

from service import serving_heap, tracing
from service.app import create_app
from service.config.check import check_settings
from service.config.errors import ConfigurationError
from service.config.settings import Settings
from service.config.store import StoreTarget, configured_store
from service.context import ServiceContext, deciding_revision, token_verifier, utc_now
from service.decisions import activations
from service.decisions.activation_log import ActivationLog
from service.decisions.journal import DecisionJournal, LegacyChainPresent
from service.decisions.live import LiveRevisions, instance_id
from service.http import tracing as request_tracing
from service.http.front import BoundedWSGIWrapper, front_config
from service.logs import configure_logging
from service.policy.activation_hold import ActivationHold
from service.policy.client import PolicyClient
from service.policy.coverage_gate import CoverageGate
from service.policy.engine_checks import (
    external_opa_accepts_token,
    local_opa_bin,
    local_policy_dir,
    local_shadow_dir,
    local_signed_bundle,
)
from service.policy.reload import LOCK_FILE, forget_pid, forget_status, write_pid
from service.policy.sidecar import OpaSidecar
from service.workers import listeners_per_worker, supervise
from store.backends.contract import Lanes, Mode
from store.chain.evidence import EvidenceChain
from store.chain.keys import chain_names, legacy_chain_present
from store.signed_head import SignedHeads

log = logging.getLogger("sessionstate.serve")
THREADS = 16  # requests run at once; reading them costs no thread
GRACEFUL_SECONDS = 10.0
BACKLOG = 1024  # connections the kernel holds for each listening socket until it is accepted
LOCK_TRIES = 5  # `policy reload` probes the lock for an instant: do not mistake it for a service


def serve(settings: Settings, *, on_ready: Callable[[], None] | None = None) -> None:
    """Run until SIGTERM or SIGINT; the sidecar, if started here, stops with the service."""
    configure_logging()
    # Until the event loop handles SIGHUP, one only notes that a reload was asked for.
    early_reload = threading.Event()
    signal.signal(signal.SIGHUP, lambda _signum, _frame: early_reload.set())
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = _lock_data_dir(settings.data_dir)
    forget_pid(settings.data_dir)  # left by a service that was killed
    forget_status(settings.data_dir)
    sidecar: OpaSidecar | None = None
    shadow: OpaSidecar | None = None
    context: ServiceContext | None = None
    try:
        check_settings(settings)
        opa_tracing = tracing.opa_tracing()  # checks the OTEL_* variables the service reads
        if settings.opa_url:
            external_opa_accepts_token(settings)
        else:
            opa_bin, policy_dir = local_opa_bin(settings), local_policy_dir(settings)
        shadow_dir = local_shadow_dir(settings)
        signed = local_signed_bundle(settings)
        _check_decision_log(configured_store(settings))
        listeners = _listeners(settings.host, settings.port, settings.workers)
        if settings.opa_url:
            opa_url, opa_token = settings.opa_url, settings.opa_token
        else:
            sidecar = OpaSidecar(
                opa_bin,
                policy_dir,
                settings.data_dir / "opa",
                watch_policies=settings.watch_policies,
                bundle_file=None if signed is None else signed[0],
                verification_key=None if signed is None else signed[1],
                verification_alg=settings.policy_verification_alg,
                bundle_pin=settings.policy_bundle_pin,
                tracing=opa_tracing,
                tests=CoverageGate(opa_bin, settings.policy_coverage_min),
                hold=ActivationHold(settings.policy_activation_approvals),
            )
            _start_sidecar(settings, sidecar)
            opa_url, opa_token = sidecar.url, sidecar.token
            log.info(
                "opa_sidecar_ready", extra={"policy_revision": sidecar.policies.served.revision}
            )
        shadow_url, shadow_token = settings.shadow_opa_url, settings.shadow_opa_token
        if shadow_dir is not None:
            # The shadow follows its directory: every edit that compiles decides beside the live set.
            shadow = OpaSidecar(
                local_opa_bin(settings),
                shadow_dir,
                settings.data_dir / "opa-shadow",
                watch_policies=True,
                policy_set="shadow",
            )
            shadow.start()
            shadow_url, shadow_token = shadow.url, shadow.token
            log.info(
                "opa_shadow_sidecar_ready",
                extra={"policy_revision": shadow.policies.served.revision},
            )
        if settings.workers > 1:
            write_pid(settings.data_dir)  # `policy reload` signals this process: it has the sidecar
            reload = _reloader(sidecar)
            if early_reload.is_set():
                reload()
            with _live_revisions(settings, sidecar, opa_url, opa_token, shadow):
                supervise(listeners, sidecar, on_ready, reload, shadow)
            return
        tracing.start()  # each worker of several starts its own
        context = ServiceContext.open(
            settings,
            opa_url=opa_url,
            opa_token=opa_token,
            policy_source=None if sidecar is None else sidecar.policies,
            shadow_url=shadow_url,
            shadow_token=shadow_token,
        )
        for followed in (sidecar, shadow):
            if followed is not None:
                context.activations.follow(followed, context.verifier.operator_identity)
        if sidecar is not None:
            _keep_serials_in(sidecar, context.lanes)
        raise_open_file_limit()
        asyncio.run(serve_http(settings, context, listeners[0], on_ready, sidecar, early_reload))
    finally:
        # The event loop gave SIGHUP back its default, which ends the process: not on the way out.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        forget_pid(settings.data_dir)
        if context is not None:
            context.close()
        tracing.shutdown()  # after the journal's last commit: its spans are exported too
        if sidecar is not None:
            sidecar.stop()
        if shadow is not None:
            shadow.stop()
        lock.close()


async def serve_http(
    settings: Settings,
    context: ServiceContext,
    listener: socket.socket,
    on_ready: Callable[[], None] | None,
    sidecar: OpaSidecar | None,
    early_reload: threading.Event | None,
    *,
    owns_pid_file: bool = True,
) -> None:
    """Serve HTTP on listener until SIGTERM or SIGINT (one process, or one worker of several)."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(THREADS, thread_name_prefix="request"))
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if owns_pid_file:
        reload = _reloader(sidecar)
        loop.add_signal_handler(signal.SIGHUP, reload)
        if early_reload is not None and early_reload.is_set():
            reload()
        # From here a SIGHUP reloads: `sessionstate policy reload` may find the pid.
        write_pid(settings.data_dir)
    flask_app = create_app(context)
    request_tracing.instrument(flask_app)  # the request span, with OTel export configured
    app = BoundedWSGIWrapper(
        flask_app,
        body_timeout=settings.body_timeout_seconds,
        refused=context.metrics.refused_before_app,
    )
    config = front_config(
        # hypercorn takes the socket over (and closes it when it stops).
        bind=f"fd://{listener.detach()}",
        read_timeout=settings.read_timeout_seconds,
        keep_alive_timeout=settings.keep_alive_seconds,
        graceful_timeout=GRACEFUL_SECONDS,
    )
    serving_heap.settle()  # what serves is built: out of the collector's way
    if on_ready is not None:
        # The socket already listens: connections wait in its backlog until hypercorn accepts.
        loop.call_soon(on_ready)
    await worker_serve(app, config, shutdown_trigger=stop.wait)
    log.info("service_stopped")


@contextmanager
def _live_revisions(
    settings: Settings,
    sidecar: OpaSidecar | None,
    opa_url: str,
    opa_token: str | None,
    shadow: OpaSidecar | None,
) -> Iterator[None]:
    """The parent of workers owns the data dir's live intervals: it opens one at start, one
    at each reload of its sidecar, and closes the last when it stops (the workers learn the
    live revision from the store, or, without a sidecar, from OPA's answers). It records
    its sidecars' activations too, through a journal of its own (on PostgreSQL, which
    takes several writers)."""
    lanes = configured_store(settings).open()
    live = LiveRevisions(lanes, instance_id(settings.data_dir), utc_now, owns=True)
    journal = DecisionJournal(
        lanes,
        clock=utc_now,
        live_revision=live.current,
        signed_heads=SignedHeads(settings.data_dir),
    )
    recorder = ActivationLog(
        journal, lanes, live, clock=utc_now, durable_writes=settings.durable_writes
    )
    operator = token_verifier(settings).operator_identity
    try:
        if sidecar is not None:
            live.started(sidecar.policies.served.revision)
            _keep_serials_in(sidecar, lanes)
        for followed in (sidecar, shadow):
            if followed is not None:
                recorder.follow(followed, operator)
        if sidecar is None:
            client = PolicyClient(opa_url, opa_token)
            try:
                live.started(deciding_revision(client))
            finally:
                client.close()
        yield
    finally:
        for followed in (sidecar, shadow):
            if followed is not None:
                followed.on_live = None
        if sidecar is not None:
            _keep_serials_in(sidecar, None)
        journal.close()
        live.stopped()
        lanes.close()


def _start_sidecar(settings: Settings, sidecar: OpaSidecar) -> None:
    """Start it; a signed bundle's serial is checked against the highest the store keeps,
    and recorded there once OPA activated it (`service.policy.rollback`); where new
    revisions wait for approvals, the start's is checked against the deployment's
    (`service.policy.activation_hold`)."""
    if sidecar.signed is None and sidecar.hold.approvals == 1:
        sidecar.start()
        return
    lanes = configured_store(settings).open()  # the service's own opens after the start
    try:
        _keep_serials_in(sidecar, lanes)
        sidecar.hold.deployment_revision = lambda: activations.latest_live(lanes)
        sidecar.start()
    finally:
        _keep_serials_in(sidecar, None)
        sidecar.hold.deployment_revision = lambda: None  # until the activation log follows it
        lanes.close()


def _keep_serials_in(sidecar: OpaSidecar, lanes: Lanes | None) -> None:
    """Where a signed bundle's highest serial is read and recorded from now on."""
    if sidecar.signed is not None:
        sidecar.signed.guard.attach(lanes)


def _reloader(sidecar: OpaSidecar | None) -> Callable[[], None]:
    """What SIGHUP does: ask the sidecar's reloader thread to reload the policy snapshot."""
    if sidecar is not None:
        return sidecar.request_reload

    def no_policy_directory() -> None:
        log.warning("policy_reload_not_applicable")  # the OPA at SESSIONSTATE_OPA_URL has them

    return no_policy_directory


def _listen(host: str, port: int) -> socket.socket:
    """Bind before anything starts, so a taken port is a clear error, not a half-started service."""
    try:
        return socket.create_server((host, port), backlog=BACKLOG, reuse_port=False)
    except OSError as error:
        raise _cannot_listen(host, port, error) from None


def _listeners(host: str, port: int, workers: int) -> list[socket.socket]:
    """One listening socket, or for `--workers N` one per worker (`service.workers`). The
    port is bound alone first, so one that another service holds, even with SO_REUSEPORT,
    is a clear error rather than clients shared with it."""
    listener = _listen(host, port)
    if workers == 1:
        return [listener]
    try:
        return listeners_per_worker(listener, workers, BACKLOG)
    except OSError as error:
        raise _cannot_listen(host, port, error) from None


def _cannot_listen(host: str, port: int, error: OSError) -> ConfigurationError:
    return ConfigurationError(
        f"cannot listen on {host}:{port} (SESSIONSTATE_HOST/SESSIONSTATE_PORT): "
        f"{error.strerror or 'address unavailable'}"
    )


def raise_open_file_limit() -> None:
    """Idle and slow clients cost a socket each: allow as many as the hard limit admits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 65_536 if hard == resource.RLIM_INFINITY else hard
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, target), hard))


def _check_decision_log(store: StoreTarget) -> None:
    """The journal extends each chain's head: an unreadable head must stop the start-up, and
    so must a decision log still written as one global chain (`sessionstate db upgrade`).

    PostgreSQL: opening checks the schema first (`SchemaMismatch`: not upgraded, or newer).
    LevelDB: opening for review reads every block once (a store not made yet is not checked).
    """
    if not store.present:
        return
    lanes = store.open(Mode.REVIEW)
    try:
        if legacy_chain_present(lanes):
            raise ConfigurationError(str(LegacyChainPresent()))
        for name in chain_names(lanes):
            EvidenceChain(lanes, name).head()
    finally:
        lanes.close()


def _lock_data_dir(data_dir: Path) -> TextIO:
    """Hold the data dir for this service: a second one would fight over its files.

    The lock lives as long as the returned file stays open, and the kernel
    drops it when the process dies, however it dies.
    """
    handle = open(data_dir / LOCK_FILE, "a")  # noqa: SIM115 - held for the process's life
    for attempt in range(LOCK_TRIES):
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if attempt + 1 < LOCK_TRIES:
                time.sleep(0.02)
    handle.close()
    raise ConfigurationError(
        f"the data dir {data_dir} is in use by another sessionstate process"
    ) from None
