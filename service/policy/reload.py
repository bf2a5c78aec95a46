"""`sessionstate policy reload`: ask the running service of a data dir to reload its policies.

Why a signal and a pid file, not an admin endpoint: the kernel already decides
who may signal the service (its own user, or root), so there is no new
listener, no token to keep, and `kill -HUP` and the command do exactly the
same thing. The service writes its pid into the data dir once it is up
(`sessionstate.pid`, removed when it stops) and, after every reload, the
outcome into `opa/policy-status.json`; the command signals, then waits for the
next status and prints it.

What a signal cannot carry, the command leaves beside the status before it signals:
a reload request (`opa/reload-request.json`, the owner's alone: an id, when it was
asked, the operator's token if one was given, and an operator's `--skip-tests`
override). The service takes it (renames it away) on the reload the signal asks
for, and only if it is fresh; verifies the token, and records who reloaded on the
decision log's `~system` chain (`service.decisions.activation_log`); a token that
does not verify, or a `--skip-tests` by another than the token's operator, refuses
the reload (`refused`). A bare SIGHUP, or the watcher, finds no request: it is by
`system`, and only the command can skip the tests (`service.policy.coverage_gate`).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import signal
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from store.scope import SCOPE_ID_PATTERN

PID_FILE = "sessionstate.pid"
STATUS_FILE = Path("opa") / "policy-status.json"
REQUEST_FILE = Path("opa") / "reload-request.json"
LOCK_FILE = "sessionstate.lock"
REVISION_PATTERN = r"^[A-Za-z0-9:._-]{1,160}$"
REQUEST_SECONDS = 60.0  # an older request (a command killed before it signalled) is void


class ReloadRefused(ValueError):
    """No reload could be asked for: no service runs here, or it serves no policy directory."""


class PolicyStatus(BaseModel):
    """The policy snapshot the sidecar serves, after the start or the latest reload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generation: int = Field(ge=0, description="0 at start, one more at every reload")
    checked_at: float = Field(description="Unix time at which the policy directory was read")
    outcome: Literal[
        "started", "loaded", "unchanged", "invalid", "refused", "awaiting_approval"
    ] = Field(
        description="`refused`: the operator token of the request did not verify (nothing "
        "was read), or an approval was refused (`reason`); `awaiting_approval`: the new set "
        "passed every check and waits for the approvals SESSIONSTATE_POLICY_ACTIVATION_"
        "APPROVALS asks for (`pending_revision`) while `revision` decides"
    )
    revision: str = Field(description="the served snapshot's revision: the last good one")
    deciding: bool = Field(description="OPA decided with `revision` when the reload ended")
    source_valid: bool = Field(
        description="false when the directory did not compile or did not pass its tests"
    )
    errors: list[str] = Field(
        description="why the directory was refused (path:row: code: message when it does not "
        "compile; reason: what is wrong when an admission check refused it), or what its "
        "tests found when an operator skipped them"
    )
    reasons: list[str] = Field(
        default_factory=list,
        description="the admission checks' reason codes when they refused the policies "
        "(policy_decision_undefined: a decision package is undefined, or does not answer "
        "the decision schema; policy_invariant_violated: an input generated from the input "
        "schema breaks one of the deployment's invariants; policy_package_reserved: a file "
        "declares sessionstate.batch, the service's own package); empty otherwise",
    )
    reason: str | None = Field(
        default=None,
        description="why the new set was refused: policy_source_invalid (it does not "
        "compile, its tenant settings break their schema, or an admission check refused it: "
        "`reasons`), policy_tests_failed (a test "
        "fails, or a policy file is covered below SESSIONSTATE_POLICY_COVERAGE_MIN); null "
        "when it was not refused; with a signed bundle refused: policy_bundle_rejected (OPA "
        "refused it: OPA's reason is in `errors`) or policy_bundle_rollback (older than the "
        "highest serial activated, never offered to OPA)",
    )
    tests_skipped_by: str | None = Field(
        default=None,
        description="the operator whose `policy reload --skip-tests` serves `revision` "
        "although its tests do not pass; null when they pass",
    )
    request_id: str | None = Field(
        default=None, description="the `policy reload` request this reload answered, if any"
    )
    pending_revision: str | None = Field(
        default=None,
        description="the revision that waits for approval (`sessionstate policy approve`); "
        "null: none waits",
    )
    requested_by: str | None = Field(
        default=None,
        description="who asked for `pending_revision`, or for the revision a reload just "
        "activated after its approvals: an operator, or `system`",
    )
    approved_by: list[str] = Field(
        default_factory=list,
        description="the operators whose approvals `pending_revision` (or the revision an "
        "approval just activated) has",
    )


