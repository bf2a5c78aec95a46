"""The service's own OPA sidecar on a Unix socket: nobody but the service's user connects.

The sidecar listens without token authentication or `system.authz`; what refuses every
other local user is the socket's directory (0700) and the socket (0600). This is tried
for real: a connect as `nobody` (setpriv) must fail with EACCES, where every directory
above the socket's is open to it, and succeed once the socket is opened up on purpose,
so that a refusal for any other reason cannot pass for the lock-down.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.policy.client import PROBE, PolicyClient
from service.policy.private_socket import SocketDirError, private_socket
from service.policy.sidecar import OpaSidecar, SidecarError
from tests.support.paths import POLICY_DIR

SETPRIV = shutil.which("setpriv")
AS_NOBODY = [SETPRIV or "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
# Run by the system's Python as nobody: the outcome of one connect, as an errno name.
CONNECT = """
import errno, socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as error:
    print(errno.errorcode.get(error.errno, error.errno))
else:
    print("connected")
"""


def _connect_as_nobody(path: Path) -> str:
    done = subprocess.run(
        [*AS_NOBODY, "/usr/bin/python3", "-c", CONNECT, str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def open_above(opa_bin: str) -> Iterator[OpaSidecar]:
    """A sidecar whose work dir and every directory above it any user may traverse: only
    the socket's own directory and mode stand between another user and OPA."""
    top = Path(tempfile.mkdtemp(prefix="sessionstate-socket-"))
    try:
        top.chmod(0o755)
        work_dir = top / "opa"
        work_dir.mkdir(mode=0o755)
        work_dir.chmod(0o755)
        sidecar = OpaSidecar(opa_bin, POLICY_DIR, work_dir)
        sidecar.start()
        try:
            yield sidecar
        finally:
            sidecar.stop()
    finally:
        shutil.rmtree(top)


def test_the_sidecar_listens_on_a_private_socket_without_token_or_authz(
    sidecar: OpaSidecar,
) -> None:
    assert sidecar.url.startswith("http+unix://")
    assert sidecar.token is None and sidecar.port is None
    assert sidecar.socket_path is not None
    directory = os.lstat(sidecar.socket_path.parent)
    assert stat.S_ISDIR(directory.st_mode) and stat.S_IMODE(directory.st_mode) == 0o700
    assert directory.st_uid == os.geteuid()
    found = os.lstat(sidecar.socket_path)
    assert stat.S_ISSOCK(found.st_mode) and stat.S_IMODE(found.st_mode) == 0o600
    argv = Path(f"/proc/{sidecar.pid}/cmdline").read_bytes().split(b"\0")
    assert f"unix://{sidecar.socket_path}".encode() in argv
    assert not any(arg.startswith((b"--authentication", b"--authorization")) for arg in argv)
    assert sidecar.ready()
    client = PolicyClient(sidecar.url, sidecar.token, timeout=1.0)
    try:
        assert client.probe().policy_revision == sidecar.policies.served.revision
    finally:
        client.close()


@pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None, reason="needs root and setpriv")
def test_another_local_user_cannot_connect(open_above: OpaSidecar) -> None:
    sidecar = open_above
    assert sidecar.socket_path is not None
    directory = sidecar.socket_path.parent
    # Everything above the socket's directory is open to nobody.
    listed = subprocess.run(
        [*AS_NOBODY, "ls", str(directory.parent)], capture_output=True, text=True, timeout=30
    )
    assert listed.returncode == 0 and directory.name in listed.stdout.split()

    assert _connect_as_nobody(sidecar.socket_path) == errno.errorcode[errno.EACCES]
    directory.chmod(0o755)  # the directory alone no longer keeps it out: the socket's mode does
    try:
        assert _connect_as_nobody(sidecar.socket_path) == errno.errorcode[errno.EACCES]
        sidecar.socket_path.chmod(0o666)  # the control: opened up, nobody does connect
        assert _connect_as_nobody(sidecar.socket_path) == "connected"
    finally:
        sidecar.socket_path.chmod(0o600)
        directory.chmod(0o700)
    assert _connect_as_nobody(sidecar.socket_path) == errno.errorcode[errno.EACCES]
    assert sidecar.ready()  # the service's user decides all along


