"""The policy set the local sidecar serves: a snapshot of the policy directory.

The directory is where people edit; the snapshot is what OPA decides with.
It is taken at start and replaced only by a reload (SIGHUP, `sessionstate
policy reload`, or the watcher of `--watch-policies`), so an edit is not live
before its checks have run. A reload whose files do not compile (`opa check
--bundle` with the sidecar's own OPA) or that the admission checks refuse
(`service.policy.admission`) is refused: the last good snapshot stays served,
and `valid` says so until a reload of a good source. With a `CoverageGate`
(the live sidecar's), a snapshot whose tests fail or do not cover it is refused the
same way (`policy_tests_failed`), unless the reload carries an operator's override
(`policy reload --skip-tests`), and a start with such a directory stops
(`service.policy.coverage_gate`).
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from service.policy.admission import admit
from service.policy.admission_check import Refusal
from service.policy.bundle import PolicyBundle, ServedBundle, load_bundle
from service.policy.coverage_gate import POLICY_TESTS_FAILED, POLICY_TESTS_SKIPPED, CoverageGate
from service.policy.opa_errors import check_errors
from service.policy.tenant_settings import TENANT_SETTINGS_PATH, document_errors

ReloadOutcome = Literal["loaded", "unchanged", "invalid"]
RELOAD_OUTCOMES: tuple[ReloadOutcome, ...] = ("loaded", "unchanged", "invalid")
POLICY_SOURCE_INVALID = "policy_source_invalid"


class PolicySourceError(ValueError):
    """The start snapshot cannot be taken: no directory, no policies, or they do not compile."""


class PolicyRefused(PolicySourceError):
    """The policies compile, but the admission checks refuse them (`reasons`: their codes)."""

    def __init__(self, message: str, reasons: tuple[str, ...]) -> None:
        super().__init__(message)
        self.reasons = reasons


class PolicyTestsFailed(PolicySourceError):
    """The start snapshot's tests fail, or cover a policy file below the threshold."""


@dataclass(frozen=True)
class ReloadResult:
    """What one reload did; `revision` is the snapshot served after it."""

    outcome: ReloadOutcome
    revision: str
    errors: tuple[str, ...] = field(default=())
    reasons: tuple[str, ...] = field(default=())  # the admission checks' codes, when refused
    # Why it was refused: POLICY_SOURCE_INVALID, POLICY_TESTS_FAILED; a signed bundle's
    # policy_bundle_rejected or policy_bundle_rollback.
    reason: str | None = None
    # The operator whose override serves the snapshot although its tests do not pass.
    tests_skipped_by: str | None = None


@dataclass(frozen=True)
class StagedPolicies:
    """A new policy set that passed every check a reload makes, not yet served."""

    bundle: ServedBundle
    findings: tuple[str, ...] = ()  # what its tests found, when an operator skips them
    tests_skipped_by: str | None = None

    @property
    def revision(self) -> str:
        return self.bundle.revision


class PolicySnapshots(Protocol):
    """What the sidecar serves OPA and reloads: a policy directory's snapshot
    (`PolicySource`) or a signed bundle file (`service.policy.signed_bundle`)."""

    @property
    def served(self) -> ServedBundle: ...

    @property
    def valid(self) -> bool: ...

    @property
    def refusals(self) -> tuple[str, ...]: ...

    def reloads(self, outcome: ReloadOutcome) -> int: ...

    def load(self) -> ServedBundle: ...

    def reload(self, skip_tests_by: str | None = None) -> ReloadResult: ...

    def stage(self, skip_tests_by: str | None = None) -> ReloadResult | StagedPolicies: ...

    def serve(self, staged: StagedPolicies) -> ReloadResult: ...

    def source_revision(self) -> str | None: ...


