"""Tests gate shipping: a policy set is signed or served only once its own tests pass and
cover every policy file to the deployment's threshold (`SESSIONSTATE_POLICY_COVERAGE_MIN`,
100% by default, what `make test` checks of `policies/`).

The tests run on exactly what would be served: the snapshot's files (`PolicyBundle`)
and the directory's `_test.rego` files, written together into a scratch directory, with
the sidecar's own OPA (`opa test --coverage`). `policy build` runs this before it signs,
and a local sidecar's start, reload, SIGHUP and watcher before a snapshot is served
(`service.policy.source`). The coverage figures are the ones scripts/rego_coverage.py
prints for `make test-rego`: `file_coverage` and `shortfalls` are shared.
"""

from __future__ import annotations

import json
import math
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.policy.admission_memo import remember, remembered, tested_tree_key
from service.policy.bundle import PolicyBundle, is_invariant

POLICY_TESTS_FAILED = "policy_tests_failed"
POLICY_TESTS_SKIPPED = "policy_tests_skipped"  # served by an operator's override
DEFAULT_COVERAGE_MIN = 100
TEST_SUFFIX = "_test.rego"
MAX_FINDINGS = 5  # as many as `opa check`'s errors: enough to find the first one
TIMEOUT_SECONDS = 120


def file_coverage(report: Mapping[str, Any]) -> dict[str, float]:
    """Each policy file's coverage in % (tests left out) from `opa test --coverage --format
    json`; a file OPA lists without a figure covers nothing."""
    files = report.get("files", {})
    return {
        name: float(data.get("coverage", 0))
        for name, data in files.items()
        if not name.endswith(TEST_SUFFIX)
    }


def shortfalls(coverage: Mapping[str, float], minimum: float) -> dict[str, float]:
    """The files covered below `minimum` %, sorted by name."""
    return {name: coverage[name] for name in sorted(coverage) if coverage[name] < minimum}


@dataclass(frozen=True)
class CoverageGate:
    """`opa test` over a snapshot: what keeps it from being signed or served."""

    opa_bin: str
    minimum: int = DEFAULT_COVERAGE_MIN  # %, for each policy file
    # A tree that passed is remembered (`service.policy.admission_memo`) for the sidecar's
    # starts and reloads; `policy build` tests what it signs every time (memo=False).
    memo: bool = True

    def findings(self, policy_dir: Path, bundle: PolicyBundle) -> list[str]:
        """Why the snapshot may not ship, one line each ("path:row: test failed: name", or
        "path: covered N%, below M%"); empty when its tests pass and cover it."""
        with tempfile.TemporaryDirectory(prefix="sessionstate-policy-test-") as tmp:
            root = Path(tmp)
            _write_tested(root, policy_dir, bundle)
            key = tested_tree_key(root, self.opa_bin, self.minimum)
            if self.memo and remembered(key):  # the same tree passed: the same verdict
                return []
            findings = self._tested(root)
        if not findings and self.memo:
            remember(key)  # only a pass is remembered: a failure is tested afresh each time
        return findings

    def _tested(self, root: Path) -> list[str]:
        covered = self._opa_test(root, "--coverage")
        if covered is None:
            return ["`opa test` could not run (SESSIONSTATE_OPA_BIN)"]
        if covered.returncode != 0:  # a test failed: named by a run without coverage
            return _capped(self._failures(root, f"{root}/"))
        try:
            coverage = file_coverage(json.loads(covered.stdout))
        except (ValueError, AttributeError, TypeError):
            return ["`opa test --coverage` answered no coverage report"]
        if not coverage and self.minimum > 0:
            return ["no policy file is covered by a test (no _test.rego file?)"]
        return _capped(
            [
                f"{name.removeprefix(f'{root}/')}: covered {_floor(percent)}%, below the "
                f"{self.minimum}% SESSIONSTATE_POLICY_COVERAGE_MIN requires"
                for name, percent in shortfalls(coverage, self.minimum).items()
            ]
        )

    def _failures(self, root: Path, prefix: str) -> list[str]:
        done = self._opa_test(root)
        try:
            results = json.loads(done.stdout) if done is not None else None
            found = [_failure(result, prefix) for result in results or ()]
        except (ValueError, KeyError, TypeError, AttributeError):
            found = []
        failed = [line for line in found if line is not None]
        return failed or ["`opa test` failed; run it on the policy directory to see why"]

    def _opa_test(self, root: Path, *flags: str) -> subprocess.CompletedProcess[str] | None:
        try:
            return subprocess.run(  # noqa: S603 - fixed argv, no shell
                [self.opa_bin, "test", *flags, "--format", "json", str(root)],
                capture_output=True,
                text=True,
                timeout=TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None


def _write_tested(root: Path, policy_dir: Path, bundle: PolicyBundle) -> None:
    """Under root: the snapshot's files, and the directory's tests as they are now (but the
    invariants', which test modules never served: `service.policy.invariants`); not the
    service's batch module, which is not the set's to test."""
    bundle.write_to(root, served=False)
    for path in sorted(policy_dir.rglob("*" + TEST_SUFFIX)):
        if path.is_file() and not is_invariant(path, policy_dir):
            copy = root / path.relative_to(policy_dir)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(path.read_bytes())


def _failure(result: Mapping[str, Any], prefix: str) -> str | None:
    """One result of `opa test --format json` as a line, or None when it passed (or is a
    `todo_` test OPA skips)."""
    if not (result.get("fail") or result.get("error")):
        return None
    location = result["location"]
    where = f"{location['file'].removeprefix(prefix)}:{location['row']}"
    name = f"{result['package']}.{result['name']}"
    error = result.get("error")
    if isinstance(error, Mapping):
        first = str(error.get("message", "")).replace(prefix, "").splitlines()[:1]
        return f"{where}: test failed: {name} ({error.get('code')}: {''.join(first)})"
    return f"{where}: test failed: {name}"


def _floor(percent: float) -> str:
    """To a tenth, rounded down: a file short of 100% never reads "100.0%"."""
    return f"{math.floor(percent * 10) / 10:.1f}"


def _capped(lines: list[str]) -> list[str]:
    if len(lines) > MAX_FINDINGS:
        return [*lines[:MAX_FINDINGS], f"and {len(lines) - MAX_FINDINGS} more"]
    return lines
