"""Signed policy bundles: built by `sessionstate policy build`, verified by OPA alone.

Building: the files the sidecar would serve from the policy directory (its
non-test `.rego` files and the tenant settings, `service.policy.bundle`), with
the same content-hash revision and the serial the operator gives it, are
signed by OPA's own `opa build --signing-key`, which writes `.signatures.json`
into the bundle (it covers `.manifest`, so the serial too); `policy build`
first runs the directory's tests over them (`service.policy.coverage_gate`).

Serving (`SESSIONSTATE_POLICY_BUNDLE` with `SESSIONSTATE_POLICY_VERIFICATION_KEY`):
the bundle server offers the file's bytes as they are, and OPA, configured with
the verification key, activates it only if its signature verifies. The service
never judges a signature itself: it learns OPA's verdict from OPA's status
reports (OPA's status plugin posts them to the bundle server), and

- at start, a bundle OPA refuses stops the start (`SidecarError`, with OPA's
  reason);
- at a reload, a refused bundle is withdrawn and the last good one offered
  again (OPA never stopped deciding with it, and a restarted OPA gets it
  back); `valid` is false and `rejections` counts it until a good one loads.

Before a bundle is offered at all (at start and at each reload), its files
pass the admission checks (`service.policy.admission`) on a scratch OPA; one
they refuse is never offered: the start stops (`PolicySourceError`), or the
reload keeps the last good bundle, and `refusals` names the checks' codes.

Before OPA is offered a bundle, its serial is checked (`service.policy.rollback`):
an older one than the highest activated on the deployment is never offered
(`BundleRolledBack` at start; at a reload, refused as `policy_bundle_rollback`
and counted in `rollbacks`), unless it is pinned.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import subprocess
import tarfile
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

from service.policy.admission import admit
from service.policy.bundle import METADATA_KEY, PolicyBundle, manifest_commit
from service.policy.coverage_gate import CoverageGate
from service.policy.rollback import ROLLBACK, RollbackGuard
from service.policy.source import (
    POLICY_SOURCE_INVALID,
    PolicyRefused,
    PolicySource,
    ReloadOutcome,
    ReloadResult,
    StagedPolicies,
    refusal_codes,
)

log = logging.getLogger(__name__)
SigningAlg = Literal["RS256", "ES256", "HS256"]
SIGNING_ALGS: tuple[SigningAlg, ...] = ("RS256", "ES256", "HS256")
MAX_MESSAGE = 300  # OPA's reason, cut: enough to tell a bad signature from a tampered file


REJECTED = "policy_bundle_rejected"  # OPA refused it: its signature, or not a bundle


class BundleBuildError(ValueError):
    """The bundle could not be built: the policies or the key are unfit."""


class BundleRolledBack(ValueError):
    """At start: the bundle is older than the newest activated on the deployment."""


@dataclass(frozen=True)
class BuiltBundle:
    out: Path
    revision: str
    serial: int
    signing_alg: SigningAlg


def build_signed_bundle(
    opa_bin: str,
    policy_dir: Path,
    signing_key: Path,
    signing_alg: SigningAlg,
    out: Path,
    *,
    serial: int,
    tests: CoverageGate | None = None,
) -> BuiltBundle:
    """Check the policy directory as a reload would (its admission checks too: `PolicyRefused`;
    with `tests`, its tests must pass and cover it: `PolicyTestsFailed`), then sign what the
    sidecar would serve, numbered `serial` (1 or more: a later bundle needs a higher one);
    nothing is written when refused."""
    if serial < 1:
        raise BundleBuildError("--serial must be 1 or more")
    if not signing_key.is_file():
        raise BundleBuildError(f"--signing-key names no readable file: {signing_key}")
    # PolicySourceError when unfit, PolicyTestsFailed when its tests keep it from shipping.
    bundle = PolicySource(policy_dir, opa_bin, tests=tests, memo=False).load()
    with tempfile.TemporaryDirectory(prefix="sessionstate-policy-build-") as tmp:
        stage = Path(tmp)
        bundle.write_to(stage, serial=serial)
        try:
            built = subprocess.run(  # noqa: S603 - fixed argv, no shell
                [
                    opa_bin,
                    "build",
                    "--bundle",
                    ".",
                    "--signing-key",
                    str(signing_key.resolve()),
                    "--signing-alg",
                    signing_alg,
                    "--output",
                    str(out.resolve()),
                ],
                cwd=stage,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            raise BundleBuildError("`opa build` could not run (SESSIONSTATE_OPA_BIN)") from None
    if built.returncode != 0:
        reason = (built.stderr or built.stdout).strip().splitlines()
        raise BundleBuildError(
            f"`opa build` refused to sign with that key as {signing_alg}: "
            + (reason[0][:MAX_MESSAGE] if reason else "no reason given")
        )
    return BuiltBundle(out=out, revision=bundle.revision, serial=serial, signing_alg=signing_alg)


@dataclass(frozen=True)
class BundleFile:
    """A bundle file's bytes as offered to OPA; the ETag is their hash."""

    revision: str  # from its .manifest; "" when it has none that reads
    serial: int | None  # from its .manifest's metadata; None when it has none
    content: bytes
    commit: str | None = None  # its .manifest's `metadata.commit`

    @cached_property  # asked at every poll of OPA's; the bytes never change
    def etag(self) -> str:
        return "sha256:" + hashlib.sha256(self.content).hexdigest()

    def tarball(self) -> bytes:
        return self.content


