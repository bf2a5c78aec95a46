"""`db upgrade` and `serve` name why a real PostgreSQL could not be used, apart: a wrong
password, an unknown user, an unknown database, a read-only standby, no server.

Each ends stderr with one line, exit 2, naming the target (host, port, database) and
`SESSIONSTATE_STORE` where the command names the setting, never the password, the user
or libpq's message, and no traceback. Every line before it is the driver's own, as a
JSON line (`store_connect_failed` with the same `failure`): `serve`'s pool retried
meanwhile.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from store.backends.postgres_failures import StoreFailure
from tests.runtime.test_postgres_service import PASSWORD_MARK, _base_env, _cli
from tests.support import postgres as pg

LOGIN = "refused the login: the user or its password is wrong"
NO_DATABASE = "has no such database: create it, or name another"
STANDBY = "is a read-only standby (SQLSTATE 25006)"
SECRET_USER = "user-never-shown-7f3a"


def _refused(conninfo: str, tmp_path: Path, opa_bin: str, *args: str) -> str:
    done = _cli(*args, env=_base_env(tmp_path, opa_bin) | {"SESSIONSTATE_STORE": conninfo})
    assert done.returncode == 2, done.stderr
    *driver, line = done.stderr.strip().splitlines()
    for said in driver:
        logged = json.loads(said)
        assert (logged["event"], logged["logger"]) == ("store_connect_failed", "psycopg.pool")
        assert logged["failure"] in {failure.name.lower() for failure in StoreFailure}
    assert "Traceback" not in done.stderr
    assert PASSWORD_MARK not in done.stderr + done.stdout
    assert SECRET_USER not in done.stderr + done.stdout
    return line


@pytest.mark.parametrize("command", [("db", "upgrade"), ("serve",)], ids=["upgrade", "serve"])
@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"password": PASSWORD_MARK}, LOGIN),
        ({"user": SECRET_USER, "password": PASSWORD_MARK}, LOGIN),
        ({"dbname": "no_such_database"}, NO_DATABASE),
    ],
    ids=["wrong-password", "unknown-user", "unknown-database"],
)
def test_a_refused_login_and_an_unknown_database_are_named_apart(
    postgres: pg.PostgresServer,
    tmp_path: Path,
    opa_bin: str,
    command: tuple[str, ...],
    change: dict[str, str],
    said: str,
) -> None:
    conninfo = postgres.conninfo(**change)
    line = _refused(conninfo, tmp_path, opa_bin, *command)
    target = f"127.0.0.1:{postgres.port}/{change.get('dbname', 'postgres')}"
    assert line.startswith(f"sessionstate: the PostgreSQL store at {target} {said}"), line


def test_db_upgrade_against_a_standby_says_it_is_one(
    postgres_pair: pg.PostgresPair, tmp_path: Path, opa_bin: str
) -> None:
    standby = postgres_pair.standby
    line = _refused(standby.conninfo(), tmp_path, opa_bin, "db", "upgrade")
    assert f"the PostgreSQL store at 127.0.0.1:{standby.port}/postgres {STANDBY}" in line, line


def test_no_server_is_still_unreachable(tmp_path: Path, opa_bin: str) -> None:
    port = pg.free_port()
    conninfo = f"postgresql://sessionstate:{PASSWORD_MARK}@127.0.0.1:{port}/nowhere"
    line = _refused(conninfo, tmp_path, opa_bin, "db", "upgrade")
    assert f"cannot reach the PostgreSQL store at 127.0.0.1:{port}/nowhere" in line
