"""`sessionstate serve`: the OPA sidecar, the store and the app, in one process.

The process holds the data dir (a flock, `service.runtime.data_dir_lock`), checks its
settings, binds the port, starts the sidecars (`service.runtime.sidecars`) unless
SESSIONSTATE_OPA_URL names an OPA already running, opens the store, and serves HTTP
(`service.runtime.serving`), or has workers serve it (`service.runtime.workers`).
SIGTERM or SIGINT stops it gracefully; the sidecar stops with it, and dies with it
even on SIGKILL (PR_SET_PDEATHSIG, see `service.policy.sidecar`). SIGHUP reloads the
sidecar's policy snapshot (`service.policy.reload`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from service.config.check import check_settings
from service.config.configuration_error import ConfigurationError
from service.config.secret_values import secrets_home
from service.config.settings import Settings
from service.config.store import StoreTarget
from service.config.values import Configuration
from service.context import ServiceContext, deciding_revision, token_verifier, utc_now
from service.decisions.activation_log import ActivationLog
from service.decisions.journal import DecisionJournal, LegacyChainPresent
from service.decisions.live import LiveRevisions, instance_id
from service.observability import tracing
from service.observability.logs import configure_logging
from service.policy.client import PolicyClient
from service.policy.engine_checks import (
    external_opa_accepts_token,
    local_opa_bin,
    local_policy_dir,
    local_shadow_dir,
    local_signed_bundle,
)
from service.policy.health import policy_health, publish_policy_health
from service.policy.reload import forget_pid, forget_status, write_pid
from service.runtime.data_dir_lock import lock_data_dir
from service.runtime.listeners import listeners
from service.runtime.serving import Reloads, raise_open_file_limit, serve_http
from service.runtime.sidecars import SidecarPlan, Sidecars, keep_serials_in, reloader
from service.runtime.workers import POLICY_HEALTH_FILE, fresh_workers_dir, supervise
from store.backends.contract import Mode
from store.chain.evidence import EvidenceChain
from store.chain.keys import chain_names, legacy_chain_present
from store.chain.signed_head import SignedHeads

log = logging.getLogger("sessionstate.serve")


def serve(settings: Settings, *, on_ready: Callable[[], None] | None = None) -> None:
    """Run until SIGTERM or SIGINT; the sidecars, if started here, stop with the service."""
    configure_logging()
    # Until the event loop handles SIGHUP, one only notes that a reload was asked for.
    early_reload = threading.Event()
    signal.signal(signal.SIGHUP, lambda _signum, _frame: early_reload.set())
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = lock_data_dir(settings.data_dir)
    forget_pid(settings.data_dir)  # left by a service that was killed
    forget_status(settings.data_dir)
    sidecars = Sidecars()
    context: ServiceContext | None = None
    try:
        plan = _checked(settings)
        listening = listeners(settings.host, settings.port, settings.workers)
        sidecars.start(settings, plan)
        reloads = Reloads(reloader(sidecars.live), early_reload)
        if settings.workers > 1:
            _serve_with_workers(settings, sidecars, listening, on_ready, reloads)
            return
        tracing.start()  # each worker of several starts its own
        context = _open_context(settings, sidecars)
        raise_open_file_limit()
        asyncio.run(serve_http(settings, context, listening[0], on_ready=on_ready, reloads=reloads))
    finally:
        # The event loop gave SIGHUP back its default, which ends the process: not on the way out.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        forget_pid(settings.data_dir)
        if context is not None:
            context.close()
        tracing.shutdown()  # after the journal's last commit: its spans are exported too
        sidecars.stop()
        lock.close()


def _checked(settings: Settings) -> SidecarPlan:
    """Everything start-up can check before it starts anything, and the sidecars it will start."""
    configuration = check_settings(settings)
    opa_tracing = tracing.opa_tracing()  # checks the OTEL_* variables the service reads
    local = None
    if settings.opa_url:
        external_opa_accepts_token(settings)
    else:
        local = local_opa_bin(settings), local_policy_dir(settings)
    plan = SidecarPlan(
        local=local,
        shadow_dir=local_shadow_dir(settings),
        signed=local_signed_bundle(settings),
        tracing=opa_tracing,
    )
    _check_decision_log(configuration.store)
    return plan


def _open_context(settings: Settings, sidecars: Sidecars) -> ServiceContext:
    """The one process's context, following its sidecars' activations."""
    opa_url, opa_token = sidecars.opa(settings)
    shadow_url, shadow_token = sidecars.shadow_opa(settings)
    context = ServiceContext.open(
        settings,
        opa_url=opa_url,
        opa_token=opa_token,
        policy_source=None if sidecars.live is None else sidecars.live.policies,
        shadow_url=shadow_url,
        shadow_token=shadow_token,
    )
    for followed in sidecars.running():
        context.activations.follow(followed, context.verifier.operator_identity)
    if sidecars.live is not None:
        keep_serials_in(sidecars.live, context.lanes)
    return context


def _serve_with_workers(
    settings: Settings,
    sidecars: Sidecars,
    listening: list[socket.socket],
    on_ready: Callable[[], None] | None,
    reloads: Reloads,
) -> None:
    shared = fresh_workers_dir(settings.data_dir)
    with _live_revisions(settings, sidecars, shared / POLICY_HEALTH_FILE):
        write_pid(settings.data_dir)  # `policy reload` signals this process: it has the sidecar
        if reloads.early.is_set():
            reloads.reload()
        supervise(listening, sidecars, shared, on_ready, reloads.reload)


@contextmanager
def _live_revisions(settings: Settings, sidecars: Sidecars, published: Path) -> Iterator[None]:
    """The parent of workers owns the data dir's live intervals: it opens one at start, one
    at each reload of its sidecar, and closes the last when it stops (the workers learn the
    live revision from the store, or, without a sidecar, from OPA's answers). It records
    its sidecars' activations too, through a journal of its own (on PostgreSQL, which
    takes several writers), and publishes its policy health to `published` at start and
    after each of its sidecars' reloads, for every worker to tell (`service.policy.health`)."""
    configuration = Configuration.read(settings)
    lanes = configuration.store.open()
    live = LiveRevisions(lanes, instance_id(settings.data_dir), utc_now, owns=True)
    journal = DecisionJournal(
        lanes,
        clock=utc_now,
        live_revision=live.current,
        signed_heads=SignedHeads(secrets_home(settings)),
    )
    recorder = ActivationLog(
        journal, lanes, live, clock=utc_now, durable_writes=settings.durable_writes
    )
    operator = token_verifier(configuration).operator_identity
    sidecar = sidecars.live
    try:
        if sidecar is not None:
            live.started(sidecar.policies.served.revision)
            keep_serials_in(sidecar, lanes)
        for followed in sidecars.running():
            recorder.follow(followed, operator)
        publish = _publisher(sidecars, recorder, published)
        publish()
        for followed in sidecars.running():
            followed.on_status = publish
        if sidecar is None:
            client = PolicyClient(*sidecars.opa(settings))
            try:
                live.started(deciding_revision(client))
            finally:
                client.close()
        yield
    finally:
        for followed in sidecars.running():
            followed.on_live = None
            followed.on_status = None
        if sidecar is not None:
            keep_serials_in(sidecar, None)
        journal.close()
        live.stopped()
        lanes.close()


def _publisher(sidecars: Sidecars, recorder: ActivationLog, path: Path) -> Callable[[], None]:
    """Publish the sidecars' policy health (the live and the shadow reload on threads of
    their own: one publication at a time, each of the state after its reload). One that
    cannot be written withdraws the last: the workers then say `policy_health_unavailable`
    rather than tell of an earlier reload."""
    lock = threading.Lock()
    live = sidecars.live

    def publish() -> None:
        with lock:
            health = policy_health(
                None if live is None else live.policies,
                awaiting_approval=bool(recorder.awaiting_approval()),
                shadow_refused=recorder.shadow_refused(),
            )
            try:
                publish_policy_health(path, health)
            except OSError as error:
                log.error("policy_health_not_published", extra={"error_type": type(error).__name__})
                with suppress(OSError):
                    path.unlink(missing_ok=True)

    return publish


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
