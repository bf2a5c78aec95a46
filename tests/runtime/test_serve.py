"""`sessionstate serve` as a real process: hypercorn, the OPA sidecar, signals, durability."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from service.auth.tokens import mint_token
from service.policy.sidecar import OpaSidecar
from tests.support.factories import state_input
from tests.support.live import DIGEST_KEY, JWT_SECRET
from tests.support.served import ROOT, Served, free_port, processes_using, start

CANARY = "SERVE-CANARY-9d2e"
SESSION = "/v1/tenants/tenant-a/workspaces/ws-1/sessions/chat-1"


def _token(role: str) -> str:
    scope = {"tenant": "tenant-a"}
    if role == "model-service":
        scope |= {"workspace": "ws-1", "session": "chat-1"}
    return mint_token(JWT_SECRET.encode(), sub="s", roles=[role], ttl_seconds=600, **scope)


def _write(url: str) -> requests.Response:
    requests.post(
        url + "/v1/tenants/tenant-a/workspaces/ws-1/approvals",
        json={"ttl_seconds": 600, "reason": "serve test"},
        headers={"Authorization": f"Bearer {_token('operator')}"},
        timeout=5,
    ).raise_for_status()
    body = state_input(turns=[{"turn_id": "t1", "role": "user", "payload": CANARY}])
    return requests.put(
        url + SESSION + "/state",
        json=body,
        headers={"Authorization": f"Bearer {_token('model-service')}"},
        timeout=5,
    )


def test_sigterm_stops_the_service_and_its_sidecar(served: Served) -> None:
    assert len(processes_using(served.data_dir)) >= 2  # the service and OPA
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(20) == 0
    deadline = time.monotonic() + 10
    while processes_using(served.data_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_using(served.data_dir) == []
    # OPA was stopped once, by the service; nothing restarted it on the way down.
    assert "opa_exited" not in served.log.read_text()


def test_a_sigkilled_service_loses_no_acknowledged_write(
    served: Served, opa_bin: str, tmp_path: Path
) -> None:
    acknowledged = _write(served.url)
    assert acknowledged.status_code == 201
    os.killpg(served.process.pid, signal.SIGKILL)
    served.process.wait()
    deadline = time.monotonic() + 10
    while processes_using(served.data_dir) and time.monotonic() < deadline:
        time.sleep(0.1)  # the worker and OPA die with their parents
    assert processes_using(served.data_dir) == []
    again = start(opa_bin, served.data_dir, tmp_path)
    try:
        read = requests.get(
            again.url + SESSION + "/state",
            headers={"Authorization": f"Bearer {_token('model-service')}"},
            timeout=5,
        )
        assert read.status_code == 200
        assert read.json()["read_report"]["record"] == acknowledged.json()["record"]
    finally:
        again.process.send_signal(signal.SIGTERM)
        again.process.wait(20)


def test_logs_are_json_lines_without_raw_text(served: Served) -> None:
    assert _write(served.url).status_code == 201
    served.process.send_signal(signal.SIGTERM)
    served.process.wait(20)
    text = served.log.read_text()
    assert CANARY not in text
    request_lines = [line for line in text.splitlines() if '"event":"request"' in line]
    assert request_lines
    assert all('"request_id"' in line and '"route"' in line for line in request_lines)


def test_serve_prints_a_walkthrough_once_ready(served: Served) -> None:
    text = served.log.read_text()
    assert f"sessionstate is up on {served.url}" in text
    assert "sessionstate token --sub demo-model --role model-service" in text
    assert "/state/preview" in text


def _run_serve(
    env_changes: dict[str, str], data_dir: Path, opa_bin: str
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SESSIONSTATE_DATA_DIR": str(data_dir),
        "SESSIONSTATE_PORT": str(free_port()),
        "SESSIONSTATE_JWT_SECRET": JWT_SECRET,
        "SESSIONSTATE_DIGEST_KEY": DIGEST_KEY,
        "SESSIONSTATE_OPA_BIN": opa_bin,
        **env_changes,
    }
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "serve"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_service_on_the_same_data_dir_is_refused(served: Served, opa_bin: str) -> None:
    second = _run_serve({}, served.data_dir, opa_bin)
    assert second.returncode == 2
    assert "is in use by another sessionstate process" in second.stderr
    assert requests.get(served.url + "/readyz", timeout=5).status_code == 200
    time.sleep(2.5)  # past a bundle poll: the first service's OPA still has its policies
    assert requests.get(served.url + "/readyz", timeout=5).status_code == 200


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"SESSIONSTATE_JWT_SECRET": "too-short"},
            "SESSIONSTATE_JWT_SECRET must be at least 32 bytes",
        ),
        (
            {"SESSIONSTATE_OPA_URL": "opa.internal:8181"},
            "SESSIONSTATE_OPA_URL must be http(s)://host:port",
        ),
        (
            {"SESSIONSTATE_JWT_PUBLIC_KEY_FILE": "/nonexistent/key.pem"},
            "SESSIONSTATE_JWT_PUBLIC_KEY_FILE cannot be read",
        ),
    ],
)
def test_bad_configuration_is_refused_before_anything_starts(
    opa_bin: str, tmp_path: Path, changes: dict[str, str], message: str
) -> None:
    refused = _run_serve(changes, tmp_path / "var", opa_bin)
    assert refused.returncode == 2
    assert message in refused.stderr
    assert "Traceback" not in refused.stderr
    assert "too-short" not in refused.stderr
    assert not (tmp_path / "var" / "opa").exists()  # no OPA was started


def test_the_service_decides_over_its_sidecars_private_socket(served: Served) -> None:
    """End to end over HTTP: the sidecar listens on its socket only, without token or authz."""
    assert _write(served.url).status_code == 201
    directory = served.data_dir / "opa" / "socket"
    assert stat.S_IMODE(os.lstat(directory).st_mode) == 0o700
    assert stat.S_ISSOCK(os.lstat(directory / "opa.sock").st_mode)
    opa = [
        Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        for pid in processes_using(served.data_dir)
        if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:2] == [b"run"]
    ]
    assert len(opa) == 1
    assert f"unix://{directory / 'opa.sock'}".encode() in opa[0]
    assert not any(arg.startswith((b"--authentication", b"--authorization")) for arg in opa[0])


def test_an_opa_of_the_operators_on_a_unix_socket(
    sidecar: OpaSidecar, opa_bin: str, tmp_path: Path
) -> None:
    """SESSIONSTATE_OPA_URL may name an OPA's Unix socket: the service starts no OPA of its
    own and decides over that one."""
    assert sidecar.url.startswith("http+unix://%2F")
    external = start(opa_bin, tmp_path / "var", tmp_path, {"SESSIONSTATE_OPA_URL": sidecar.url})
    try:
        assert _write(external.url).status_code == 201
        read = requests.get(
            external.url + SESSION + "/state",
            headers={"Authorization": f"Bearer {_token('model-service')}"},
            timeout=5,
        )
        assert read.status_code == 200 and read.json()["decision"]["allow"] is True
        assert not (tmp_path / "var" / "opa").exists()  # no sidecar of its own
    finally:
        external.process.terminate()
        external.process.wait(20)


def test_a_socket_directory_others_can_open_stops_the_start(opa_bin: str, tmp_path: Path) -> None:
    directory = tmp_path / "var" / "opa" / "socket"
    directory.mkdir(parents=True)
    directory.chmod(0o755)
    refused = _run_serve({}, tmp_path / "var", opa_bin)
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert lines[-1] == (
        f"sessionstate: the OPA sidecar's socket directory {directory} has mode 0755; it must "
        f"be a directory of uid {os.geteuid()} with mode 0700 (remove it and the service makes it)"
    )
    assert "Traceback" not in refused.stderr
    assert not (directory / "opa.sock").exists()  # no OPA was started


def test_a_malformed_chunked_body_is_400(served: Served) -> None:
    host, port = served.url.removeprefix("http://").split(":")
    request = (
        f"POST {SESSION}/state/preview HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {_token('model-service')}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nZZZ\r\n{}\r\n0\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    status_line = answer.split(b"\r\n", 1)[0]
    assert status_line.split()[1] == b"400", answer[:300]
