"""Real PostgreSQL servers for tests, started and stopped by the tests themselves.

Debian's `postgresql` package (`make` installs it when run as root). Each
server lives in a temporary directory: initdb'd there, listening on a free
port on 127.0.0.1 only, with its unix socket in the same directory and
`fsync=on` (the server all tests share runs with `fsync=off`: `server(durable=False)`). PostgreSQL refuses to run as root, so as root every server
program runs as the system user `sessionstate-test` (created when missing);
otherwise as whoever runs the tests. TCP connections log in with a password
(scram-sha-256), as a deployment would; the socket trusts local users.

`PostgresPair` is a primary with one synchronous standby (streaming
replication, `synchronous_commit = on`, `synchronous_standby_names` naming
the standby), for failover tests: kill -9 the primary, promote the standby.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from itertools import count
from pathlib import Path

import psycopg
import psycopg.sql

from tests.support.ports import free_port


def _pg_bin() -> Path:
    """SESSIONSTATE_PG_BIN, else the newest Debian PostgreSQL (15 on Debian 12)."""
    configured = os.environ.get("SESSIONSTATE_PG_BIN")
    if configured:
        return Path(configured)
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda initdb: (
            int(initdb.parent.parent.name) if initdb.parent.parent.name.isdigit() else 0
        ),
    )
    return found[-1].parent if found else Path("/usr/lib/postgresql/15/bin")


PG_BIN = _pg_bin()
SERVER_USER = "sessionstate-test"
SUPERUSER = "postgres"
STANDBY_NAME = "standby1"
READY_SECONDS = 60.0
_DATABASES = count(1)
INSTALL_HINT = (
    "PostgreSQL is not installed: run `make test` as root (it installs Debian's postgresql), "
    "or `sudo apt-get install -y postgresql`; SESSIONSTATE_PG_BIN names another bin directory"
)


class PostgresMissing(RuntimeError):
    """PostgreSQL's programs are not on this machine."""


def unavailable_reason() -> str | None:
    """Why no server can be started here (a skip reason), or None when one can."""
    if (PG_BIN / "initdb").exists():
        return None
    if os.geteuid() == 0:
        return None  # root can have it: `server()` fails loudly with the install hint
    return INSTALL_HINT


def _server_user() -> str | None:
    """The user the server programs run as: None means the current (non-root) user."""
    if os.geteuid() != 0:
        return None
    known = subprocess.run(["id", "-u", SERVER_USER], capture_output=True, check=False)
    if known.returncode != 0:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                SERVER_USER,
            ],
            check=True,
            capture_output=True,
        )
    return SERVER_USER


