"""The policy set the local sidecar serves: a snapshot of the policy directory.

The directory is where people edit; the snapshot is what OPA decides with.
It is taken at start and replaced only by a reload (SIGHUP, `sessionstate
policy reload`, or the watcher of `--watch-policies`), so an edit is not live
before its checks have run. A reload whose files do not compile (`opa check
--bundle` with the sidecar's own OPA) is refused: the last good snapshot stays
served, and `valid` says so until a reload of a good source.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from service.policy.bundle import PolicyBundle, ServedBundle, load_bundle
from service.policy.tenant_settings import TENANT_SETTINGS_PATH, document_errors

ReloadOutcome = Literal["loaded", "unchanged", "invalid"]
RELOAD_OUTCOMES: tuple[ReloadOutcome, ...] = ("loaded", "unchanged", "invalid")
MAX_ERRORS = 5  # enough to find the first mistake; a broken file can report hundreds


class PolicySourceError(ValueError):
    """The start snapshot cannot be taken: no directory, no policies, or they do not compile."""


@dataclass(frozen=True)
class ReloadResult:
    """What one reload did; `revision` is the snapshot served after it."""

    outcome: ReloadOutcome
    revision: str
    errors: tuple[str, ...] = field(default=())
    reason: str | None = None  # a refused signed bundle's code: policy_bundle_rejected, ...


class PolicySnapshots(Protocol):
    """What the sidecar serves OPA and reloads: a policy directory's snapshot
    (`PolicySource`) or a signed bundle file (`service.policy.signed_bundle`)."""

    @property
    def served(self) -> ServedBundle: ...

    @property
    def valid(self) -> bool: ...

    def reloads(self, outcome: ReloadOutcome) -> int: ...

    def load(self) -> ServedBundle: ...

    def reload(self) -> ReloadResult: ...

    def source_revision(self) -> str | None: ...


class PolicySource:
    """The served snapshot of one policy directory, and the reloads that replace it."""

    def __init__(self, policy_dir: Path, opa_bin: str) -> None:
        self.policy_dir = policy_dir
        self.opa_bin = opa_bin
        self._served: PolicyBundle | None = None
        self._valid = True
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

    def reloads(self, outcome: ReloadOutcome) -> int:
        return self._reloads[outcome]

    def load(self) -> PolicyBundle:
        """Take the start snapshot; refuse a directory that cannot be served."""
        if not self.policy_dir.is_dir():
            raise PolicySourceError(
                f"SESSIONSTATE_POLICY_DIR is not a directory: {self.policy_dir}"
            )
        bundle, errors = self._read()
        if errors:
            raise PolicySourceError(
                f"the policies in {self.policy_dir} (SESSIONSTATE_POLICY_DIR) cannot be served: "
                + "; ".join(errors)
            )
        self._served = bundle
        return bundle

    def source_revision(self) -> str | None:
        """The revision the directory has now, or None if it cannot be read."""
        try:
            return load_bundle(self.policy_dir).revision
        except OSError:
            return None

    def reload(self) -> ReloadResult:
        """Serve the directory as it is now if it compiles; else keep the last good snapshot."""
        with self._lock:
            served = self.served
            bundle, errors = self._read()
            if errors:
                result = ReloadResult("invalid", served.revision, tuple(errors))
            elif bundle.revision == served.revision:
                result = ReloadResult("unchanged", served.revision)
            else:
                self._served = bundle
                result = ReloadResult("loaded", bundle.revision)
            self._valid = result.outcome != "invalid"
            self._reloads[result.outcome] += 1
            return result

    def _read(self) -> tuple[PolicyBundle, list[str]]:
        """The directory as a bundle, and why it cannot be served (empty when it can)."""
        try:
            bundle = load_bundle(self.policy_dir)
        except OSError as error:
            empty = PolicyBundle(revision="", files=())
            return empty, [f"the policy directory cannot be read ({error.strerror or 'I/O error'})"]
        if not any(name.endswith(".rego") for name, _ in bundle.files):
            return bundle, ["no .rego policy files"]
        # The settings as read into the bundle: what is checked is what OPA would be served.
        settings = dict(bundle.files).get("/" + TENANT_SETTINGS_PATH.as_posix())
        return bundle, document_errors(settings) or compile_errors(self.opa_bin, bundle)


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


def check_errors(output: str, prefix: str, *, fallback: str) -> list[str]:
    """`opa check --format json`'s errors as "path:row: code: message" (path without prefix),
    each once, at most `MAX_ERRORS` and a count of the rest; [fallback] when unreadable."""
    try:
        errors = json.loads(output[output.find("{") :])["errors"]
        found = [
            f"{error['location']['file'].removeprefix(prefix)}:{error['location']['row']}: "
            f"{error['code']}: {error['message']}"
            if isinstance(error.get("location"), dict)
            else f"{error['code']}: {error['message']}"
            for error in errors
        ]
    except (ValueError, KeyError, TypeError, AttributeError):
        found = [fallback]
    unique = list(dict.fromkeys(found))
    if len(unique) > MAX_ERRORS:
        unique = [*unique[:MAX_ERRORS], f"and {len(unique) - MAX_ERRORS} more"]
    return unique
