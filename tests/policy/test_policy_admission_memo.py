"""Admissions remembered (`service.policy.admission_memo`): a set the checks admitted is not
checked again while it, its invariants, the OPA binary and the checks' code are the same; a
refused set is checked every time. Real OPA, behind a wrapper that counts its runs."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from service.policy.admission import admit
from service.policy.bundle import load_bundle
from service.policy.coverage_gate import CoverageGate
from tests.support.paths import POLICY_DIR


@pytest.fixture
def counted_opa(opa_bin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `opa` that notes each run in a file, then is the real one; a cache of the test's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    wrapper = tmp_path / "bin" / "opa"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho run >> {tmp_path / "runs"}\nexec {opa_bin} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


def _runs(tmp_path: Path) -> int:
    runs = tmp_path / "runs"
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def test_an_admitted_set_is_not_checked_again_until_something_it_depends_on_changes(
    counted_opa: Path, tmp_path: Path
) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, policies)
    assert admit(str(counted_opa), load_bundle(policies), policies) == []
    checked = _runs(tmp_path)
    assert checked > 0
    assert admit(str(counted_opa), load_bundle(policies), policies) == []
    assert _runs(tmp_path) == checked  # remembered: OPA was not asked
    cache = tmp_path / "cache" / "sessionstate" / "admitted"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700

    invariant = policies / "invariants" / "no_cross_tenant_allow.rego"
    invariant.write_text(invariant.read_text() + "\n# an invariant edited\n")
    assert admit(str(counted_opa), load_bundle(policies), policies) == []
    assert _runs(tmp_path) > checked  # another invariant: checked again


def test_a_refused_set_is_checked_every_time(counted_opa: Path, tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, policies)
    write = policies / "sessionstate" / "write" / "write.rego"
    write.write_text(write.read_text().replace("decision :=", "decison :=", 1))
    (first,) = admit(str(counted_opa), load_bundle(policies), policies)
    checked = _runs(tmp_path)
    (again,) = admit(str(counted_opa), load_bundle(policies), policies)
    assert again == first and _runs(tmp_path) > checked


def test_a_tree_whose_tests_passed_is_not_tested_again_but_by_policy_build(
    counted_opa: Path, tmp_path: Path
) -> None:
    """The tests gate remembers a pass as admissions do; `memo=False` (`policy build`) tests
    every time; a failing test is run afresh each time."""
    policies = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, policies)
    gate = CoverageGate(str(counted_opa))
    assert gate.findings(policies, load_bundle(policies)) == []
    tested = _runs(tmp_path)
    assert tested > 0
    assert gate.findings(policies, load_bundle(policies)) == []
    assert _runs(tmp_path) == tested  # remembered: OPA was not asked
    assert (
        CoverageGate(str(counted_opa), memo=False).findings(policies, load_bundle(policies)) == []
    )
    assert _runs(tmp_path) > tested  # what is signed is tested every time
    tested = _runs(tmp_path)

    test_file = next(policies.rglob("*_test.rego"))
    test_file.write_text(test_file.read_text() + "\ntest_never_holds if false\n")
    first = gate.findings(policies, load_bundle(policies))
    assert first and "test failed" in first[0]
    again_from = _runs(tmp_path)
    assert gate.findings(policies, load_bundle(policies)) == first
    assert again_from > tested and _runs(tmp_path) > again_from  # a failure: tested again