class PostgresServer:
    """One PostgreSQL cluster in `root`, run by `pg_ctl` as the server user."""

    def __init__(self, root: Path, password: str, *, name: str = "primary") -> None:
        self.root = root
        self.name = name
        self.data = root / name
        self.socket_dir = root / f"{name}-socket"
        self.log = root / f"{name}.log"
        self.password = password
        self.port = free_port()
        self._user = _server_user()
        self._upgraded_template: str | None = None

    # -- connection strings ----------------------------------------------------

    def conninfo(self, dbname: str = "postgres", **extra: str) -> str:
        """A libpq connection string for TCP on 127.0.0.1, with the password."""
        params = {
            "host": "127.0.0.1",
            "port": str(self.port),
            "user": SUPERUSER,
            "password": self.password,
            "dbname": dbname,
            **extra,
        }
        return psycopg.conninfo.make_conninfo(**params)

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.conninfo(dbname), autocommit=True, connect_timeout=10)

    def create_database(self, template: str | None = None) -> str:
        """A new database on this server, empty or a copy of `template`; its connection
        string."""
        name = f"sessionstate_{next(_DATABASES)}"
        create = psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name))
        if template is not None:
            create += psycopg.sql.SQL(" TEMPLATE {}").format(psycopg.sql.Identifier(template))
        with self.connect() as conn:
            conn.execute(create)
        return self.conninfo(name)

    def upgraded_database(self) -> str:
        """A new database with the store's current schema, copied from a template database
        that was upgraded once (`CREATE DATABASE ... TEMPLATE`: no migration per test)."""
        if self._upgraded_template is None:
            from store.backends.postgres_schema import upgrade

            template = self.create_database()
            upgrade(template)  # its connection is closed on return: a template has none
            self._upgraded_template = str(psycopg.conninfo.conninfo_to_dict(template)["dbname"])
        return self.create_database(template=self._upgraded_template)

    # -- lifecycle -------------------------------------------------------------

    def initdb(self) -> None:
        pwfile = self.root / f"{self.name}.pw"
        pwfile.write_text(self.password + "\n")
        self._own(pwfile)
        self._run(
            PG_BIN / "initdb",
            "--pgdata",
            str(self.data),
            "--username",
            SUPERUSER,
            "--pwfile",
            str(pwfile),
            "--auth-local",
            "trust",
            "--auth-host",
            "scram-sha-256",
            "--encoding",
            "UTF8",
            "--locale",
            "C",
            "--no-instructions",
        )
        pwfile.unlink()
        self.configure(
            listen_addresses="'127.0.0.1'",
            fsync="on",
            synchronous_commit="on",
            max_connections="60",
            shared_buffers="'32MB'",
        )

    def configure(self, **settings: str) -> None:
        """Append settings to postgresql.conf (later lines win); applied at the next start."""
        lines = [f"{name} = {value}" for name, value in settings.items()]
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# sessionstate tests\n" + "\n".join(lines) + "\n")

    def start(self) -> None:
        """Start on this server's port and socket directory; waits until it accepts connections.

        A port taken meanwhile by another process (free_port only probed it) is
        replaced by another free one, twice at most.
        """
        for attempt in range(3):
            try:
                self._start()
                return
            except RuntimeError:
                if attempt == 2 or "could not bind" not in self.log_tail():
                    raise
                self.port = free_port()

    def _start(self) -> None:
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        self._own(self.socket_dir)
        self.configure(port=str(self.port), unix_socket_directories=f"'{self.socket_dir}'")
        self._run(
            PG_BIN / "pg_ctl",
            "start",
            "--pgdata",
            str(self.data),
            "--log",
            str(self.log),
            "--wait",
            "--timeout",
            str(int(READY_SECONDS)),
        )

    def stop(self, mode: str = "fast") -> None:
        """`pg_ctl stop -m mode`; nothing happens when the server is not running."""
        if not self.running:
            return
        self._run(PG_BIN / "pg_ctl", "stop", "--pgdata", str(self.data), "--mode", mode, "--wait")

    def promote(self) -> None:
        """Turn this standby into a primary; returns once it accepts writes."""
        self._run(PG_BIN / "pg_ctl", "promote", "--pgdata", str(self.data), "--wait")

    def kill(self) -> None:
        """kill -9 the postmaster and every process it started, as a lost machine would."""
        pid = self.postmaster_pid
        if pid is None:
            return
        children = _children_of(pid)
        os.kill(pid, signal.SIGKILL)
        for child in children:
            with suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        _wait_gone([pid, *children])

    @property
    def postmaster_pid(self) -> int | None:
        try:
            first = (self.data / "postmaster.pid").read_text().split("\n", 1)[0]
        except FileNotFoundError:
            return None
        pid = int(first)
        return pid if _alive(pid) else None

    @property
    def running(self) -> bool:
        return self.postmaster_pid is not None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    # -- helpers ---------------------------------------------------------------

    def _own(self, path: Path) -> None:
        if self._user is not None:
            shutil.chown(path, self._user, self._user)

    def _run(self, program: Path, *args: str) -> None:
        command: list[str] = [str(program), *args]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            check=False,
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            timeout=READY_SECONDS + 30,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{program.name} {args[0]} failed ({done.returncode}):\n{done.stdout}"
                f"{done.stderr}\n-- server log --\n{self.log_tail()}"
            )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited: what is left is only its exit status.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _children_of(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == pid:
            children.append(int(entry.name))
    return children


def _wait_gone(pids: Sequence[int]) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise RuntimeError("killed PostgreSQL processes did not exit")
        time.sleep(0.05)


@contextmanager
def _workspace() -> Iterator[Path]:
    """A temporary directory the server user owns (pytest's tmp dirs are root's, mode 0700)."""
    root = Path(tempfile.mkdtemp(prefix="sessionstate-pg-"))
    try:
        user = _server_user()
        if user is not None:
            shutil.chown(root, user, user)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _require_installed() -> None:
    if not (PG_BIN / "initdb").exists():
        raise PostgresMissing(INSTALL_HINT)


@contextmanager
def server(*, durable: bool = True) -> Iterator[PostgresServer]:
    """One running server; stopped (fast) and removed afterwards, whatever happened.

    `durable=False` runs it with `fsync=off` (and no full-page writes): for the server the
    tests share, whose data no test expects to outlive a crash of the machine. Tests of
    durability, outages and failover start servers of their own, durable."""
    _require_installed()
    with _workspace() as root:
        running = PostgresServer(root, secrets.token_hex(16))
        try:
            running.initdb()
            if not durable:
                running.configure(fsync="off", full_page_writes="off")
            running.start()
            yield running
        finally:
            try:
                running.stop()
            finally:
                running.kill()


class PostgresPair:
    """A primary and a synchronous standby streaming from it."""

    def __init__(self, primary: PostgresServer, standby: PostgresServer) -> None:
        self.primary = primary
        self.standby = standby

    def conninfo(self, dbname: str = "postgres") -> str:
        """Both servers, the writable one chosen at connect time (as a deployment would)."""
        params = {
            "host": "127.0.0.1,127.0.0.1",
            "port": f"{self.primary.port},{self.standby.port}",
            "user": SUPERUSER,
            "password": self.primary.password,
            "dbname": dbname,
            "target_session_attrs": "read-write",
        }
        return psycopg.conninfo.make_conninfo(**params)

    def kill_primary(self) -> None:
        self.primary.kill()

    def promote(self) -> None:
        self.standby.promote()

    def wait_standby_gone(self) -> None:
        """Until the primary lists no standby streaming from it."""
        deadline = time.monotonic() + READY_SECONDS
        with self.primary.connect() as conn:
            while conn.execute("SELECT count(*) FROM pg_stat_replication").fetchone() != (0,):
                if time.monotonic() > deadline:
                    raise RuntimeError("the primary still lists a standby")
                time.sleep(0.05)

    def wait_synchronous(self) -> None:
        """Until the primary reports the standby as its synchronous standby."""
        deadline = time.monotonic() + READY_SECONDS
        with self.primary.connect() as conn:
            while True:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                    (STANDBY_NAME,),
                ).fetchone()
                if row is not None and row[0] == "sync":
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        "the standby did not become synchronous:\n" + self.standby.log_tail()
                    )
                time.sleep(0.05)


