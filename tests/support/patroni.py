"""A real Patroni cluster for failover tests: etcd, two Patroni nodes, optionally HAProxy.

Debian's packages (`make` installs them when run as root): `etcd-server` (3.4),
`patroni` (3.0, run by the system's python3, not the project's venv) and
`haproxy`. Everything listens on 127.0.0.1 only, on free ports, and lives in
one temporary directory removed afterwards:

- one etcd member (the DCS), its data in the directory;
- two Patroni nodes, each managing a PostgreSQL of its own (Debian's binaries,
  as `tests/support/postgres.py` finds them), run as that module's server user
  (PostgreSQL refuses root). `synchronous_mode: true`, short `ttl`, `loop_wait`
  and `retry_timeout` so that a failover takes seconds, and
  `primary_start_timeout: 0`: a primary whose postmaster died is failed over
  to the synchronous standby rather than restarted in place (Patroni's default
  waits 300 s for it to come back); `use_pg_rewind` so that it rejoins as a
  replica afterwards;
- HAProxy (`haproxy()`), which health-checks each node's REST `/primary` and
  forwards to the one that answers 200 (`on-marked-down shutdown-sessions`),
  as Patroni's documentation shows.

`cluster()` waits for a leader and a streaming synchronous standby, and stops
everything at the end (Patroni first, then whatever PostgreSQL, etcd or HAProxy
process is left, killed), each wait bounded.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tests.support import postgres as pg
from tests.support.ports import free_port

PATRONI = Path("/usr/bin/patroni")
ETCD = Path("/usr/bin/etcd")
HAPROXY = Path("/usr/sbin/haproxy")
SCOPE = "sessionstate"
READY_SECONDS = 90.0
STOP_SECONDS = 20.0
# Patroni's timing (dynamic configuration). loop_wait + 2 * retry_timeout must stay below ttl.
TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 1, 3
# HAProxy: a check each second; two failed ones mark a node down, one good one up.
CHECK_INTER, CHECK_FALL, CHECK_RISE = "1s", 2, 1
INSTALL_HINT = (
    "Patroni, etcd or HAProxy is not installed: run `make test` as root (it installs Debian's "
    "patroni, etcd-server and haproxy), or `sudo apt-get install -y patroni etcd-server haproxy`"
)
# etcd 3.4 refuses to start on an architecture it does not support unless this names it.
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386"}


def unavailable_reason() -> str | None:
    """Why no cluster can be started here (a skip reason), or None when one can."""
    if os.geteuid() == 0:
        return None  # root can have them: `cluster()` fails loudly with the install hint
    for program in (PATRONI, ETCD, HAPROXY, pg.PG_BIN / "initdb"):
        if not program.exists():
            return INSTALL_HINT
    return None


def _require_installed() -> None:
    missing = [str(p) for p in (PATRONI, ETCD, HAPROXY, pg.PG_BIN / "initdb") if not p.exists()]
    if missing:
        raise pg.PostgresMissing(f"{INSTALL_HINT} (missing: {', '.join(missing)})")


# -- processes ---------------------------------------------------------------------


def _log_tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def _system_env() -> dict[str, str]:
    """The environment of a system program: not the project's venv, not its settings."""
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def _spawn(
    command: list[str], log: Path, cwd: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )


def _end(process: subprocess.Popen[bytes], seconds: float = STOP_SECONDS) -> None:
    """SIGTERM, a bounded wait, then SIGKILL to its whole process group."""
    if process.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(seconds)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        process.wait(seconds)


