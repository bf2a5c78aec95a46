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
