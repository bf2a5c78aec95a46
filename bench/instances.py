"""The service instances a bench starts, and what it asks of them first.

`Served` is `sessionstate serve` in a process group of its own: durable
writes on, rate limits off (every load-generator connection is one actor,
whose limits would be measured instead of the service), its own OPA sidecar
and data dir, fixed bench secrets; `extra_env` adds settings such as
`SESSIONSTATE_STORE`. `Instances` starts them and stops every one on the way
out of its `with` block, however that is left. `token`/`bearer` mint the
bench's tokens; `grant_approval` puts a workspace approval in force.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.processes import held_signals, stop_group
from service.auth.tokens import mint_token
from service.runtime.serving import GRACEFUL_SECONDS

ROOT = Path(__file__).resolve().parent.parent
JWT_SECRET = "jwt-secret-for-service-bench-0123456789abcdef"
DIGEST_KEY = "digest-key-for-service-bench-0123456789abcdef"
TENANT = "tenant-a"
WORKSPACE = f"/v1/tenants/{TENANT}/workspaces/ws-1"
SESSION = WORKSPACE + "/sessions/chat-1"
JSON = {"Content-Type": "application/json"}


class BenchFailure(RuntimeError):
    """A request did not get its expected answer; the run stops."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Served:
    """`python -m service.cli serve` in its own process group, stopped with SIGTERM.

    Durable writes on, rate limits off, its own OPA sidecar, data in `data_dir`
    (default tmp/var); `extra_env` adds settings (e.g. SESSIONSTATE_STORE), `args`
    arguments of `serve` (e.g. `--workers 2`).
    """

    def __init__(
        self,
        opa: str,
        tmp: Path,
        *,
        data_dir: Path | None = None,
        extra_env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"serve-{self.port}.log"
        env = {
            key: value for key, value in os.environ.items() if not key.startswith("SESSIONSTATE_")
        }
        env |= {
            "SESSIONSTATE_DATA_DIR": str(data_dir or tmp / "var"),
            "SESSIONSTATE_PORT": str(self.port),
            "SESSIONSTATE_DURABLE_WRITES": "true",
            "SESSIONSTATE_JWT_SECRET": JWT_SECRET,
            "SESSIONSTATE_DIGEST_KEY": DIGEST_KEY,
            "SESSIONSTATE_OPA_BIN": opa,
            # Every client is one actor: its rate limits would be measured, not the service.
            "SESSIONSTATE_RATE_LIMIT": "off",
            "SESSIONSTATE_DENIAL_RATE_LIMIT": "off",
        }
        env |= extra_env or {}
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "service.cli", "serve", *args],
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(requests.RequestException):
                if requests.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise BenchFailure("the service did not become ready:\n" + self.log_tail())

    def stop(self, timeout: float = GRACEFUL_SECONDS + 5) -> int | None:
        """SIGTERM, wait; SIGKILL the process group if it lingers (a clean stop takes at
        most the service's graceful period). The exit code."""
        return stop_group(self.process, timeout, f"service on port {self.port}")


class Instances:
    """The service processes a bench started: every one is stopped on the way out of the
    `with` block, however it is left (an error, Ctrl-C, SIGTERM after `exit_on_sigterm`)."""

    def __init__(self, opa: str, tmp: Path) -> None:
        self.opa = opa
        self.tmp = tmp
        self.running: list[Served] = []

    def start(self, **options: Any) -> Served:
        """A new instance (options as `Served`'s), once it is ready."""
        with held_signals():
            served = Served(self.opa, self.tmp, **options)
            self.running.append(served)
        served.wait_ready()
        return served

    def stop_all(self) -> list[tuple[Served, int | None]]:
        """Stop every instance still running; each with its exit code."""
        stopped = [(served, served.stop()) for served in self.running]
        self.running = []
        return stopped

    def __enter__(self) -> Instances:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop_all()


def token(role: str, session: str = "chat-1") -> str:
    """A token for role: an operator of tenant-a, or the model service of one session."""
    model_service = role == "model-service"
    return mint_token(
        JWT_SECRET.encode(),
        sub="bench",
        roles=[role],
        tenant=TENANT,
        workspace="ws-1" if model_service else None,
        session=session if model_service else None,
        ttl_seconds=3600,
    )


def bearer(role: str, session: str = "chat-1") -> dict[str, str]:
    return {"Authorization": f"Bearer {token(role, session)}"}


def check(answer: requests.Response, expected: frozenset[int], what: str) -> None:
    if answer.status_code not in expected:
        wanted = "/".join(str(code) for code in sorted(expected))
        raise BenchFailure(
            f"{what}: expected {wanted}, got {answer.status_code}: {answer.text[:300]}"
        )


def grant_approval(url: str) -> None:
    """A workspace-wide approval, so writes and previews of every session are allowed."""
    granted = requests.post(
        url + WORKSPACE + "/approvals",
        json={"ttl_seconds": 3600, "reason": "bench"},
        headers=bearer("operator"),
        timeout=30,
    )
    check(granted, frozenset({201}), "approval grant")


def stopped_report(stopped: list[tuple[Served, int | None]]) -> str:
    """Each stopped instance's exit code and the end of its log."""
    return "\n".join(
        f"service on port {served.port} exited with {code}; its log ends:\n{served.log_tail()}"
        for served, code in stopped
    )
