"""`sessionstate policy reload`: ask the running service of a data dir to reload its policies.

Why a signal and a pid file, not an admin endpoint: the kernel already decides
who may signal the service (its own user, or root), so there is no new
listener, no token to keep, and `kill -HUP` and the command do exactly the
same thing. The service writes its pid into the data dir once it is up
(`sessionstate.pid`, removed when it stops) and, after every reload, the
outcome into `opa/policy-status.json`; the command signals, then waits for the
next status and prints it.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

PID_FILE = "sessionstate.pid"
STATUS_FILE = Path("opa") / "policy-status.json"
LOCK_FILE = "sessionstate.lock"


class ReloadRefused(ValueError):
    """No reload could be asked for: no service runs here, or it serves no policy directory."""


class PolicyStatus(BaseModel):
    """The policy snapshot the sidecar serves, after the start or the latest reload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generation: int = Field(ge=0, description="0 at start, one more at every reload")
    checked_at: float = Field(description="Unix time at which the policy directory was read")
    outcome: Literal["started", "loaded", "unchanged", "invalid"]
    revision: str = Field(description="the served snapshot's revision: the last good one")
    deciding: bool = Field(description="OPA decided with `revision` when the reload ended")
    source_valid: bool = Field(description="false when the directory did not compile")
    errors: list[str] = Field(description="why the directory was refused: path:row: code: message")
    reason: str | None = Field(
        default=None,
        description="with a signed bundle refused: policy_bundle_rejected (OPA refused it) or "
        "policy_bundle_rollback (older than the highest serial activated, never offered to OPA)",
    )


def write_pid(data_dir: Path) -> None:
    _write_atomically(data_dir / PID_FILE, f"{os.getpid()}\n")


def forget_pid(data_dir: Path) -> None:
    (data_dir / PID_FILE).unlink(missing_ok=True)


def forget_status(data_dir: Path) -> None:
    """At start: a status left by an earlier run would answer for this one."""
    (data_dir / STATUS_FILE).unlink(missing_ok=True)


def write_status(path: Path, status: PolicyStatus) -> None:
    _write_atomically(path, status.model_dump_json() + "\n")


def read_status(path: Path) -> PolicyStatus | None:
    try:
        return PolicyStatus.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None


def request_reload(data_dir: Path, timeout: float = 30.0) -> PolicyStatus:
    """Signal the service of data_dir to reload, and return the status it then writes."""
    if not _held(data_dir / LOCK_FILE):
        raise ReloadRefused(f"no sessionstate service is running on the data dir {data_dir}")
    try:
        pid = int((data_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        raise ReloadRefused(
            f"the service of {data_dir} is still starting; try again once it answers"
        ) from None
    before = read_status(data_dir / STATUS_FILE)
    if before is None:
        raise ReloadRefused(
            f"the service of {data_dir} serves no policy directory: it uses the OPA at "
            "SESSIONSTATE_OPA_URL; reload the policies there"
        )
    asked_at = time.time()
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        after = read_status(data_dir / STATUS_FILE)
        # A newer status, and not of a reload already under way (a watcher's, say), which
        # read the files before they were asked for.
        if (
            after is not None
            and after.generation > before.generation
            and after.checked_at >= asked_at
        ):
            return after
        time.sleep(0.05)
    raise ReloadRefused(f"the service of {data_dir} did not report a reload within {timeout:.0f}s")


def _held(lock_file: Path) -> bool:
    """Whether a service holds the data dir: a shared lock is refused while it does."""
    try:
        handle = open(lock_file, "rb")  # noqa: SIM115 - closed below, at once
    except FileNotFoundError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)
