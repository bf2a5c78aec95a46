"""A real PgBouncer in front of a test PostgreSQL server, started and stopped by the tests.

Debian's `pgbouncer` (`make` installs it when run as root), in `pool_mode =
transaction`: each transaction (or statement outside one) may run on another
server connection, so nothing a client sets for its session survives. It listens
on a free port on 127.0.0.1 only, with no unix socket, and runs as the server user
of tests/support/postgres.py (PgBouncer refuses to run as root), from a directory
of its own. Clients log in with the server's password (`auth_type =
scram-sha-256`, the password in `auth_file`), and PgBouncer logs in to PostgreSQL
with it. `options` is not in `ignore_startup_parameters` unless asked: PgBouncer
refuses a client that sends it, as a stock configuration does.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from tests.support.ports import free_port
from tests.support.postgres import SUPERUSER, PostgresServer, _server_user

PGBOUNCER = Path("/usr/sbin/pgbouncer")
READY_SECONDS = 30.0
INSTALL_HINT = (
    "PgBouncer is not installed: run `make test` as root (it installs Debian's pgbouncer), "
    "or `sudo apt-get install -y pgbouncer`"
)


def unavailable_reason() -> str | None:
    """Why no PgBouncer can be started here (a skip reason), or None when one can."""
    return None if PGBOUNCER.exists() else INSTALL_HINT


class PgBouncer:
    """One running PgBouncer; `conninfo(dbname)` reaches `server`'s database through it."""

    def __init__(
        self, root: Path, server: PostgresServer, pool_size: int, ignored: str = ""
    ) -> None:
        self.root = root
        self.server = server
        self.port = free_port()
        self.log = root / "pgbouncer.log"
        self.config = root / "pgbouncer.ini"
        users = root / "userlist.txt"
        users.write_text(f'"{SUPERUSER}" "{server.password}"\n')
        users.chmod(0o600)
        self.config.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host=127.0.0.1 port={server.port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = scram-sha-256",
                    f"auth_file = {users}",
                    "pool_mode = transaction",
                    f"default_pool_size = {pool_size}",
                    "max_client_conn = 500",
                    f"logfile = {self.log}",
                    f"pidfile = {root / 'pgbouncer.pid'}",
                    "server_reset_query =",
                    f"ignore_startup_parameters = {ignored}",
                    # PgBouncer's defaults, named (docs/operators.md, Behind PgBouncer): a
                    # client queued for a server waits up to 120 s; after a failed login
                    # to the server it tries again 15 s later.
                    "query_wait_timeout = 120",
                    "server_login_retry = 15",
                    "",
                ]
            )
        )
        self._user = _server_user()
        for path in (root, users, self.config):
            if self._user is not None:
                shutil.chown(path, self._user, self._user)
        self.process: subprocess.Popen[bytes] | None = None

    def conninfo(self, dbname: str = "postgres", **extra: str) -> str:
        params = {
            "host": "127.0.0.1",
            "port": str(self.port),
            "user": SUPERUSER,
            "password": self.server.password,
            "dbname": dbname,
            **extra,
        }
        return psycopg.conninfo.make_conninfo(**params)

    def start(self) -> None:
        command = [str(PGBOUNCER), str(self.config)]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        self.process = subprocess.Popen(
            command,
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # the same lines go to its logfile
        )
        deadline = time.monotonic() + READY_SECONDS
        while True:
            try:
                psycopg.connect(self.conninfo(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("PgBouncer did not start:\n" + self.log_tail()) from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()  # SIGTERM: immediate shutdown
        try:
            self.process.wait(READY_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


@contextmanager
def pgbouncer(
    server: PostgresServer, *, pool_size: int = 40, ignored: str = ""
) -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling in front of server; stopped and removed after.
    `ignored`: its `ignore_startup_parameters` (`options`: dropped rather than refused)."""
    if not PGBOUNCER.exists():
        raise RuntimeError(INSTALL_HINT)
    root = Path(tempfile.mkdtemp(prefix="sessionstate-pgbouncer-"))
    bouncer = PgBouncer(root, server, pool_size, ignored)
    try:
        bouncer.start()
        yield bouncer
    finally:
        try:
            bouncer.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)
