"""`sessionstate serve`: the OPA sidecar and the app under gunicorn.

One gunicorn worker with threads: LevelDB admits one process. The master
starts the sidecar (unless SESSIONSTATE_OPA_URL names an OPA already running)
and stops it on exit, so SIGTERM leaves no process behind.
"""

from __future__ import annotations

import fcntl
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from flask import Flask
from gunicorn.app.base import BaseApplication

from service.app import create_app
from service.context import ConfigurationError, ServiceContext, check_settings
from service.logs import configure_logging
from service.opa_sidecar import OpaSidecar
from service.settings import Settings
from store.evidence_chain import EvidenceChain
from store.lanes import LaneStore

log = logging.getLogger("sessionstate.serve")
THREADS = 8
LOCK_FILE = "sessionstate.lock"


class SessionStateServer(BaseApplication):  # type: ignore[misc]
    """gunicorn, embedded: its config from `Settings`, its app from `create_app`."""

    def __init__(
        self,
        settings: Settings,
        *,
        opa_url: str,
        opa_token: str | None,
        on_ready: Callable[[], None] | None = None,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.opa_url = opa_url
        self.opa_token = opa_token
        self.on_ready = on_ready
        self.on_exit = on_exit
        self.context: ServiceContext | None = None
        super().__init__()

    def load_config(self) -> None:
        options: dict[str, Any] = {
            "bind": f"{self.settings.host}:{self.settings.port}",
            "workers": 1,
            "worker_class": "gthread",
            "threads": THREADS,
            "timeout": 30,
            "graceful_timeout": 10,
            "accesslog": None,
            "loglevel": "warning",
            # gunicorn's control socket could add workers; LevelDB admits one process.
            "control_socket_disable": True,
            "when_ready": self._when_ready,
            "on_exit": self._on_exit,
            "worker_exit": self._worker_exit,
        }
        for key, value in options.items():
            self.cfg.set(key, value)

    def _when_ready(self, server: object) -> None:
        if self.on_ready is not None:
            self.on_ready()

    def _on_exit(self, server: object) -> None:
        if self.on_exit is not None:
            self.on_exit()

    def _worker_exit(self, server: object, worker: object) -> None:
        """In the worker: close LevelDB so the next worker can open it."""
        if self.context is not None:
            self.context.close()

    def load(self) -> Flask:
        configure_logging()
        self.context = ServiceContext.open(
            self.settings, opa_url=self.opa_url, opa_token=self.opa_token
        )
        return create_app(self.context)


def serve(settings: Settings, *, on_ready: Callable[[], None] | None = None) -> None:
    """Run until SIGTERM or SIGINT; the sidecar, if started here, stops with the service."""
    configure_logging()
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = _lock_data_dir(settings.data_dir)
    check_settings(settings)
    _check_decision_log(settings.data_dir)
    sidecar: OpaSidecar | None = None
    if settings.opa_url:
        opa_url, opa_token = settings.opa_url, settings.opa_token
    else:
        sidecar = OpaSidecar(
            settings.resolved_opa_bin(), settings.policy_dir, settings.data_dir / "opa"
        )
        sidecar.start()
        opa_url, opa_token = sidecar.url, sidecar.token
        log.info("opa_sidecar_ready")
    try:
        SessionStateServer(
            settings,
            opa_url=opa_url,
            opa_token=opa_token,
            on_ready=on_ready,
            on_exit=sidecar.stop if sidecar else None,
        ).run()
    finally:
        if sidecar is not None:
            sidecar.stop()
        lock.close()


def _check_decision_log(data_dir: Path) -> None:
    """The journal extends the chain's head: an unreadable head must stop the start-up."""
    database = data_dir / "leveldb"
    if not database.is_dir():
        return
    lanes = LaneStore(database, read_every_block=True)
    try:
        EvidenceChain(lanes).head()
    finally:
        lanes.close()


def _lock_data_dir(data_dir: Path) -> TextIO:
    """Hold the data dir for this service: a second one would fight over OPA's files.

    The lock lives as long as the returned file stays open (the gunicorn worker
    inherits it), and the kernel drops it when the process dies, however it dies.
    """
    handle = open(data_dir / LOCK_FILE, "a")  # noqa: SIM115 - held for the process's life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ConfigurationError(
            f"the data dir {data_dir} is in use by another sessionstate process"
        ) from None
    return handle