def _get(url: str, timeout: float = 2.0) -> tuple[int, Any]:
    """GET a JSON document: (status, body); (0, None) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # loopback only
            status, raw = answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        status, raw = refused.code, refused.read()
    except (OSError, ValueError):
        return 0, None
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, None


def _until(condition: Any, what: str, seconds: float, details: Any = lambda: "") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"never: {what}\n{details()}")
        time.sleep(0.2)


# -- etcd --------------------------------------------------------------------------


class Etcd:
    """One etcd member, its client and peer URLs on loopback."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.client_port = free_port()
        self.peer_port = free_port()
        self.log = root / "etcd.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> None:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        env = _system_env() | {
            "ETCD_UNSUPPORTED_ARCH": _GOARCH.get(platform.machine(), platform.machine())
        }
        self.process = _spawn(
            [
                str(ETCD),
                "--name",
                "etcd0",
                "--data-dir",
                str(self.root / "etcd"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"etcd0={peer}",
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                secrets.token_hex(8),
            ],
            self.log,
            self.root,
            env,
        )
        _until(
            lambda: _get(f"{client}/health")[0] == 200 or self.process.poll() is not None,  # type: ignore[union-attr]
            "etcd answers /health",
            READY_SECONDS,
            lambda: _log_tail(self.log),
        )
        if self.process.poll() is not None:
            raise RuntimeError("etcd exited:\n" + _log_tail(self.log))

    def stop(self) -> None:
        if self.process is not None:
            _end(self.process)


# -- Patroni nodes -----------------------------------------------------------------


@dataclass
class Secrets:
    superuser: str
    replication: str


class PatroniNode:
    """One Patroni daemon and the PostgreSQL it manages."""

    def __init__(self, root: Path, name: str, etcd: Etcd, passwords: Secrets) -> None:
        self.root = root
        self.name = name
        self.data = root / name
        self.socket_dir = root / f"{name}-socket"
        self.config = root / f"{name}.yml"
        self.log = root / f"{name}.log"
        self.pg_port = free_port()
        self.api_port = free_port()
        self.etcd = etcd
        self.passwords = passwords
        self.process: subprocess.Popen[bytes] | None = None
        self._user = pg._server_user()

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def conninfo(self, dbname: str = "postgres") -> str:
        return psycopg.conninfo.make_conninfo(
            host="127.0.0.1",
            port=str(self.pg_port),
            user=pg.SUPERUSER,
            password=self.passwords.superuser,
            dbname=dbname,
        )

    def write_config(self) -> None:
        hba = [
            "local all all trust",
            "host all all 127.0.0.1/32 scram-sha-256",
            "host replication replicator 127.0.0.1/32 scram-sha-256",
        ]
        config = {
            "scope": SCOPE,
            "name": self.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{self.api_port}",
                "connect_address": f"127.0.0.1:{self.api_port}",
            },
            "etcd3": {"hosts": [self.etcd.endpoint], "protocol": "http"},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL,
                    "loop_wait": LOOP_WAIT,
                    "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": 1048576,
                    "primary_start_timeout": 0,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "remove_data_directory_on_rewind_failure": True,
                        "remove_data_directory_on_diverged_timelines": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_level": "replica",
                            "wal_log_hints": "on",
                            "hot_standby": "on",
                            "max_wal_senders": 5,
                            "max_replication_slots": 5,
                            "max_connections": 60,
                            "fsync": "on",
                            "synchronous_commit": "on",
                            "shared_buffers": "32MB",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.pg_port}",
                "connect_address": f"127.0.0.1:{self.pg_port}",
                "data_dir": str(self.data),
                "bin_dir": str(pg.PG_BIN),
                "pgpass": str(self.root / f"{self.name}.pgpass"),
                "authentication": {
                    "superuser": {"username": pg.SUPERUSER, "password": self.passwords.superuser},
                    "replication": {
                        "username": "replicator",
                        "password": self.passwords.replication,
                    },
                },
                "parameters": {"unix_socket_directories": str(self.socket_dir)},
                "pg_hba": hba,
            },
            "watchdog": {"mode": "off"},
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
        }
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        self.config.write_text(json.dumps(config, indent=2))  # YAML is a superset of JSON
        self.config.chmod(0o600)
        for path in (self.socket_dir, self.config):
            if self._user is not None:
                shutil.chown(path, self._user, self._user)

    def start(self) -> None:
        self.write_config()
        command = [str(PATRONI), str(self.config)]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        self.process = _spawn(command, self.log, self.root, _system_env())

    def status(self) -> dict[str, Any] | None:
        """GET /patroni: this node's own view (role, state, timeline), or None if it is down."""
        code, body = _get(self.api + "/patroni")
        return body if code in (200, 503) and isinstance(body, dict) else None

    def probe(self, path: str) -> int:
        """The status Patroni's REST API answers for `path` (/primary, /replica, /sync ...)."""
        return _get(self.api + path)[0]

    @property
    def postmaster_pid(self) -> int | None:
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None
        return pid if pg._alive(pid) else None

    def kill_postmaster(self) -> int:
        """kill -9 this node's postmaster and every process it started; Patroni stays up.

        Returns the killed pid (of the postmaster.pid Patroni's PostgreSQL wrote).
        """
        pid = self.postmaster_pid
        if pid is None:
            raise RuntimeError(f"{self.name}: no PostgreSQL running")
        children = pg._children_of(pid)
        os.kill(pid, signal.SIGKILL)
        for child in children:
            with suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        pg._wait_gone([pid, *children])
        return pid

    def kill_node(self) -> int:
        """kill -9 Patroni and its PostgreSQL at once, as a lost machine: its leader key stays
        in etcd until its `ttl` runs out. Returns the killed postmaster's pid."""
        assert self.process is not None
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # runuser and Patroni
        pid = self.kill_postmaster()
        self.process.wait(STOP_SECONDS)
        return pid

    def stop(self) -> None:
        """Patroni stops (SIGTERM: it shuts its PostgreSQL down fast); then anything left is killed."""
        if self.process is not None:
            _end(self.process)
        pid = self.postmaster_pid
        if pid is not None:
            children = pg._children_of(pid)
            for victim in (pid, *children):
                with suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
            with suppress(RuntimeError):
                pg._wait_gone([pid, *children])

    def log_tail(self, lines: int = 40) -> str:
        return f"--- {self.name} (patroni)\n{_log_tail(self.log, lines)}"