class PolicySource:
    """The served snapshot of one policy directory, and the reloads that replace it."""

    def __init__(
        self,
        policy_dir: Path,
        opa_bin: str,
        *,
        tests: CoverageGate | None = None,
        setting: str = "SESSIONSTATE_POLICY_DIR",
        memo: bool = True,
    ) -> None:
        self.policy_dir = policy_dir
        self.setting = setting  # what names the directory, in a refusal
        self.opa_bin = opa_bin
        self.tests = tests
        self.memo = memo  # admissions remembered (`service.policy.admission_memo`)
        self._served: PolicyBundle | None = None
        self._valid = True
        self._refusals: tuple[str, ...] = ()
        self.refusal: str | None = None  # why the latest reload was refused, while it stands
        self.tests_skipped_by: str | None = None  # the served snapshot's override, if any
        self._reloads: Counter[ReloadOutcome] = Counter()
        self._lock = threading.Lock()

    @property
    def served(self) -> PolicyBundle:
        served = self._served
        if served is None:
            raise RuntimeError("no snapshot taken yet")
        return served

    @property
    def valid(self) -> bool:
        """False after a reload refused the directory, until one accepts it."""
        return self._valid

    @property
    def refusals(self) -> tuple[str, ...]:
        """The admission checks' reason codes of the latest refusal, while `valid` is false."""
        return self._refusals

    def reloads(self, outcome: ReloadOutcome) -> int:
        return self._reloads[outcome]

    def load(self) -> PolicyBundle:
        """Take the start snapshot; refuse a directory that cannot be served."""
        if not self.policy_dir.is_dir():
            raise PolicySourceError(f"{self.setting} is not a directory: {self.policy_dir}")
        bundle, errors, reasons = self._read()
        where = f"the policies in {self.policy_dir} ({self.setting})"
        if errors:
            message = f"{where} cannot be served: " + "; ".join(errors)
            raise PolicyRefused(message, reasons) if reasons else PolicySourceError(message)
        untested = self._untested(bundle)
        if untested:
            raise PolicyTestsFailed(f"{where} do not pass their tests: " + "; ".join(untested))
        self._served = bundle
        return bundle

    def source_revision(self) -> str | None:
        """The revision the directory has now, or None if it cannot be read."""
        try:
            return load_bundle(self.policy_dir).revision
        except OSError:
            return None

    def reload(self, skip_tests_by: str | None = None) -> ReloadResult:
        """Serve the directory as it is now if it compiles and passes its tests (or an
        operator skips them: `skip_tests_by`); else keep the last good snapshot."""
        staged = self.stage(skip_tests_by)
        return staged if isinstance(staged, ReloadResult) else self.serve(staged)

    def stage(self, skip_tests_by: str | None = None) -> ReloadResult | StagedPolicies:
        """The directory as it is now, checked as a reload checks it but not yet served: a
        `StagedPolicies` when it could be, else the reload's result (refused, unchanged)."""
        with self._lock:
            served = self.served
            bundle, errors, reasons = self._read()
            same = bundle.revision == served.revision
            # A snapshot served without its tests passing is tested again: fixed, it is clean.
            gated = not errors and (not same or self.tests_skipped_by is not None)
            untested = self._untested(bundle) if gated else []
            if errors:
                return self._ended(
                    ReloadResult(
                        "invalid",
                        served.revision,
                        tuple(errors),
                        reasons=reasons,
                        reason=POLICY_SOURCE_INVALID,
                    )
                )
            if untested and not same and skip_tests_by is None:
                return self._ended(
                    ReloadResult(
                        "invalid", served.revision, tuple(untested), reason=POLICY_TESTS_FAILED
                    )
                )
            if same:
                if not untested:  # an unchanged snapshot keeps its override while it fails
                    self.tests_skipped_by = None
                self._served = bundle
                result = ReloadResult(
                    "unchanged",
                    bundle.revision,
                    tuple(untested),
                    tests_skipped_by=self.tests_skipped_by,
                )
                return self._ended(result)
            # It passed: what an earlier reload refused no longer stands, served or waiting.
            self._valid, self._refusals, self.refusal = True, (), None
            return StagedPolicies(bundle, tuple(untested), skip_tests_by if untested else None)

    def serve(self, staged: StagedPolicies) -> ReloadResult:
        """Serve what `stage` found (at once, or once the operators a deployment asks for
        approved it: `service.policy.activation_hold`)."""
        if not isinstance(staged.bundle, PolicyBundle):
            raise TypeError("staged by another source")
        with self._lock:
            self.tests_skipped_by = staged.tests_skipped_by
            self._served = staged.bundle
            return self._ended(
                ReloadResult(
                    "loaded",
                    staged.revision,
                    staged.findings,
                    tests_skipped_by=staged.tests_skipped_by,
                )
            )

    def _ended(self, result: ReloadResult) -> ReloadResult:
        """A reload ends: what it did is the source's state until the next one."""
        self._valid = result.outcome != "invalid"
        self._refusals = result.reasons
        self.refusal = result.reason
        self._reloads[result.outcome] += 1
        return result

    def test_warnings(self) -> list[str]:
        """For /readyz: the latest reload was refused for its tests; the served snapshot's
        were skipped by an operator."""
        return [
            warning
            for warning, holds in (
                (POLICY_TESTS_FAILED, self.refusal == POLICY_TESTS_FAILED),
                (POLICY_TESTS_SKIPPED, self.tests_skipped_by is not None),
            )
            if holds
        ]

    def _untested(self, bundle: PolicyBundle) -> list[str]:
        """Why the snapshot's tests keep it from being served; empty without a gate."""
        return [] if self.tests is None else self.tests.findings(self.policy_dir, bundle)

    def _read(self) -> tuple[PolicyBundle, list[str], tuple[str, ...]]:
        """The directory as a bundle, why it cannot be served (empty when it can), and the
        admission checks' reason codes when they refused it."""
        try:
            bundle = load_bundle(self.policy_dir)
        except OSError as error:
            empty = PolicyBundle(revision="", files=())
            why = f"the policy directory cannot be read ({error.strerror or 'I/O error'})"
            return empty, [why], ()
        if not any(name.endswith(".rego") for name, _ in bundle.files):
            return bundle, ["no .rego policy files"], ()
        # The settings as read into the bundle: what is checked is what OPA would be served.
        settings = dict(bundle.files).get("/" + TENANT_SETTINGS_PATH.as_posix())
        errors = document_errors(settings) or compile_errors(self.opa_bin, bundle)
        if errors:
            return bundle, errors, ()
        refusals = admit(self.opa_bin, bundle, self.policy_dir, memo=self.memo)
        return bundle, [str(refusal) for refusal in refusals], refusal_codes(refusals)


def compile_errors(opa_bin: str, bundle: PolicyBundle) -> list[str]:
    """`opa check --bundle` over exactly the bundle's files: "path:row: code: message" each."""
    with tempfile.TemporaryDirectory(prefix="sessionstate-policy-check-") as tmp:
        root = Path(tmp)
        bundle.write_to(root)
        try:
            checked = subprocess.run(  # noqa: S603 - fixed argv, no shell
                [opa_bin, "check", "--bundle", "--format", "json", str(root)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return ["`opa check` could not run (SESSIONSTATE_OPA_BIN)"]
        if checked.returncode == 0:
            return []
        return check_errors(
            checked.stdout + checked.stderr,
            f"{root}/",
            fallback="`opa check` failed; run it on the policy directory to see why",
        )


def refusal_codes(refusals: Sequence[Refusal]) -> tuple[str, ...]:
    """The reason codes of the admission checks' refusals, each once, sorted."""
    return tuple(sorted({refusal.reason for refusal in refusals}))