@contextmanager
def primary_and_standby(*, copied_sync_names: bool = False) -> Iterator[PostgresPair]:
    """A primary with a synchronous standby made by `pg_basebackup -R`; both stopped after.

    `copied_sync_names`: the standby keeps the `synchronous_standby_names` it copied from
    the primary (naming itself), as a standby made with `pg_basebackup -R` does unless
    told otherwise; promoted, it then waits at every COMMIT for a standby it does not have.
    """
    _require_installed()
    with _workspace() as root:
        password = secrets.token_hex(16)
        primary = PostgresServer(root, password, name="primary")
        standby = PostgresServer(root, password, name="standby")
        try:
            primary.initdb()
            primary.configure(
                wal_level="replica",
                max_wal_senders="4",
                synchronous_standby_names=f"'{STANDBY_NAME}'",
            )
            primary.start()
            primary._run(
                PG_BIN / "pg_basebackup",
                "--dbname",
                primary.conninfo(),
                "--pgdata",
                str(standby.data),
                "--write-recovery-conf",
                "--wal-method",
                "stream",
                "--checkpoint",
                "fast",
            )
            # The copy carries the primary's settings: the standby's own come after them.
            # The walreceiver names itself by cluster_name, the name the primary waits for.
            standby.configure(cluster_name=f"'{STANDBY_NAME}'")
            if not copied_sync_names:
                standby.configure(synchronous_standby_names="''")
            standby.start()
            pair = PostgresPair(primary, standby)
            pair.wait_synchronous()
            yield pair
        finally:
            for member in (standby, primary):
                with suppress(RuntimeError):
                    member.stop(mode="immediate")
                member.kill()
