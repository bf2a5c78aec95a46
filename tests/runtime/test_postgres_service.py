"""The service on PostgreSQL: `SESSIONSTATE_STORE`, `db upgrade`, readiness, the served process.

Real PostgreSQL (tests/support/postgres.py) and the real served process (tests/support/served.py).
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import requests

from service.auth.tokens import mint_token
from tests.support import postgres as pg
from tests.support.factories import state_input
from tests.support.live import DIGEST_KEY, JWT_SECRET
from tests.support.served import ROOT, Served, processes_using, start

TENANT, WORKSPACE = "tenant-a", "ws-1"
PASSWORD_MARK = "hunter2-never-shown"


def _cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _base_env(tmp_path: Path, opa_bin: str) -> dict[str, str]:
    return {
        "SESSIONSTATE_DATA_DIR": str(tmp_path / "var"),
        "SESSIONSTATE_JWT_SECRET": JWT_SECRET,
        "SESSIONSTATE_DIGEST_KEY": DIGEST_KEY,
        "SESSIONSTATE_OPA_BIN": opa_bin,
        "SESSIONSTATE_PORT": "0",
    }


def token(role: str, session: str | None = None) -> str:
    scope: dict[str, str] = {"tenant": TENANT}
    if role == "model-service":
        scope |= {"workspace": WORKSPACE, "session": session or "s"}
    return mint_token(JWT_SECRET.encode(), sub="pg", roles=[role], ttl_seconds=3600, **scope)


def state_path(session: str) -> str:
    return f"/v1/tenants/{TENANT}/workspaces/{WORKSPACE}/sessions/{session}/state"


def approve(url: str) -> None:
    requests.post(
        f"{url}/v1/tenants/{TENANT}/workspaces/{WORKSPACE}/approvals",
        json={"ttl_seconds": 86400, "reason": "postgresql test"},
        headers={"Authorization": f"Bearer {token('operator')}"},
        timeout=10,
    ).raise_for_status()


def stop(served: Served) -> None:
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGTERM)
        try:
            served.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(served.process.pid, signal.SIGKILL)
            served.process.wait()


@pytest.fixture
def fresh_database(postgres: pg.PostgresServer) -> str:
    """A new database with no schema yet; its connection string (with the password)."""
    return postgres.create_database()


@pytest.fixture
def served_on_postgres(postgres_conninfo: str, opa_bin: str, tmp_path: Path) -> Iterator[Served]:
    running = start(opa_bin, tmp_path / "var", tmp_path, {"SESSIONSTATE_STORE": postgres_conninfo})
    yield running
    stop(running)


# -- the setting ---------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        f"mysql://user:{PASSWORD_MARK}@db/x",
        f"postgresql://user:{PASSWORD_MARK}@db/x?no_such_option=1",
        f"host=db password={PASSWORD_MARK} no_such_option=1",
        "   ",
        f"just-{PASSWORD_MARK}",
    ],
)
def test_a_store_setting_that_cannot_be_a_store_is_one_line_without_its_value(
    value: str, tmp_path: Path, opa_bin: str
) -> None:
    env = _base_env(tmp_path, opa_bin) | {"SESSIONSTATE_STORE": value}
    for args in (("serve",), ("db", "upgrade")):
        done = _cli(*args, env=env)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "SESSIONSTATE_STORE" in lines[0], done.stderr
        assert PASSWORD_MARK not in done.stderr + done.stdout
        assert "Traceback" not in done.stderr


def test_more_than_one_worker_on_leveldb_is_refused(tmp_path: Path, opa_bin: str) -> None:
    for args, extra in (
        (("serve", "--workers", "2"), {}),
        (("serve",), {"SESSIONSTATE_WORKERS": "2"}),
    ):
        done = _cli(*args, env=_base_env(tmp_path, opa_bin) | extra)
        assert done.returncode == 2, done.stderr
        assert "LevelDB admits one process" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


# -- the schema ----------------------------------------------------------------


def test_db_upgrade_creates_the_schema_once_and_records_its_version(
    fresh_database: str, tmp_path: Path, opa_bin: str
) -> None:
    env = _base_env(tmp_path, opa_bin) | {"SESSIONSTATE_STORE": fresh_database}
    first = _cli("db", "upgrade", env=env)
    assert first.returncode == 0, first.stderr
    assert '"store": "postgresql"' in first.stdout and '"found": 0' in first.stdout
    assert '"changed": true' in first.stdout
    again = _cli("db", "upgrade", env=env)
    assert again.returncode == 0 and '"changed": false' in again.stdout
    assert "password" not in first.stdout + again.stdout
    with psycopg.connect(fresh_database) as conn:
        row = conn.execute("SELECT max(version) FROM sessionstate_schema").fetchone()
    assert row is not None and row[0] >= 1


def test_db_upgrade_on_leveldb_has_nothing_to_do(tmp_path: Path, opa_bin: str) -> None:
    done = _cli("db", "upgrade", env=_base_env(tmp_path, opa_bin))
    assert done.returncode == 0, done.stderr
    assert '"store": "leveldb"' in done.stdout


def test_serve_refuses_a_database_not_yet_upgraded(
    fresh_database: str, tmp_path: Path, opa_bin: str
) -> None:
    env = _base_env(tmp_path, opa_bin) | {"SESSIONSTATE_STORE": fresh_database}
    done = _cli("serve", env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "sessionstate: the PostgreSQL store has no sessionstate schema yet: "
        "run `sessionstate db upgrade` against it first"
    ]


def test_serve_refuses_a_schema_newer_than_it_knows(
    postgres_conninfo: str, tmp_path: Path, opa_bin: str
) -> None:
    with psycopg.connect(postgres_conninfo, autocommit=True) as conn:
        conn.execute("INSERT INTO sessionstate_schema (tenant_id, version) VALUES ('', 999)")
    env = _base_env(tmp_path, opa_bin) | {"SESSIONSTATE_STORE": postgres_conninfo}
    for args in (("serve",), ("db", "upgrade")):
        done = _cli(*args, env=env)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "version 999, newer than this sessionstate" in lines[0]


def test_db_upgrade_of_an_unreachable_database_says_so_without_the_password(
    tmp_path: Path, opa_bin: str
) -> None:
    port = pg.free_port()
    conninfo = f"postgresql://sessionstate:{PASSWORD_MARK}@127.0.0.1:{port}/nowhere"
    env = _base_env(tmp_path, opa_bin) | {"SESSIONSTATE_STORE": conninfo}
    done = _cli("db", "upgrade", env=env)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"sessionstate: cannot reach the PostgreSQL store at 127.0.0.1:{port}/nowhere "
        "(SESSIONSTATE_STORE)"
    )


# -- the served process ----------------------------------------------------------


def test_the_served_process_keeps_state_in_postgresql(
    served_on_postgres: Served, postgres_conninfo: str
) -> None:
    url = served_on_postgres.url
    ready = requests.get(url + "/readyz", timeout=10).json()
    conn_params = psycopg.conninfo.conninfo_to_dict(postgres_conninfo)
    assert ready["store"] == {
        "kind": "postgresql",
        "target": f"127.0.0.1:{conn_params['port']}/{conn_params['dbname']}",
        "reachable": True,
        "takes_writes": True,
    }
    assert str(conn_params["password"]) not in requests.get(url + "/readyz", timeout=10).text
    approve(url)
    headers = {"Authorization": f"Bearer {token('model-service', 'chat-1')}"}
    written = requests.put(
        url + state_path("chat-1"), json=state_input(), headers=headers, timeout=10
    )
    assert written.status_code == 201, written.text
    read = requests.get(url + state_path("chat-1"), headers=headers, timeout=10)
    assert read.status_code == 200
    digest = written.json()["record"]["state_digest"]
    assert read.json()["read_report"]["record"]["state_digest"] == digest
    with psycopg.connect(postgres_conninfo) as conn:
        row = conn.execute(
            "SELECT count(*) FROM sessionstate_lanes WHERE tenant_id = %s", (TENANT,)
        ).fetchone()
    assert row is not None and row[0] >= 1
    assert not (served_on_postgres.data_dir / "leveldb").exists()
    auditor = {"Authorization": f"Bearer {token('auditor')}"}
    verify = requests.get(url + "/v1/decisions/verify", headers=auditor, timeout=30).json()
    assert verify["ok"] is True, verify


def test_readiness_on_leveldb_names_the_embedded_store(served: Served) -> None:
    ready = requests.get(served.url + "/readyz", timeout=10).json()
    assert ready["store"] == {
        "kind": "leveldb",
        "target": str(served.data_dir / "leveldb"),
        "reachable": True,
        "takes_writes": None,  # LevelDB's writes are this process's own: no probe
    }


# -- more than one process -----------------------------------------------------


def test_two_workers_on_postgresql_answer_from_two_pids_and_stop_together(
    postgres_conninfo: str, opa_bin: str, tmp_path: Path
) -> None:
    served = start(
        opa_bin,
        tmp_path / "var",
        tmp_path,
        {"SESSIONSTATE_STORE": postgres_conninfo},
        args=("--workers", "2"),
    )
    try:
        approve(served.url)
        workers: set[str] = set()
        for turn in range(400):  # each request a new connection: the kernel spreads them
            headers = {"Authorization": f"Bearer {token('model-service', f'w{turn % 4}')}"}
            answer = requests.get(
                served.url + state_path(f"w{turn % 4}"),
                headers=headers | {"Connection": "close"},
                timeout=10,
            )
            assert answer.status_code in (200, 404), answer.text
            workers.add(answer.headers["X-Sessionstate-Worker"])
            if len(workers) == 2:
                break
        assert len(workers) == 2, workers
        pids = {int(label.split(":")[1]) for label in workers}
        children = [pid for pid in processes_using(served.data_dir) if pid != served.process.pid]
        assert pids <= set(children)  # the workers name the data dir in their environment
        written = requests.put(
            served.url + state_path("w0"),
            json=state_input(),
            headers={"Authorization": f"Bearer {token('model-service', 'w0')}"},
            timeout=10,
        )
        assert written.status_code == 201, written.text
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(60) == 0, served.log.read_text()[-3000:]
        for pid in pids:
            assert not Path(f"/proc/{pid}").exists() or _zombie(pid), pid
        assert processes_using(served.data_dir) == []
    finally:
        stop(served)


def test_keep_alive_clients_opened_at_once_are_spread_over_both_workers(
    postgres_conninfo: str, opa_bin: str, tmp_path: Path
) -> None:
    served = start(
        opa_bin,
        tmp_path / "var",
        tmp_path,
        {"SESSIONSTATE_STORE": postgres_conninfo},
        args=("--workers", "2"),
    )
    host, port = served.url.removeprefix("http://").split(":")
    clients = [http.client.HTTPConnection(host, int(port), timeout=30) for _ in range(40)]
    try:
        for client in clients:
            client.connect()  # all 40 wait in the backlog before a worker accepts any
        answered: list[tuple[str, str]] = []
        for client in clients:
            labels = []
            for _ in range(2):  # twice on the one kept-alive connection
                client.request("GET", "/healthz")
                answer = client.getresponse()
                assert answer.status == 200 and answer.getheader("Connection") != "close"
                answer.read()
                labels.append(answer.getheader("X-Sessionstate-Worker") or "")
            answered.append((labels[0], labels[1]))
        assert all(first == second for first, second in answered)  # one worker a connection
        per_worker = Counter(first for first, _ in answered)
        assert len(per_worker) == 2, per_worker
        # The kernel hashes each connection to a worker's socket: 5 or fewer of 40 on one
        # side happens once in ten million runs; every one on one side is what was found.
        assert min(per_worker.values()) > 5, per_worker
    finally:
        for client in clients:
            client.close()
        stop(served)


def test_workers_refuse_a_port_another_process_shares_with_so_reuseport(
    postgres_conninfo: str, opa_bin: str, tmp_path: Path
) -> None:
    with socket.create_server(("127.0.0.1", 0), reuse_port=True) as other:
        port = other.getsockname()[1]
        env = _base_env(tmp_path, opa_bin) | {
            "SESSIONSTATE_STORE": postgres_conninfo,
            "SESSIONSTATE_PORT": str(port),
        }
        done = _cli("serve", "--workers", "2", env=env)
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_worker_that_dies_is_started_again(
    postgres_conninfo: str, opa_bin: str, tmp_path: Path
) -> None:
    served = start(
        opa_bin,
        tmp_path / "var",
        tmp_path,
        {"SESSIONSTATE_STORE": postgres_conninfo},
        args=("--workers", "2"),
    )
    try:
        label = requests.get(served.url + "/readyz", timeout=10).headers["X-Sessionstate-Worker"]
        slot, pid = label.split(":")
        os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            seen = requests.get(
                served.url + "/readyz", headers={"Connection": "close"}, timeout=10
            ).headers["X-Sessionstate-Worker"]
            if seen.startswith(f"{slot}:") and seen != label:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the killed worker was not started again")
    finally:
        stop(served)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except OSError:
        return True