def read_bundle_file(path: Path) -> BundleFile:
    content = path.read_bytes()
    manifest = _manifest(content)
    revision = manifest.get("revision", "")
    return BundleFile(
        revision=revision if isinstance(revision, str) else "",
        serial=_serial(manifest),
        content=content,
        commit=manifest_commit(manifest),
    )


def bundle_contents(bundle: BundleFile) -> PolicyBundle:
    """The policy files a bundle file holds (its `.manifest` and `.signatures.json` aside), as
    OPA would load them; what does not read as a gzipped tar holds none."""
    files: list[tuple[str, bytes]] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(bundle.content), mode="r:gz") as archive:
            for member in archive.getmembers():
                name = "/" + member.name.lstrip("/")
                if not member.isfile() or name in _BUNDLE_META or ".." in name.split("/"):
                    continue
                handle = archive.extractfile(member)
                if handle is not None:
                    files.append((name, handle.read()))
    except (tarfile.TarError, OSError, EOFError):
        files = []
    return PolicyBundle(revision=bundle.revision, files=tuple(sorted(files)))


_BUNDLE_META = ("/.manifest", "/.signatures.json")


def _manifest(content: bytes) -> dict[str, object]:
    """The bundle's one `.manifest`, parsed; empty when it has none that reads, or more than
    one (which OPA might read otherwise than this)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(content), mode="r:gz") as archive:
            found = [
                member
                for member in archive.getmembers()
                if member.name.lstrip("/").removeprefix("./") == ".manifest"
            ]
            handle = archive.extractfile(found[0]) if len(found) == 1 else None
            manifest = json.loads(handle.read(65_536)) if handle is not None else {}
    except (tarfile.TarError, OSError, EOFError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _serial(manifest: dict[str, object]) -> int | None:
    """The serial `policy build --serial` signed into the manifest; None when it has none."""
    metadata = manifest.get("metadata")
    ours = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    serial = ours.get("serial") if isinstance(ours, dict) else None
    return serial if type(serial) is int and serial >= 1 else None


@dataclass(frozen=True)
class OpaBundleReport:
    """One status report of OPA on the bundle, as OPA's status plugin posts it."""

    served: int  # how many times the bundle server had handed out a bundle when it arrived
    active_revision: str | None
    error: str | None  # OPA's message when the last download or activation failed


