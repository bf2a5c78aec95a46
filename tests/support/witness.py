"""A real C2SP tlog-witness for the tests: torchwood's litewitness (v0.6.1, built by
scripts/tools.sh), started as its README says, nothing of it mocked.

litewitness keeps its Ed25519 key in an ssh-agent and its known logs in a SQLite
database. The context manager starts a dedicated `ssh-agent -D` on a socket of its
own, has `ssh-keygen` make a key and `ssh-add` load it, starts
`litewitness -name -db -ssh-agent -key SHA256:<fingerprint> -listen 127.0.0.1:<port>`,
and registers each log with `witnessctl add-log` and `witnessctl add-key` (its origin
and note verifier key). It yields the witness's base URL (where /add-checkpoint is
posted) and the verifier key litewitness prints at start, and stops the witness and
its agent at the end, waiting for both: no process is left behind.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from tests.support.go_tools import go_tool
from tests.support.ports import free_port

READY_SECONDS = 30
_VKEY_RE = re.compile(r'msg="verifier key" vkey="?([^"\s]+)')


@dataclass(frozen=True)
class Witness:
    name: str
    url: str
    vkey: str
    db: Path
    agent_socket: Path
    processes: tuple[subprocess.Popen[bytes], ...]

    def add_log(self, origin: str, log_vkey: str) -> None:
        """Makes the witness know a log (at size 0) and the key its checkpoints carry."""
        _witnessctl("add-log", "-db", str(self.db), "-origin", origin)
        _witnessctl("add-key", "-db", str(self.db), "-origin", origin, "-key", log_vkey)

    def logs(self) -> dict[str, dict[str, Any]]:
        """What the witness's database holds per origin (`witnessctl list-logs`)."""
        listed = _witnessctl("list-logs", "-db", str(self.db))
        return {log["origin"]: log for log in map(json.loads, listed.splitlines())}

    def add_checkpoint(
        self, old_size: int, proof: Sequence[bytes], note: bytes
    ) -> requests.Response:
        """POST /add-checkpoint as c2sp.org/tlog-witness frames it: `old <size>`, one
        base64 consistency-proof hash a line, an empty line, the signed note."""
        lines = [f"old {old_size}", *(base64.b64encode(h).decode() for h in proof)]
        body = "".join(line + "\n" for line in lines).encode() + b"\n" + note
        return requests.post(f"{self.url}/add-checkpoint", data=body, timeout=30)


def _witnessctl(*args: str) -> str:
    done = subprocess.run(
        [str(go_tool("witnessctl")), *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"witnessctl {args[0]} failed:\n{done.stderr[-2000:]}"
    return done.stdout


def _run(*args: str, env: Mapping[str, str] | None = None) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, f"{args[0]} failed:\n{done.stderr[-2000:]}"
    return done.stdout


def _wait(ready: Any, process: subprocess.Popen[bytes], what: str, log: Path | None) -> None:
    """Polls `ready()` until it holds; fails at once if `process` died meanwhile."""
    deadline = time.monotonic() + READY_SECONDS
    while not ready():
        tail = "" if log is None else log.read_text(errors="replace")[-2000:]
        assert process.poll() is None, f"{what} exited ({process.returncode}):\n{tail}"
        assert time.monotonic() < deadline, f"{what} did not get ready:\n{tail}"
        time.sleep(0.05)


def _stop(process: subprocess.Popen[bytes], sig: int) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=READY_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _started(
    stack: ExitStack, args: Sequence[str], stop: int, log: Path
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    stack.callback(_stop, process, stop)
    return process


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _agent_with_key(stack: ExitStack, workdir: Path) -> tuple[Path, str, subprocess.Popen[bytes]]:
    """A dedicated ssh-agent holding a new Ed25519 key: its socket, the key's SHA256
    fingerprint, and the agent's process. A Unix socket's path is short (108 bytes):
    it lives in a short temporary directory, not in the test's."""
    sockets = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lw-agent-")))
    agent_socket = sockets / "agent.sock"
    agent = _started(
        stack, ["ssh-agent", "-D", "-a", str(agent_socket)], signal.SIGTERM, workdir / "agent.log"
    )
    _wait(agent_socket.exists, agent, "ssh-agent", workdir / "agent.log")
    key = workdir / "witness_ed25519"
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "litewitness", "-f", str(key))
    env = {"PATH": os.environ.get("PATH", ""), "SSH_AUTH_SOCK": str(agent_socket)}
    _run("ssh-add", "-q", str(key), env=env)
    fingerprint = _run("ssh-keygen", "-l", "-E", "sha256", "-f", f"{key}.pub").split()[1]
    return agent_socket, fingerprint, agent


@contextmanager
def litewitness(
    workdir: Path, logs: Mapping[str, str] | None = None, *, name: str = "witness.test/w1"
) -> Iterator[Witness]:
    """A running litewitness that knows `logs` (origin: the log's note verifier key)."""
    workdir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        agent_socket, fingerprint, agent = _agent_with_key(stack, workdir)
        port, db, log = free_port(), workdir / "litewitness.db", workdir / "litewitness.log"
        command = [str(go_tool("litewitness")), "-name", name, "-db", str(db)]
        command += ["-ssh-agent", str(agent_socket), "-key", fingerprint]
        command += ["-listen", f"127.0.0.1:{port}"]
        # SIGINT is its graceful shutdown; SIGTERM would end it unclean.
        witness = _started(stack, command, signal.SIGINT, log)
        _wait(lambda: _VKEY_RE.search(log.read_text()) is not None, witness, "litewitness", log)
        _wait(lambda: _listening(port), witness, "litewitness", log)
        vkey = _VKEY_RE.search(log.read_text())
        assert vkey is not None
        running = Witness(
            name, f"http://127.0.0.1:{port}", vkey.group(1), db, agent_socket, (witness, agent)
        )
        for origin, log_vkey in (logs or {}).items():
            running.add_log(origin, log_vkey)
        yield running
