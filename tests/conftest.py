from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from service.policy.sidecar import OpaSidecar
from store.backends.contract import Lanes
from store.backends.leveldb import LevelDBLaneStore
from store.backends.postgres import PostgresLaneStore
from store.digests import DigestKey
from store.session_state import SessionStateStore
from tests.support import postgres as pg
from tests.support.live import LiveService, live_service, service_settings
from tests.support.paths import POLICY_DIR, ROOT
from tests.support.served import Served, start

settings.register_profile(
    "sessionstate",
    deadline=None,
    max_examples=int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "150")),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile("sessionstate")


@pytest.fixture
def digest_key() -> DigestKey:
    return DigestKey(b"k" * 32)


@pytest.fixture
def lanes(tmp_path: Path) -> Iterator[LevelDBLaneStore]:
    store = LevelDBLaneStore(tmp_path / "leveldb")
    yield store
    store.close()


@pytest.fixture(params=["leveldb", "postgresql"])
def lanes_on_both(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Lanes]:
    """A fresh lane store on each backend in turn: LevelDB, then a real PostgreSQL."""
    store: Lanes
    if request.param == "leveldb":
        store = LevelDBLaneStore(tmp_path / "leveldb")
    else:
        store = PostgresLaneStore(request.getfixturevalue("postgres_conninfo"), timeout=2.0)
    yield store
    store.close()


@pytest.fixture
def state_store(lanes: LevelDBLaneStore) -> SessionStateStore:
    return SessionStateStore(lanes)


@pytest.fixture(scope="session")
def opa_bin() -> str:
    """The real OPA binary: SESSIONSTATE_OPA_BIN (set by make), else the pinned build."""
    configured = os.environ.get("SESSIONSTATE_OPA_BIN")
    if configured:
        return configured
    import subprocess

    return subprocess.run(
        [str(ROOT / "scripts" / "tools.sh"), "opa"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture(scope="session")
def sidecar(opa_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpaSidecar]:
    """One real OPA over the project's policies for the whole run, as the service starts its
    own: on a Unix socket in a private directory."""
    running = OpaSidecar(opa_bin, POLICY_DIR, tmp_path_factory.mktemp("opa"))
    running.start()
    yield running
    running.stop()


@pytest.fixture(scope="session")
def tcp_sidecar(opa_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpaSidecar]:
    """A real OPA as an operator runs one apart from the service (SESSIONSTATE_OPA_URL):
    on loopback TCP, locked down with a token of its own and `system.authz`."""
    running = OpaSidecar(opa_bin, POLICY_DIR, tmp_path_factory.mktemp("opa-tcp"), listen="tcp")
    running.start()
    yield running
    running.stop()


@pytest.fixture
def service(sidecar: OpaSidecar, tmp_path: Path) -> Iterator[LiveService]:
    """The whole service over HTTP, durable writes enabled, on a fresh data dir."""
    with live_service(sidecar, service_settings(tmp_path / "var")) as live:
        yield live


@pytest.fixture
def default_service(sidecar: OpaSidecar, tmp_path: Path) -> Iterator[LiveService]:
    """The service with the deployment defaults: durable writes off."""
    with live_service(sidecar, service_settings(tmp_path / "var", durable_writes=False)) as live:
        yield live


@pytest.fixture
def fragile(opa_bin: str, tmp_path: Path) -> Iterator[tuple[LiveService, OpaSidecar]]:
    """A service with an OPA of its own, which the test may pause or kill."""
    policies = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, policies)
    sidecar = OpaSidecar(opa_bin, policies, tmp_path / "opa", max_backoff_seconds=0.5)
    sidecar.start()
    try:
        with live_service(sidecar, service_settings(tmp_path / "var", opa_timeout_ms=250)) as live:
            yield live, sidecar
    finally:
        sidecar.stop()


@pytest.fixture
def served(opa_bin: str, tmp_path: Path) -> Iterator[Served]:
    """`sessionstate serve` as a real process (hypercorn and its sidecar), durable writes on."""
    running = start(opa_bin, tmp_path / "var", tmp_path)
    yield running
    if running.process.poll() is None:
        os.killpg(running.process.pid, signal.SIGKILL)
        running.process.wait()


@pytest.fixture(scope="session")
def postgres() -> Iterator[pg.PostgresServer]:
    """One real PostgreSQL for the whole run (tests/support/postgres.py), stopped at the end;
    with fsync off (its data need not outlive the machine: durability tests start their own).

    Skipped, with the reason in the summary, only where PostgreSQL cannot be had:
    not installed and not root (as root, `make` installs it; a missing one fails).
    """
    reason = pg.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with pg.server(durable=False) as running:
        yield running


@pytest.fixture
def postgres_conninfo(postgres: pg.PostgresServer) -> str:
    """A fresh database on the shared server, schema upgraded (a copy of one upgraded
    template); its connection string."""
    return postgres.upgraded_database()


@pytest.fixture
def postgres_own() -> Iterator[pg.PostgresServer]:
    """A PostgreSQL of the test's own, which it may stop, start or reconfigure."""
    reason = pg.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with pg.server() as running:
        yield running


@pytest.fixture
def postgres_pair() -> Iterator[pg.PostgresPair]:
    """A primary and its synchronous standby, for failover: `kill_primary()`, `promote()`."""
    reason = pg.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with pg.primary_and_standby() as pair:
        yield pair