@dataclass
class OpaStatusBoard:
    """The status reports OPA posts to the bundle server, for those who wait on a verdict."""

    bundle_name: str
    served: int = 0
    reports: list[OpaBundleReport] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def note_served(self) -> None:
        with self._changed:
            self.served += 1

    def note_status(self, document: object) -> None:
        """Keep OPA's report on our bundle; anything else in it is ignored."""
        try:
            status = document["bundles"][self.bundle_name]  # type: ignore[index]
            code, message = status.get("code"), status.get("message")
            active = status.get("active_revision")
        except (KeyError, TypeError, AttributeError):
            return
        error = None
        if code:
            error = (message if isinstance(message, str) and message else str(code))[:MAX_MESSAGE]
        with self._changed:
            self.reports.append(
                OpaBundleReport(
                    served=self.served,
                    active_revision=active if isinstance(active, str) else None,
                    error=error,
                )
            )
            del self.reports[:-64]
            self._changed.notify_all()

    def mark(self) -> int:
        """How many bundles were handed out so far: a verdict must come after the next."""
        with self._changed:
            return self.served

    def verdict(self, mark: int, timeout: float) -> OpaBundleReport | None:
        """OPA's first report after it fetched a bundle handed out after `mark`; None if none."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for report in self.reports:
                    if report.served > mark:
                        return report
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)


class SignedBundleSource:
    """The signed bundle file the sidecar offers OPA, and what OPA made of it."""

    def __init__(
        self,
        bundle_file: Path,
        board: OpaStatusBoard,
        opa_bin: str,
        *,
        verdict_timeout: float = 10.0,
        guard: RollbackGuard | None = None,
    ) -> None:
        self.bundle_file = bundle_file
        self.opa_bin = opa_bin
        self.board = board
        self.verdict_timeout = verdict_timeout
        self.guard = guard if guard is not None else RollbackGuard()
        self._offered: BundleFile | None = None
        self._good: BundleFile | None = None
        self.rejections = 0  # refused by OPA
        self.rollbacks = 0  # refused before OPA saw them: older than the highest serial
        self.rejection: str | None = None  # why the latest offer was refused, while refused
        self.refused_as: str | None = None  # its code: policy_bundle_rejected or _rollback
        self._refusals: tuple[str, ...] = ()  # the admission checks' codes, while they refuse
        self._reloads: Counter[ReloadOutcome] = Counter()
        self._lock = threading.Lock()

    @property
    def served(self) -> BundleFile:
        offered = self._offered
        if offered is None:
            raise RuntimeError("no bundle read yet")
        return offered

    @property
    def valid(self) -> bool:
        """False while the latest bundle was refused: by OPA, as a rollback, or by the
        admission checks."""
        return self.rejection is None and not self._refusals

    @property
    def refusals(self) -> tuple[str, ...]:
        return self._refusals

    def reloads(self, outcome: ReloadOutcome) -> int:
        return self._reloads[outcome]

    def load(self) -> BundleFile:
        """The start: offer the file unless it is a rollback (`BundleRolledBack`) or the
        admission checks refuse it (`PolicyRefused`); `confirm_start` then waits for OPA's
        verdict."""
        candidate = self._read()
        why = self.guard.check(candidate.serial, candidate.revision)
        if why is not None:
            self._refused(ROLLBACK, why)
            log.error(ROLLBACK, extra={"policy_revision": candidate.revision, "errors": [why]})
            raise BundleRolledBack(
                f"the policy bundle {self.bundle_file} (SESSIONSTATE_POLICY_BUNDLE) is refused, "
                f"{ROLLBACK}: {why}"
            )
        refusals = admit(self.opa_bin, bundle_contents(candidate))
        if refusals:
            raise PolicyRefused(
                f"the policy bundle {self.bundle_file} (SESSIONSTATE_POLICY_BUNDLE) cannot be "
                "served: " + "; ".join(str(refusal) for refusal in refusals),
                refusal_codes(refusals),
            )
        self._offered = candidate
        return candidate

    def confirm_start(self, mark: int, timeout: float) -> str | None:
        """None once OPA activated the offered bundle; else why it did not (or no answer)."""
        report = self.board.verdict(mark, timeout)
        if report is None:
            return f"OPA reported nothing on the bundle within {timeout:.0f}s"
        if report.error is not None:
            self._refused(REJECTED, report.error)
            return report.error
        self._good = self.served
        self.guard.activated(self._good.serial, self._good.revision)
        return None

    def source_revision(self) -> str | None:
        """The file's content hash now (what the watcher compares), or None if unreadable."""
        try:
            return read_bundle_file(self.bundle_file).etag
        except OSError:
            return None

    def reload(self, skip_tests_by: str | None = None) -> ReloadResult:
        """Offer the file as it is now unless it is a rollback or the admission checks refuse
        it; keep it if OPA activates it, else withdraw it."""
        staged = self.stage(skip_tests_by)
        return staged if isinstance(staged, ReloadResult) else self.serve(staged)

    def stage(self, skip_tests_by: str | None = None) -> ReloadResult | StagedPolicies:
        """The file as it is now, when it is new and neither a rollback nor refused by the
        admission checks (OPA, which verifies its signature, has not seen it yet); else the
        reload's result.

        A bundle carries no tests (they ran when it was built): there are none to skip.
        """
        del skip_tests_by
        with self._lock:
            good = self._good if self._good is not None else self.served
            try:
                candidate = self._read()
            except OSError as error:
                return self._count(
                    ReloadResult(
                        "invalid", good.revision, (self._unreadable(error),), reason=REJECTED
                    )
                )
            if candidate.etag == good.etag:
                self.rejection = self.refused_as = None
                self._refusals = ()
                return self._count(ReloadResult("unchanged", good.revision))
            why = self.guard.check(candidate.serial, candidate.revision)
            if why is not None:
                self._refused(ROLLBACK, why)
                self._refusals = ()
                return self._count(ReloadResult("invalid", good.revision, (why,), reason=ROLLBACK))
            refusals = admit(self.opa_bin, bundle_contents(candidate))
            if refusals:  # never offered: OPA goes on deciding with the good one
                self.rejection = self.refused_as = None
                self._refusals = refusal_codes(refusals)
                errors = tuple(str(refusal) for refusal in refusals)
                return self._count(
                    ReloadResult(
                        "invalid",
                        good.revision,
                        errors,
                        reasons=self._refusals,
                        reason=POLICY_SOURCE_INVALID,
                    )
                )
            # It passed: what an earlier reload refused no longer stands, served or waiting.
            self.rejection = self.refused_as = None
            self._refusals = ()
            return StagedPolicies(candidate)

    def serve(self, staged: StagedPolicies) -> ReloadResult:
        """Offer what `stage` found to OPA; keep it if OPA activates it, else withdraw it."""
        candidate = staged.bundle
        if not isinstance(candidate, BundleFile):
            raise TypeError("staged by another source")
        with self._lock:
            good = self._good if self._good is not None else self.served
            why = self.guard.check(candidate.serial, candidate.revision)  # it waited, maybe
            if why is not None:
                self._refused(ROLLBACK, why)
                return self._count(ReloadResult("invalid", good.revision, (why,), reason=ROLLBACK))
            mark = self.board.mark()
            self._offered = candidate
            report = self.board.verdict(mark, self.verdict_timeout)
            if report is None or report.error is not None:
                self._offered = good  # OPA keeps deciding with it; a restarted OPA gets it back
                reason = (
                    report.error
                    if report is not None and report.error is not None
                    else f"OPA reported nothing on the bundle within {self.verdict_timeout:.0f}s"
                )
                self._refused(REJECTED, reason)
                self._refusals = ()
                return self._count(
                    ReloadResult("invalid", good.revision, (reason,), reason=REJECTED)
                )
            self._good, self.rejection, self.refused_as = candidate, None, None
            self._refusals = ()
            self.guard.activated(candidate.serial, candidate.revision)
            return self._count(ReloadResult("loaded", candidate.revision))

    def _refused(self, code: str, reason: str) -> None:
        if code == ROLLBACK:
            self.rollbacks += 1
        else:
            self.rejections += 1
        self.rejection, self.refused_as = reason, code

    def _count(self, result: ReloadResult) -> ReloadResult:
        self._reloads[result.outcome] += 1
        return result

    def _read(self) -> BundleFile:
        return read_bundle_file(self.bundle_file)

    def _unreadable(self, error: OSError) -> str:
        return (
            f"the policy bundle {self.bundle_file} (SESSIONSTATE_POLICY_BUNDLE) cannot be read "
            f"({error.strerror or 'I/O error'})"
        )