class ReloadRequest(BaseModel):
    """What `sessionstate policy reload` asks of the reload its signal starts."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    request_id: str = Field(pattern=r"^[A-Za-z0-9_-]{16,64}$")
    asked_at: float
    skip_tests_by: str | None = Field(
        default=None,
        pattern=SCOPE_ID_PATTERN,
        description="serve the directory although its tests fail: the operator who says so "
        "(the operator `operator_token` names)",
    )
    operator_token: str | None = Field(
        default=None, max_length=8192, description="the operator's bearer token; null: none"
    )
    approve: str | None = Field(
        default=None,
        pattern=REVISION_PATTERN,
        description="`sessionstate policy approve`: the revision the token's operator approves; "
        "nothing is read",
    )


def take_request(path: Path, now: float) -> ReloadRequest | None:
    """The request left for this reload, removed so that no later one finds it; None when
    there is none, or it is unreadable, or older than REQUEST_SECONDS."""
    claimed = path.with_name(path.name + ".taken")
    try:
        os.replace(path, claimed)
    except FileNotFoundError:
        return None
    try:
        request = ReloadRequest.model_validate_json(claimed.read_bytes())
    except (OSError, ValidationError):
        return None
    finally:
        claimed.unlink(missing_ok=True)
    return request if 0 <= now - request.asked_at <= REQUEST_SECONDS else None


def write_pid(data_dir: Path) -> None:
    _write_atomically(data_dir / PID_FILE, f"{os.getpid()}\n")


def forget_pid(data_dir: Path) -> None:
    (data_dir / PID_FILE).unlink(missing_ok=True)


def forget_status(data_dir: Path) -> None:
    """At start: a status (or a request) left by an earlier run would answer for this one."""
    (data_dir / STATUS_FILE).unlink(missing_ok=True)
    (data_dir / REQUEST_FILE).unlink(missing_ok=True)


def write_status(path: Path, status: PolicyStatus) -> None:
    _write_atomically(path, status.model_dump_json() + "\n")


def read_status(path: Path) -> PolicyStatus | None:
    try:
        return PolicyStatus.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None


def request_reload(
    data_dir: Path,
    timeout: float = 30.0,
    operator_token: str | None = None,
    *,
    skip_tests_by: str | None = None,
    approve: str | None = None,
) -> PolicyStatus:
    """Signal the service of data_dir to reload (or, with `approve`, to approve that waiting
    revision), and return the status it then writes; the request names the operator whose
    token is given (and who skips the tests, if one does)."""
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
    request = ReloadRequest(
        request_id=secrets.token_urlsafe(16),
        asked_at=asked_at,
        skip_tests_by=skip_tests_by,
        operator_token=operator_token,
        approve=approve,
    )
    try:
        _write_atomically(data_dir / REQUEST_FILE, request.model_dump_json(), mode=0o600)
        os.kill(pid, signal.SIGHUP)
        return _answer(data_dir, request, timeout)
    finally:
        _withdraw(data_dir / REQUEST_FILE, request)


def _answer(data_dir: Path, request: ReloadRequest, timeout: float) -> PolicyStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        after = read_status(data_dir / STATUS_FILE)
        # The reload that took the request: not one already under way (a watcher's, say),
        # which read the files before they were asked for.
        if after is not None and after.request_id == request.request_id:
            return after
        time.sleep(0.05)
    raise ReloadRefused(f"the service of {data_dir} did not report a reload within {timeout:.0f}s")


def _withdraw(path: Path, request: ReloadRequest) -> None:
    """A request the service did not take is void: no later SIGHUP may act on it."""
    try:
        left = ReloadRequest.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return
    if left.request_id == request.request_id:
        path.unlink(missing_ok=True)


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