def _not_private(kind: str, directory: Path) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    if kind == "symlink":
        elsewhere = directory.parent / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        directory.symlink_to(elsewhere)
    elif kind == "file":
        directory.write_text("")
    else:
        directory.mkdir()
        directory.chmod(0o700 if kind == "nobody's" else int(kind, 8))
        if kind == "nobody's":
            os.chown(directory, 65534, 65534)


NOT_PRIVATE = {
    "0750": "has mode 0750",
    "0755": "has mode 0755",
    "0777": "has mode 0777",
    "nobody's": "belongs to uid 65534",
    "symlink": "is a symbolic link",
    "file": "is not a directory",
}


@pytest.mark.parametrize(("kind", "why"), NOT_PRIVATE.items(), ids=NOT_PRIVATE.keys())
def test_a_socket_directory_that_is_not_private_stops_the_start(
    opa_bin: str, tmp_path: Path, kind: str, why: str
) -> None:
    if kind == "nobody's" and os.geteuid() != 0:
        pytest.skip("needs root to give the directory away")
    _not_private(kind, tmp_path / "opa" / "socket")
    sidecar = OpaSidecar(opa_bin, POLICY_DIR, tmp_path / "opa")
    with pytest.raises(SidecarError) as refused:
        sidecar.start()
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"the OPA sidecar's socket directory {tmp_path / 'opa' / 'socket'}")
    assert why in message and "mode 0700" in message
    assert sidecar.pid is None  # no OPA was started
    sidecar.stop()


def test_a_socket_left_behind_is_replaced_and_anything_else_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "socket"
    path = private_socket(directory)
    assert stat.S_IMODE(os.lstat(directory).st_mode) == 0o700
    with socket.socket(socket.AF_UNIX) as left:
        left.bind(str(path))  # a dead OPA's socket
    assert private_socket(directory) == path and not path.exists()
    path.write_text("not a socket")
    with pytest.raises(SocketDirError, match="is no socket"):
        private_socket(directory)


def test_a_work_dir_too_deep_for_a_socket_gets_a_private_one_elsewhere(
    opa_bin: str, tmp_path: Path
) -> None:
    """A Unix socket's path holds at most 107 bytes: under a deeper data dir the socket
    lives in a directory `mkdtemp` makes (0700), removed at stop."""
    deep = tmp_path / ("d" * 100)
    sidecar = OpaSidecar(opa_bin, POLICY_DIR, deep)
    assert sidecar.socket_path is not None
    home = sidecar.socket_path.parent
    assert home.name.startswith("sessionstate-opa-") and not home.is_relative_to(deep)
    sidecar.start()
    try:
        assert stat.S_IMODE(os.lstat(home).st_mode) == 0o700
        _decides_the_probe(sidecar)
    finally:
        sidecar.stop()
    assert not home.exists()


def test_the_probe_question_decides_over_the_socket(sidecar: OpaSidecar) -> None:
    client = PolicyClient(sidecar.url, None, timeout=1.0, transport="keep-alive", grouped=True)
    try:
        trace = client.decide(PROBE)
        assert not trace.engine_unavailable
        assert trace.policy_revision == sidecar.policies.served.revision
    finally:
        client.close()


def test_a_relative_work_dir_still_names_one_socket(
    opa_bin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data dir's default is the relative `./var` (`make run`): the socket is found
    by its absolute path, whatever the working directory is later."""
    monkeypatch.chdir(tmp_path)
    sidecar = OpaSidecar(opa_bin, POLICY_DIR, Path("var") / "opa")
    sidecar.start()
    try:
        assert sidecar.socket_path == tmp_path / "var" / "opa" / "socket" / "opa.sock"
        assert sidecar.url.startswith("http+unix://%2F")
        _decides_the_probe(sidecar)
    finally:
        sidecar.stop()


def _decides_the_probe(sidecar: OpaSidecar) -> None:
    client = PolicyClient(sidecar.url, None, timeout=1.0, transport="keep-alive")
    try:
        assert not client.decide(PROBE).engine_unavailable
    finally:
        client.close()
