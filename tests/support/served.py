"""A real `sessionstate serve` process for tests: hypercorn, the OPA sidecar, a data dir."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from tests.support.live import DIGEST_KEY, JWT_SECRET
from tests.support.paths import ROOT
from tests.support.ports import free_port


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    url: str
    data_dir: Path
    log: Path


def processes_using(marker: Path) -> list[int]:
    """Pids whose command line or open files name the data dir (service, worker, OPA)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if str(marker).encode() in cmdline + environ:
            found.append(int(entry.name))
    return found


def opa_pid(data_dir: Path) -> int:
    """The served service's OPA: the process running `opa run` on the data dir's config."""
    for pid in processes_using(data_dir):
        try:
            argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"run" in argv and any(arg.endswith(b"opa-config.json") for arg in argv):
            return pid
    raise AssertionError("the served service runs no OPA")


def start(
    opa_bin: str,
    data_dir: Path,
    tmp: Path,
    extra_env: dict[str, str] | None = None,
    *,
    env_secrets: bool = True,
    args: tuple[str, ...] = (),
) -> Served:
    """Serve `data_dir`; with `env_secrets=False` it uses (or makes) the data dir's secrets."""
    port = free_port()
    env = {
        **os.environ,
        "SESSIONSTATE_DATA_DIR": str(data_dir),
        "SESSIONSTATE_PORT": str(port),
        "SESSIONSTATE_DURABLE_WRITES": "true",
        "SESSIONSTATE_JWT_SECRET": JWT_SECRET,
        "SESSIONSTATE_DIGEST_KEY": DIGEST_KEY,
        "SESSIONSTATE_OPA_BIN": opa_bin,
    }
    if not env_secrets:
        del env["SESSIONSTATE_JWT_SECRET"], env["SESSIONSTATE_DIGEST_KEY"]
    env |= extra_env or {}
    log = tmp / f"serve-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--walkthrough", *args],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    served = Served(process, f"http://127.0.0.1:{port}", data_dir, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(served.url + "/readyz", timeout=1).status_code == 200:
                return served
        except requests.RequestException:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    raise AssertionError("service did not become ready:\n" + log.read_text()[-3000:])
