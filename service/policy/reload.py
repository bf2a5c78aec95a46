"""`sessionstate policy reload`: ask the running service of a data dir to reload its policies.

Why a signal and a pid file, not an admin endpoint: the kernel already decides
who may signal the service (its own user, or root), so there is no new
listener, no token to keep, and `kill -HUP` and the command do exactly the
same thing. The service writes its pid into the data dir once it is up
(`sessionstate.pid`, removed when it stops) and, after every reload, the
outcome into `opa/policy-status.json`; the command signals, then waits for the
next status and prints it.

Before it signals, the command leaves a request (`opa/reload-request.json`, the owner's
alone) holding the operator's token if one was given: the service takes it at the
reload, verifies the token, and records who reloaded on the decision log's `~system`
chain (`service.decisions.activation_log`); a token that does not verify refuses the
reload (`refused`). A SIGHUP without a fresh request is a bare `sighup`, by `system`.
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
REQUEST_FILE = Path("opa") / "reload-request.json"
LOCK_FILE = "sessionstate.lock"
REQUEST_FRESH_SECONDS = 60.0  # an older request (its command gave up) names no one


class ReloadRefused(ValueError):
    """No reload could be asked for: no service runs here, or it serves no policy directory."""


class PolicyStatus(BaseModel):
    """The policy snapshot the sidecar serves, after the start or the latest reload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generation: int = Field(ge=0, description="0 at start, one more at every reload")
    checked_at: float = Field(description="Unix time at which the policy directory was read")
    outcome: Literal["started", "loaded", "unchanged", "invalid", "refused"] = Field(
        description="`refused`: the operator token of the request did not verify; nothing was read"
    )
    revision: str = Field(description="the served snapshot's revision: the last good one")
    deciding: bool = Field(description="OPA decided with `revision` when the reload ended")
    source_valid: bool = Field(description="false when the directory did not compile")
    errors: list[str] = Field(description="why the directory was refused: path:row: code: message")


class ReloadRequest(BaseModel):
    """What `sessionstate policy reload` asks, beside its signal."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    asked_at: float = Field(description="Unix time of the request")
    operator_token: str | None = Field(
        default=None, max_length=8192, description="the operator's bearer token; null: none"
    )


def take_request(work_dir: Path) -> ReloadRequest | None:
    """The reload request left in the sidecar's work dir, removed as it is read; None when
    there is none, it does not read, or it is not fresh."""
    path = work_dir / REQUEST_FILE.name
    try:
        request = ReloadRequest.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None
    finally:
        path.unlink(missing_ok=True)
    return request if time.time() - request.asked_at <= REQUEST_FRESH_SECONDS else None


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


def request_reload(
    data_dir: Path, timeout: float = 30.0, operator_token: str | None = None
) -> PolicyStatus:
    """Signal the service of data_dir to reload, and return the status it then writes; the
    request names the operator whose token is given."""
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
    request = ReloadRequest(asked_at=asked_at, operator_token=operator_token)
    _write_atomically(data_dir / REQUEST_FILE, request.model_dump_json(), mode=0o600)
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


def _write_atomically(path: Path, text: str, mode: int = 0o666) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    os.replace(partial, path)
