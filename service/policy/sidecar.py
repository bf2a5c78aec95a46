"""The OPA sidecar: a locked-down `opa run --server`, supervised.

- OPA's API is locked. By default (`listen="unix"`: the sidecars the service
  starts itself) OPA listens on a Unix domain socket, 0600, in a 0700
  directory of the service's user under the work dir
  (`service.policy.private_socket`): no other local user can connect at all,
  so OPA runs without token authentication and `system.authz`, at about half
  their CPU per decision (docs/performance.md). With `listen="tcp"` it
  listens on loopback, where any local user can connect: token
  authentication and the `system.authz` policy admit only the service's
  per-start secret, and only for decision queries; nobody can PUT or DELETE
  policies or data at runtime.
- Policies arrive as a bundle from `BundleServer`, so the decision and the
  policy revision it was made under come from one snapshot. The snapshot is
  taken at start and replaced only by `reload_policies()` (SIGHUP or
  `sessionstate policy reload`), or by the watcher with `watch_policies`
  (`service.policy.source`); each reload's outcome goes to
  `policy-status.json` in the work dir, and a revision OPA decides with
  after a reload to `on_live` as an `Activated`: how it was loaded and who
  asked (`service.policy.activation`), for the live intervals and the
  activation entries (`service.decisions.activation_log`). A reload asked
  with an operator token (`sessionstate policy reload --operator`) is done
  only once `verify_operator` names its operator.
  With `tests` (a `CoverageGate`), a snapshot is served only once its tests
  pass, unless the reload request of `sessionstate policy reload --skip-tests`
  (`reload-request.json` in the work dir, with the token of the operator who
  skips them) says otherwise.
- With a signed bundle file (`bundle_file` and `verification_key`), that file
  is what OPA gets, and OPA is configured to activate only a bundle whose
  signature verifies with the key (`service.policy.signed_bundle`); a bundle
  OPA refuses at start stops the start, one refused at a reload is withdrawn;
  one older than the highest serial activated on the deployment is never
  offered (`service.policy.rollback`), unless `bundle_pin` names it.
- Decision logging is on (console, into `opa.log` in the work dir), so every
  decision carries OPA's `decision_id`.
- With OpenTelemetry export configured (`tracing`, from `service.observability.tracing`),
  OPA's `distributed_tracing` sends its spans to the same collector, joining
  the trace of each decision query.
- If OPA dies, it is restarted with exponential backoff; `stop()` ends it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from service.observability.tracing import OpaTracing
from service.policy.activation import (
    SYSTEM_ACTOR,
    SYSTEM_IDENTITY,
    Activated,
    ActivationHow,
    OperatorIdentity,
    PolicySet,
    signer_key_id,
)
from service.policy.activation_hold import (
    POLICY_ACTIVATION_DENIED,
    POLICY_ACTIVATION_NOT_PENDING,
    ActivationHold,
    ApprovalVerdict,
    PendingActivation,
)
from service.policy.bundle_server import BUNDLE_PATH, BundleServer
from service.policy.client import PolicyClient
from service.policy.coverage_gate import CoverageGate
from service.policy.private_socket import SOCKET_PERM, SocketDirError, fitting, private_socket
from service.policy.reload import (
    REQUEST_FILE,
    PolicyStatus,
    ReloadRequest,
    take_request,
    write_status,
)
from service.policy.rollback import ROLLBACK, RollbackGuard
from service.policy.sidecar_port import sidecar_port
from service.policy.signed_bundle import REJECTED, OpaStatusBoard, SignedBundleSource, SigningAlg
from service.policy.source import PolicySnapshots, PolicySource, ReloadResult
from service.policy.transport import KeepAliveTransport, unix_url

log = logging.getLogger(__name__)

TOKEN_ENV = "SESSIONSTATE_OPA_TOKEN"  # noqa: S105 - the name of a variable, not a secret
BUNDLE_NAME = "sessionstate"
SOCKET_DIR = "socket"  # in the work dir: the Unix socket's private directory

Listen = Literal["unix", "tcp"]


class SidecarError(RuntimeError):
    """OPA could not be started or did not become ready."""


# Linux: OPA gets SIGKILL when the thread that started it dies, so even a
# SIGKILLed service leaves no OPA behind. Loaded once: the hook runs between
# fork and exec, where it must do nothing but this one call.
_PR_SET_PDEATHSIG = 1
_LIBC = (
    ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None
)


def _die_with_parent() -> None:
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class OpaSidecar:
    """Runs and supervises one OPA process for the service."""

    def __init__(
        self,
        opa_bin: str,
        policy_dir: Path,
        work_dir: Path,
        *,
        poll_seconds: int = 1,
        max_backoff_seconds: float = 5.0,
        watch_policies: bool = False,
        activation_timeout: float = 10.0,
        bundle_file: Path | None = None,
        verification_key: Path | None = None,
        verification_alg: SigningAlg = "RS256",
        bundle_pin: str | None = None,
        tracing: OpaTracing | None = None,
        tests: CoverageGate | None = None,
        policy_set: PolicySet = "live",
        hold: ActivationHold | None = None,
        listen: Listen = "unix",
    ) -> None:
        if (bundle_file is None) != (verification_key is None):
            raise ValueError("a signed bundle needs both the bundle file and the verification key")
        self.opa_bin = opa_bin
        self.policy_dir = policy_dir
        self.work_dir = work_dir
        self.listen: Listen = listen
        # On a Unix socket: its path, and no token (nobody else can connect); on loopback
        # TCP: a port, and the per-start secret OPA's authentication asks for.
        self.socket_path: Path | None = None
        self._socket_home: Path | None = None  # a directory of its own, removed at stop
        if listen == "unix":
            self.socket_path = self._socket_in(work_dir)
        self.port = sidecar_port() if listen == "tcp" else None
        self.token = secrets.token_urlsafe(32) if listen == "tcp" else None
        self.poll_seconds = poll_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.watch_policies = watch_policies
        self.activation_timeout = activation_timeout
        self.restarts = 0
        self.bundle_file = bundle_file
        self.verification_key = verification_key
        self.verification_alg = verification_alg
        self.tracing = tracing
        self.policy_set: PolicySet = policy_set
        # The revisions that wait for approval (SESSIONSTATE_POLICY_ACTIVATION_APPROVALS).
        self.hold = hold if hold is not None else ActivationHold()
        self.signer_key_id = (
            None if verification_key is None else signer_key_id(verification_key, verification_alg)
        )
        self.signed: SignedBundleSource | None = None
        self._status_token = secrets.token_urlsafe(32)
        self.policies: PolicySnapshots
        if bundle_file is not None:
            board = OpaStatusBoard(BUNDLE_NAME)
            self.signed = SignedBundleSource(
                bundle_file,
                board,
                opa_bin,
                verdict_timeout=activation_timeout,
                guard=RollbackGuard(bundle_pin),
            )
            self.policies = self.signed
            self._bundles = BundleServer(
                lambda: self.policies.served, board=board, token=self._status_token
            )
        else:
            setting = "SESSIONSTATE_SHADOW_POLICIES" if policy_set == "shadow" else None
            self.policies = PolicySource(
                policy_dir, opa_bin, tests=tests, setting=setting or "SESSIONSTATE_POLICY_DIR"
            )
            self._bundles = BundleServer(lambda: self.policies.served)
        self._probe = PolicyClient(self.url, self.token, timeout=1.0)
        self._health = KeepAliveTransport(self.url, self.token, timeout=0.5)
        self._reload_requested = threading.Event()
        self._reload_lock = threading.Lock()
        self._reloader: threading.Thread | None = None
        self._generation = 0
        self._loaded_at = 0.0
        # Told of each revision OPA decides with after a reload that loaded it.
        self.on_live: Callable[[Activated], None] | None = None
        # Told after each status written (start, reload, approval, refusal): the parent of
        # workers publishes its policy health then (`service.policy.health`).
        self.on_status: Callable[[], None] | None = None
        # The operator a reload request's token names (raises ValueError if none); None: a
        # request with a token is refused.
        self.verify_operator: Callable[[str], OperatorIdentity] | None = None
        # What the approval policy decides of an operator's approval of the waiting
        # revision (and records on the log); None: every approval is refused.
        # (pending, approver, the revision deciding now) -> verdict
        self.decide_approval: (
            Callable[[PendingActivation, OperatorIdentity, str], ApprovalVerdict] | None
        ) = None
        self._process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._supervisor: threading.Thread | None = None
        # A forked child inherits this object; only the owner may stop OPA.
        self._owner_pid = os.getpid()

    def _socket_in(self, work_dir: Path) -> Path:
        """The socket's path: in the work dir (absolute: a relative data dir, `./var` by
        default, names no socket URL), or, where that path would not fit a Unix socket (a
        deep data dir), in a private directory of its own that `mkdtemp` makes (0700, a
        random name) under the system's temporary directory."""
        try:
            return fitting(work_dir.absolute() / SOCKET_DIR / "opa.sock")
        except SocketDirError:
            pass
        try:
            self._socket_home = Path(tempfile.mkdtemp(prefix="sessionstate-opa-"))
            return fitting(self._socket_home / "opa.sock")
        except (SocketDirError, OSError) as error:
            raise SidecarError(f"no path for the OPA sidecar's socket: {error}") from None

    @property
    def url(self) -> str:
        """Where OPA listens: `http+unix://<its socket's path>`, or `http://127.0.0.1:<port>`."""
        if self.socket_path is not None:
            return unix_url(self.socket_path)
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        process = self._process
        return None if process is None else process.pid

    @property
    def log_path(self) -> Path:
        return self.work_dir / "opa.log"

    @property
    def status_path(self) -> Path:
        return self.work_dir / "policy-status.json"

    @property
    def request_path(self) -> Path:
        return self.work_dir / REQUEST_FILE.name

    def start(self, timeout: float = 30.0) -> None:
        """Start OPA and return once it is healthy with the policy bundle activated.

        The policy snapshot is taken first: a policy directory that is missing
        or does not compile stops the start at once (`PolicySourceError`).
        """
        self._loaded_at = time.time()
        self.policies.load()
        refusal = self.hold.start_refusal(self.policies.served.revision)
        if refusal is not None:
            raise SidecarError(refusal)
        self.work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.socket_path is not None:
            try:
                private_socket(self.socket_path.parent, self.socket_path.name)
            except (SocketDirError, OSError) as error:
                raise SidecarError(str(error)) from None
        self._bundles.start()
        self._write_config()
        mark = 0 if self.signed is None else self.signed.board.mark()
        self._spawn()
        self._supervisor = threading.Thread(
            target=self._supervise, name="opa-supervisor", daemon=True
        )
        self._supervisor.start()
        if self.signed is not None:
            refused = self.signed.confirm_start(mark, timeout)
            if refused is not None:
                self.stop()
                raise SidecarError(
                    f"OPA did not activate the policy bundle {self.bundle_file} "
                    f"(SESSIONSTATE_POLICY_BUNDLE): {refused}. It activates only a bundle "
                    "signed (`sessionstate policy build`) with the key whose "
                    f"{self.verification_alg} verification key is "
                    "SESSIONSTATE_POLICY_VERIFICATION_KEY"
                )
        if not self.wait_ready(timeout):
            self.stop()
            raise SidecarError(
                f"OPA did not become ready within {timeout:.0f}s; see {self.log_path}"
            )
        self._report(
            ReloadResult("loaded", self.policies.served.revision), self._loaded_at, started=True
        )
        self._reloader = threading.Thread(
            target=self._reload_when_asked, name="policy-reloader", daemon=True
        )
        self._reloader.start()

    def request_reload(self) -> None:
        """Ask for a reload, from a signal handler say; the reloader thread does it."""
        self._reload_requested.set()

    def started_as(self) -> Activated:
        """The policy set it started with, as an activation (`start`, by `system`)."""
        return self._activated(self.policies.served.revision, "start", SYSTEM_ACTOR)

    def reload_policies(
        self,
        how: ActivationHow = "reload",
        asked_by: OperatorIdentity = SYSTEM_IDENTITY,
        request: ReloadRequest | None = None,
    ) -> PolicyStatus:
        """Take a new snapshot if the directory compiles (and passes its tests, unless the
        request skips them, by `asked_by`); wait until OPA decides with it. Where the deployment
        asks for approvals, a new snapshot waits for them instead (`awaiting_approval`)."""
        with self._reload_lock:
            checked_at = time.time()
            staged = self.policies.stage(None if request is None else request.skip_tests_by)
            if isinstance(staged, ReloadResult):
                result = staged
                if self.hold.withdraw() is not None:
                    log.warning("policy_activation_withdrawn", extra={"outcome": result.outcome})
            else:
                pending = self.hold.hold(staged, how, asked_by)
                if pending is not None:
                    return self._waiting(pending, checked_at, request)
                result = self.policies.serve(staged)
            self._log_reload(result)
            return self._report(result, checked_at, how, asked_by.actor.sub, request)

    def approve_activation(
        self, revision: str, approver: OperatorIdentity, request: ReloadRequest | None = None
    ) -> PolicyStatus:
        """An operator approves the revision that waits: the approval policy decides; with
        every approval the deployment asks for, the revision goes live."""
        with self._reload_lock:
            checked_at = time.time()
            pending = self.hold.waiting_for(revision)
            if pending is None:
                why = "no activation of that revision awaits approval"
                return self._refuse(request, why, POLICY_ACTIVATION_NOT_PENDING)
            verdict = (
                ApprovalVerdict(False, ("approval_undecidable",))
                if self.decide_approval is None
                else self.decide_approval(pending, approver, self.policies.served.revision)
            )
            if not verdict.allow:
                why = "the approval policy (sessionstate.approval) refused the approval"
                return self._refuse(request, why, POLICY_ACTIVATION_DENIED, verdict.reasons)
            approved = self.hold.approve(pending, approver.actor.sub)
            if approved is None:
                waits = self.hold.pending
                assert waits is not None
                return self._waiting(waits, checked_at, request)
            result = self.policies.serve(approved.staged)
            self._log_reload(result)
            return self._report(
                result, checked_at, approved.how, approved.requested_by, request, approved=approved
            )

    def _log_reload(self, result: ReloadResult) -> None:
        if result.outcome == "invalid":
            log.error(  # OPA's refusal of a bundle, and a rollback, are events of their own
                result.reason
                if result.reason in (REJECTED, ROLLBACK)
                else "policy_reload_rejected",
                extra={
                    "policy_set": self.policy_set,
                    "policy_revision": result.revision,
                    "reason": result.reason,
                    "errors": list(result.errors),
                    "reasons": list(result.reasons),
                },
            )
        elif result.outcome == "loaded" and result.tests_skipped_by is not None:
            log.warning(  # the operator's id only: the override carries no free text
                "policy_tests_skipped",
                extra={
                    "actor": result.tests_skipped_by,
                    "policy_revision": result.revision,
                    "errors": list(result.errors),
                },
            )

    def deciding_revision(self) -> str | None:
        """The policy revision OPA decides with now; None when it does not answer."""
        trace = self._probe.probe()
        return None if trace.engine_unavailable else trace.policy_revision

    def _activated(
        self, revision: str, how: ActivationHow, who: str, approved_by: tuple[str, ...] = ()
    ) -> Activated:
        return Activated(
            revision=revision,
            how=how,
            who=who,
            policy_set=self.policy_set,
            signer_key_id=self.signer_key_id,
            commit=self.policies.served.commit,
            approved_by=approved_by,
            approvals_required=self.hold.approvals if self.policy_set == "live" else 1,
        )

    def _report(
        self,
        result: ReloadResult,
        checked_at: float,
        how: ActivationHow = "start",
        who: str = SYSTEM_ACTOR,
        request: ReloadRequest | None = None,
        *,
        started: bool = False,
        refused: bool = False,
        approved: PendingActivation | None = None,
    ) -> PolicyStatus:
        deciding = self._wait_deciding(result.revision)
        outcome = "started" if started else "refused" if refused else result.outcome
        status = self._status(result, checked_at, outcome, deciding, request, approved)
        if deciding and result.outcome == "loaded" and not started and self.on_live is not None:
            # Recorded before the status tells of the reload.
            approvers = () if approved is None else approved.approved_by
            self.on_live(self._activated(result.revision, how, who, approvers))
        write_status(self.status_path, status)
        if self.on_status is not None:
            self.on_status()
        if result.outcome != "invalid" and not started and not refused:  # logged as errors
            log.info(
                "policy_reloaded",
                extra={
                    "policy_set": self.policy_set,
                    "outcome": result.outcome,
                    "policy_revision": result.revision,
                    "deciding": deciding,
                },
            )
        return status

    def _status(
        self,
        result: ReloadResult,
        checked_at: float,
        outcome: str,
        deciding: bool,
        request: ReloadRequest | None,
        approved: PendingActivation | None = None,
    ) -> PolicyStatus:
        """The status a reload (or an approval) ends with; the activation that waits, or the
        one an approval just made live, with who asked for it and who approved it."""
        pending = self.hold.pending
        shown = pending or approved
        generation, self._generation = self._generation, self._generation + 1
        return PolicyStatus.model_validate(
            {
                "generation": generation,
                "checked_at": checked_at,
                "outcome": outcome,
                "revision": result.revision,
                "deciding": deciding,
                "source_valid": self.policies.valid,
                "errors": list(result.errors),
                "reasons": list(result.reasons),
                "reason": result.reason,
                "tests_skipped_by": result.tests_skipped_by,
                "request_id": None if request is None else request.request_id,
                "pending_revision": None if pending is None else pending.revision,
                "requested_by": None if shown is None else shown.requested_by,
                "approved_by": [] if shown is None else list(shown.approved_by),
            }
        )

    def _waiting(
        self, pending: PendingActivation, checked_at: float, request: ReloadRequest | None
    ) -> PolicyStatus:
        """A new revision waits for its approvals; the served one goes on deciding."""
        served = self.policies.served.revision
        log.warning(
            "policy_activation_awaiting_approval",  # the live set's alone
            extra={
                "policy_revision": pending.revision,
                "actor": pending.requested_by,
                "approvals": len(set(pending.operators)),
            },
        )
        result = ReloadResult("unchanged", served)
        status = self._status(
            result, checked_at, "awaiting_approval", self._wait_deciding(served), request
        )
        write_status(self.status_path, status)
        if self.on_status is not None:
            self.on_status()
        return status

    def _refuse(
        self,
        request: ReloadRequest | None,
        why: str,
        reason: str | None = None,
        reasons: tuple[str, ...] = (),
    ) -> PolicyStatus:
        """A request refused: nothing was read, or the approval does not count."""
        log.error(
            "policy_reload_refused", extra={"reason": reason or why, "reasons": list(reasons)}
        )
        served = ReloadResult(
            "unchanged", self.policies.served.revision, (why,), reasons=reasons, reason=reason
        )
        return self._report(served, time.time(), request=request, refused=True)

    def _wait_deciding(self, revision: str) -> bool:
        """OPA polls the bundle every `poll_seconds`: wait for it to decide with revision."""
        deadline = time.monotonic() + self.activation_timeout
        while True:
            if self.deciding_revision() == revision:
                return True
            if time.monotonic() >= deadline or self._stopping.wait(0.1):
                return False

    def _reload_when_asked(self) -> None:
        """Reload on request; with `watch_policies`, also whenever the directory changes."""
        watched = self.policies.served.etag  # what source_revision() reports of it
        while not self._stopping.is_set():
            asked = self._reload_requested.wait(self.poll_seconds if self.watch_policies else None)
            if self._stopping.is_set():
                return
            how: ActivationHow = "bundle_poll" if self.signed is not None else "watcher"
            if asked:
                self._reload_requested.clear()
                how = "sighup"
            elif self.policies.source_revision() in (None, watched) and not (
                self.hold.approved_elsewhere()  # another instance's approvals made it live
            ):
                continue
            watched = self.policies.source_revision() or watched
            self._reload_as_asked(how)

    def _reload_as_asked(self, how: ActivationHow) -> None:
        """A reload, by the operator a fresh `policy reload` request names (`reload`), or by
        `system`; a request whose token names no operator, or whose `--skip-tests` names
        another than its token, is refused, nothing read. Only a signal's reload takes one."""
        request = take_request(self.request_path, time.time()) if how == "sighup" else None
        if request is None:
            self.reload_policies(how)
            return
        asked_by = SYSTEM_IDENTITY
        try:
            if request.operator_token is not None:
                if self.verify_operator is None:
                    raise ValueError("this service cannot verify operator tokens")
                asked_by = self.verify_operator(request.operator_token)
            if request.skip_tests_by is not None and request.skip_tests_by != asked_by.actor.sub:
                raise ValueError("--skip-tests needs the token of the operator who skips them")
            if request.approve is not None and request.operator_token is None:
                raise ValueError("an approval needs the approving operator's token")
        except ValueError as error:
            with self._reload_lock:
                self._refuse(request, f"operator token: {error}")
            return
        if request.approve is not None:
            self.approve_activation(request.approve, asked_by, request)
            return
        self.reload_policies("reload", asked_by, request)

    def ready(self) -> bool:
        """OPA answers and has activated the policy bundle."""
        return self._health.status("/health?bundles=true") == 200

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return True
            time.sleep(0.05)
        return False

    def stop(self, timeout: float = 5.0) -> None:
        """Stop supervising, then end OPA: SIGTERM, and SIGKILL if it lingers."""
        if os.getpid() != self._owner_pid:
            return
        self._stopping.set()
        self._reload_requested.set()  # wakes the reloader, which sees it is stopping
        with self._lock:
            process = self._process
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        for thread in (self._supervisor, self._reloader):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout)
        self._probe.close()
        self._health.close()
        self._bundles.stop()
        if self._socket_home is not None:
            shutil.rmtree(self._socket_home, ignore_errors=True)

    def _write_config(self) -> None:
        config: dict[str, Any] = {
            "services": {"policies": {"url": self._bundles.url}},
            "bundles": {
                BUNDLE_NAME: {
                    "service": "policies",
                    "resource": BUNDLE_PATH.lstrip("/"),
                    "persist": False,
                    "polling": {
                        "min_delay_seconds": self.poll_seconds,
                        "max_delay_seconds": self.poll_seconds,
                    },
                }
            },
            "decision_logs": {"console": True},
        }
        if self.verification_key is not None:
            # OPA's --verification-key: activate only bundles whose signature verifies, and
            # report each download's outcome back to the bundle server.
            config["keys"] = {
                BUNDLE_NAME: {
                    "key": self.verification_key.read_text(),
                    "algorithm": self.verification_alg,
                }
            }
            config["bundles"][BUNDLE_NAME]["signing"] = {"keyid": BUNDLE_NAME}
            config["services"]["policies"]["credentials"] = {
                "bearer": {"token": self._status_token}
            }
            config["status"] = {"service": "policies"}
        if self.tracing is not None:
            # OPA exports its spans where the service does, in the service's traces: the
            # decision query carries the decision span's `traceparent` (service.observability.tracing).
            config["distributed_tracing"] = self.tracing.config()
        path = self.work_dir / "opa-config.json"
        path.touch(mode=0o600)  # it may hold an HS256 secret
        path.write_text(json.dumps(config, indent=2))

    def _command(self) -> list[str]:
        if self.socket_path is not None:  # the directory keeps others out: no token, no authz
            listening = ["--addr", f"unix://{self.socket_path}", "--unix-socket-perm", SOCKET_PERM]
        else:
            listening = [
                "--addr",
                f"127.0.0.1:{self.port}",
                "--authentication=token",
                "--authorization=basic",
            ]
        return [
            self.opa_bin,
            "run",
            "--server",
            *listening,
            "--skip-version-check",
            "--config-file",
            str(self.work_dir / "opa-config.json"),
        ]

    def _spawn(self) -> None:
        env = {
            key: value for key, value in os.environ.items() if not key.startswith("SESSIONSTATE_")
        }
        if self.token is not None:
            env[TOKEN_ENV] = self.token
        with self._lock:
            if self._stopping.is_set():
                return
            if self.socket_path is not None:  # an OPA that died leaves its socket behind
                self.socket_path.unlink(missing_ok=True)
            with open(self.log_path, "ab") as opa_log:
                self._process = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
                    self._command(),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=opa_log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )

    def _supervise(self) -> None:
        backoff = 0.1
        while not self._stopping.is_set():
            process = self._process
            if process is None:
                return
            started = time.monotonic()
            code = process.wait()
            if self._stopping.is_set():
                return
            log.warning("opa_exited", extra={"exit_code": code, "restart_in_s": backoff})
            if time.monotonic() - started > 30:
                backoff = 0.1  # it had been running fine: restart quickly again
            if self._stopping.wait(backoff):
                return
            backoff = min(backoff * 2, self.max_backoff_seconds)
            self.restarts += 1
            self._spawn()


def send_signal(sidecar: OpaSidecar, signum: signal.Signals) -> None:
    """Signal the OPA process (tests use it to kill or pause the engine)."""
    if sidecar.pid is not None:
        os.kill(sidecar.pid, signum)