# -- the cluster -------------------------------------------------------------------


class PatroniCluster:
    def __init__(self, root: Path, etcd: Etcd, nodes: list[PatroniNode]) -> None:
        self.root = root
        self.etcd = etcd
        self.nodes = nodes

    @property
    def password(self) -> str:
        return self.nodes[0].passwords.superuser

    def cluster_view(self) -> dict[str, Any] | None:
        """GET /cluster from any node that answers: members with their role and state."""
        for node in self.nodes:
            code, body = _get(node.api + "/cluster")
            if code == 200 and isinstance(body, dict):
                return body
        return None

    def node(self, name: str) -> PatroniNode:
        return next(node for node in self.nodes if node.name == name)

    def member_with(self, role: str) -> PatroniNode | None:
        """The node /cluster lists with `role` (leader, sync_standby, replica) and running."""
        view = self.cluster_view() or {}
        for member in view.get("members", []):
            if member.get("role") == role and member.get("state") in ("running", "streaming"):
                return self.node(member["name"])
        return None

    def leader(self) -> PatroniNode | None:
        """The node whose REST /leader answers 200 and whose PostgreSQL runs."""
        for node in self.nodes:
            if node.probe("/leader") == 200 and node.probe("/primary") == 200:
                return node
        return None

    def sync_standby(self) -> PatroniNode | None:
        """The node Patroni lists as synchronous standby that PostgreSQL also reports `sync`."""
        candidate = self.member_with("sync_standby")
        leader = self.leader()
        if candidate is None or leader is None or candidate.probe("/sync") != 200:
            return None
        try:
            with psycopg.connect(leader.conninfo(), autocommit=True, connect_timeout=3) as conn:
                row = conn.execute(
                    "SELECT sync_state, state FROM pg_stat_replication WHERE application_name = %s",
                    (candidate.name,),
                ).fetchone()
        except psycopg.Error:
            return None
        return candidate if row == ("sync", "streaming") else None

    def wait_healthy(self, seconds: float = READY_SECONDS) -> tuple[PatroniNode, PatroniNode]:
        """Until there is a leader and a streaming synchronous standby: (leader, standby)."""
        _until(
            lambda: self.leader() is not None and self.sync_standby() is not None,
            "a leader and a streaming synchronous standby",
            seconds,
            self.logs,
        )
        leader, standby = self.leader(), self.sync_standby()
        assert leader is not None and standby is not None
        return leader, standby

    def wait_leader(self, other_than: PatroniNode, seconds: float = READY_SECONDS) -> PatroniNode:
        """Until a node other than `other_than` is the leader and takes writes."""
        _until(
            lambda: (found := self.leader()) is not None and found is not other_than,
            f"a leader other than {other_than.name}",
            seconds,
            self.logs,
        )
        leader = self.leader()
        assert leader is not None
        return leader

    def synchronous_standby_names(self) -> str | None:
        leader = self.leader()
        if leader is None:
            return None
        try:
            with psycopg.connect(leader.conninfo(), autocommit=True, connect_timeout=3) as conn:
                row = conn.execute("SHOW synchronous_standby_names").fetchone()
        except psycopg.Error:
            return None
        return None if row is None else str(row[0])

    def multi_host(self, dbname: str = "postgres", **extra: str) -> str:
        """Both nodes, the writable one chosen at connect time (libpq's multi-host string)."""
        return psycopg.conninfo.make_conninfo(
            host=",".join("127.0.0.1" for _ in self.nodes),
            port=",".join(str(node.pg_port) for node in self.nodes),
            user=pg.SUPERUSER,
            password=self.password,
            dbname=dbname,
            target_session_attrs="read-write",
            **extra,
        )

    def create_database(self) -> str:
        """A new database on the leader (Patroni replicates it): its name."""
        leader = self.leader()
        assert leader is not None
        name = f"sessionstate_{secrets.token_hex(4)}"
        with psycopg.connect(leader.conninfo(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
        return name

    def logs(self) -> str:
        return "\n".join(node.log_tail() for node in self.nodes) + (
            f"\n--- etcd\n{_log_tail(self.etcd.log, 15)}"
        )

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.etcd.stop()


@contextmanager
def cluster() -> Iterator[PatroniCluster]:
    """etcd and two Patroni nodes, healthy (a leader and a sync standby); all stopped after."""
    _require_installed()
    with pg._workspace() as root:
        passwords = Secrets(secrets.token_hex(16), secrets.token_hex(16))
        etcd = Etcd(root)
        nodes = [PatroniNode(root, f"node{n}", etcd, passwords) for n in (1, 2)]
        running = PatroniCluster(root, etcd, nodes)
        try:
            etcd.start()
            nodes[0].start()  # bootstraps (initdb) and takes the leader key
            _until(
                lambda: nodes[0].probe("/primary") == 200,
                "node1 bootstraps as the leader",
                READY_SECONDS,
                running.logs,
            )
            nodes[1].start()  # a base backup of node1, then streams from it
            running.wait_healthy()
            yield running
        finally:
            running.stop()


# -- HAProxy -----------------------------------------------------------------------


@dataclass
class HAProxy:
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    password: str

    def conninfo(self, dbname: str = "postgres", **extra: str) -> str:
        return psycopg.conninfo.make_conninfo(
            host="127.0.0.1",
            port=str(self.port),
            user=pg.SUPERUSER,
            password=self.password,
            dbname=dbname,
            **extra,
        )


def haproxy_config(port: int, nodes: list[PatroniNode]) -> str:
    """TCP to whichever node's Patroni answers 200 on /primary (Patroni's documented setup)."""
    servers = "\n".join(
        f"    server {node.name} 127.0.0.1:{node.pg_port} maxconn 100 check port {node.api_port}"
        for node in nodes
    )
    return f"""global
    maxconn 200

defaults
    mode tcp
    retries 2
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 2s

listen primary
    bind 127.0.0.1:{port}
    option httpchk OPTIONS /primary
    http-check expect status 200
    default-server inter {CHECK_INTER} fall {CHECK_FALL} rise {CHECK_RISE} on-marked-down shutdown-sessions
{servers}
"""


def _lands_on_leader(conninfo: str) -> bool:
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    except psycopg.Error:
        return False
    return row == (False,)


@contextmanager
def haproxy(running: PatroniCluster) -> Iterator[HAProxy]:
    """HAProxy in front of the cluster's nodes, in the foreground; stopped after."""
    port = free_port()
    config = running.root / "haproxy.cfg"
    config.write_text(haproxy_config(port, running.nodes))
    log = running.root / "haproxy.log"
    subprocess.run([str(HAPROXY), "-c", "-q", "-f", str(config)], check=True, timeout=30)
    process = _spawn([str(HAPROXY), "-db", "-f", str(config)], log, running.root, _system_env())
    proxy = HAProxy(port, process, log, running.password)
    try:

        def routes_to_leader() -> bool:
            """HAProxy counts a server up until its checks fail: until several connections in
            a row (round robin over the nodes) all reach the leader."""
            if process.poll() is not None:
                return True
            return all(_lands_on_leader(proxy.conninfo()) for _ in range(3 * len(running.nodes)))

        _until(
            routes_to_leader,
            "HAProxy forwards to the leader",
            READY_SECONDS,
            lambda: _log_tail(log),
        )
        if process.poll() is not None:
            raise RuntimeError("haproxy exited:\n" + _log_tail(log))
        yield proxy
    finally:
        _end(process)
