"""Invariants proven on generated inputs (`service.policy.invariants`).

The default invariants (policies/invariants) hold for the default policies on the inputs
hypothesis generates. A rule that lets any tenant read one workspace (tested, so the tests
gate lets it through) breaks `no_cross_tenant_allow`: the admission refuses it, and so do
`policy build` (nothing signed), a served process's reload (the old revision decides) and
`policy impact`, each naming that workspace in the shrunk counterexample. Real OPA, real
`sessionstate serve`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from service.auth.tokens import mint_token
from service.policy.admission import admit
from service.policy.admission_check import Refusal
from service.policy.bundle import load_bundle
from service.policy.invariants import invariant_modules
from service.policy.reload import STATUS_FILE, PolicyStatus, read_status
from service.policy.sidecar import OpaSidecar
from tests.policy.test_policy_admission import _signed
from tests.policy.test_signed_bundles import Keys
from tests.support.live import JWT_SECRET
from tests.support.paths import POLICY_DIR
from tests.support.served import ROOT, Served, start

READ = Path("sessionstate") / "read" / "read.rego"
READ_TEST = Path("sessionstate") / "read" / "read_test.rego"
SHARED = "ws-shared"
_RULE = f"""
# Any tenant's model services may read the shared workspace: breaks no_cross_tenant_allow.
allow if {{
	input.target.workspace_id == "{SHARED}"
	lib.has_role(input.actor, "model-service")
}}
"""
_TEST = f"""
test_the_shared_workspace_is_readable if {{
	read.decision.allow with input as object.union(valid_input, {{"target": {{"workspace_id": "{SHARED}"}}}})
}}
"""
VIOLATED = (
    "policy_invariant_violated: sessionstate.invariants.no_cross_tenant_allow is violated by "
)


def _broken(tmp: Path, name: str = "policies") -> Path:
    """A copy of the default policies with a tested rule that reads across tenants."""
    policies = tmp / name
    shutil.copytree(POLICY_DIR, policies)
    for file, added in ((READ, _RULE), (READ_TEST, _TEST)):
        path = policies / file
        path.write_text(path.read_text() + added)
    return policies


def _across_tenants(refusals: list[Refusal]) -> Refusal:
    """The refusal naming no_cross_tenant_allow (a rule that reads across tenants may break
    no_cross_session_read as well)."""
    (refusal,) = [r for r in refusals if "no_cross_tenant_allow is violated" in str(r)]
    assert all(str(r).startswith("policy_invariant_violated: ") for r in refusals)
    return refusal


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_default_invariants_hold_for_the_default_policies(
    opa_bin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [name for name, _ in invariant_modules(POLICY_DIR)]
    assert names == ["no_cross_session_read", "no_cross_tenant_allow", "no_write_without_approval"]
    monkeypatch.chdir(tmp_path)
    assert admit(opa_bin, load_bundle(POLICY_DIR), POLICY_DIR) == []
    assert list(tmp_path.iterdir()) == []  # hypothesis wrote nothing where the service runs


def test_the_invariants_are_not_served() -> None:
    served = [name for name, _ in load_bundle(POLICY_DIR).files]
    assert served and not [name for name in served if name.startswith("/invariants/")]


def test_a_broken_invariant_is_refused_with_the_same_smallest_counterexample(
    opa_bin: str, tmp_path: Path
) -> None:
    policies = _broken(tmp_path)
    refusals = admit(opa_bin, load_bundle(policies), policies)
    refusal = _across_tenants(refusals)
    assert f'"workspace_id":"{SHARED}"' in refusal.detail and "\n" not in refusal.detail
    assert admit(opa_bin, load_bundle(policies), policies) == refusals  # derandomized


def test_policy_build_signs_nothing_and_impact_refuses_the_candidate(
    opa_bin: str, tmp_path: Path
) -> None:
    policies = _broken(tmp_path)
    key = Keys(tmp_path / "keys").pair("team")[0]
    out = tmp_path / "bundle.tar.gz"
    env = {"SESSIONSTATE_OPA_BIN": opa_bin, "SESSIONSTATE_POLICY_DIR": str(policies)}
    built = _cli(
        "policy", "build", "--signing-key", str(key), "--serial", "1", "--out", str(out), env=env
    )
    assert built.returncode == 1, built.stderr
    assert VIOLATED in built.stderr and SHARED in built.stderr
    assert built.stdout == "" and not out.exists()

    export = tmp_path / "none.ndjson"
    export.write_text("")
    impact = _cli(
        "policy",
        "impact",
        str(policies),
        "--decisions",
        str(export),
        env={"SESSIONSTATE_OPA_BIN": opa_bin},
    )
    assert impact.returncode == 2
    assert VIOLATED in impact.stderr and SHARED in impact.stderr


@pytest.fixture
def served_copy(opa_bin: str, tmp_path: Path) -> Iterator[tuple[Served, Path]]:
    policies = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, policies)
    running = start(opa_bin, tmp_path / "var", tmp_path, {"SESSIONSTATE_POLICY_DIR": str(policies)})
    yield running, policies
    if running.process.poll() is None:
        running.process.send_signal(signal.SIGTERM)
        running.process.wait(20)


def test_a_reload_of_a_served_process_is_refused_and_the_old_revision_decides(
    served_copy: tuple[Served, Path], tmp_path: Path
) -> None:
    served, policies = served_copy
    revision = requests.get(served.url + "/readyz", timeout=5).json()["policy_revision"]
    shutil.rmtree(policies)
    _broken(tmp_path)
    reloaded = _cli("policy", "reload", env={"SESSIONSTATE_DATA_DIR": str(served.data_dir)})
    assert reloaded.returncode == 1, reloaded.stdout
    status = PolicyStatus.model_validate_json(reloaded.stdout)
    assert (status.outcome, status.revision, status.deciding) == ("invalid", revision, True)
    assert status.reasons == ["policy_invariant_violated"]
    assert any(error.startswith(VIOLATED) and SHARED in error for error in status.errors)
    ready = requests.get(served.url + "/readyz", timeout=5).json()
    assert ready["ready"] is True and ready["policy_revision"] == revision
    assert ready["warnings"] == ["policy_source_invalid", "policy_invariant_violated"]
    other_tenant = mint_token(
        JWT_SECRET.encode(),
        sub="s",
        roles=["model-service"],
        ttl_seconds=600,
        tenant="tenant-b",
        workspace=SHARED,
        session="chat-1",
    )
    read = requests.get(
        f"{served.url}/v1/tenants/tenant-a/workspaces/{SHARED}/sessions/chat-1/state",
        headers={"Authorization": f"Bearer {other_tenant}"},
        timeout=10,
    )
    assert read.status_code == 403  # the old revision decides: no read across tenants


def _next_status(path: Path, after: int) -> PolicyStatus:
    """The status of the first reload after generation `after` (the watcher's, SIGHUP's)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = read_status(path)
        if status is not None and status.generation > after:
            return status
        time.sleep(0.1)
    raise AssertionError("no reload was reported")


def test_the_watcher_and_a_bare_sighup_refuse_it_as_a_reload_does(
    opa_bin: str, tmp_path: Path
) -> None:
    shutil.copytree(POLICY_DIR, tmp_path / "good")
    policies = tmp_path / "policies"  # a link, swapped at once: the watcher sees no half edit
    policies.symlink_to(tmp_path / "good")
    env = {"SESSIONSTATE_POLICY_DIR": str(policies), "SESSIONSTATE_WATCH_POLICIES": "true"}
    served = start(opa_bin, tmp_path / "var", tmp_path, env)
    try:
        revision = requests.get(served.url + "/readyz", timeout=5).json()["policy_revision"]
        (tmp_path / "next").symlink_to(_broken(tmp_path, "broken"))
        (tmp_path / "next").replace(policies)
        watched = _next_status(served.data_dir / STATUS_FILE, 0)
        served.process.send_signal(signal.SIGHUP)
        signalled = _next_status(served.data_dir / STATUS_FILE, watched.generation)
        for status in (watched, signalled):
            assert (status.outcome, status.revision, status.deciding) == ("invalid", revision, True)
            assert status.reasons == ["policy_invariant_violated"]
            assert any(error.startswith(VIOLATED) and SHARED in error for error in status.errors)
        assert requests.get(served.url + "/readyz", timeout=5).json()["policy_revision"] == revision
    finally:
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(20)


def test_a_signed_bundle_that_breaks_one_is_never_offered_at_its_poll(
    opa_bin: str, tmp_path: Path
) -> None:
    private, public = Keys(tmp_path / "keys").pair("team")
    live = _signed(opa_bin, POLICY_DIR, private, tmp_path / "live.tar.gz", tmp_path, serial=1)
    broken = _signed(
        opa_bin, _broken(tmp_path), private, tmp_path / "broken.tar.gz", tmp_path, serial=2
    )
    sidecar = OpaSidecar(
        opa_bin,
        POLICY_DIR,
        tmp_path / "opa",
        bundle_file=live,
        verification_key=public,
        watch_policies=True,
    )
    sidecar.start()
    try:
        good = sidecar.policies.served.revision
        shutil.copyfile(broken, live)  # the bundle's poll finds it
        status = _next_status(sidecar.status_path, 0)
        assert (status.outcome, status.revision, status.deciding) == ("invalid", good, True)
        assert status.reasons == ["policy_invariant_violated"]
        assert sidecar.signed is not None and sidecar.signed.rejection is None  # never offered
        assert sidecar.deciding_revision() == good
    finally:
        sidecar.stop()


def test_a_rule_guarded_by_action_role_and_workspace_is_found_by_the_scope_crossings(
    opa_bin: str, tmp_path: Path
) -> None:
    """Few generated inputs meet three conditions at once; the crossings built on purpose do."""
    policies = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, policies)
    guarded = _RULE.replace(
        "\tinput.target.workspace_id", '\tinput.action == "read"\n\tinput.target.workspace_id'
    ).replace(SHARED, "shared-support")
    (policies / READ).write_text((policies / READ).read_text() + guarded)
    refusal = _across_tenants(admit(opa_bin, load_bundle(policies), policies))
    assert str(refusal).startswith(VIOLATED) and "shared-support" in str(refusal)


def test_a_directory_that_deletes_its_invariants_is_still_held_to_the_shipped_ones(
    opa_bin: str, tmp_path: Path
) -> None:
    policies = _broken(tmp_path)
    shutil.rmtree(policies / "invariants")
    refusal = _across_tenants(admit(opa_bin, load_bundle(policies), policies))
    assert str(refusal).startswith(
        "policy_invariant_violated: sessionstate.invariants.shipped_no_cross_tenant_allow "
    )


def test_the_shipped_invariants_are_pinned_and_a_checkout_cannot_delete_them(
    opa_bin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Change an invariant of policies/invariants, and update SHIPPED_DIGESTS with it."""
    import hashlib

    from service.policy import invariants

    for name, digest in invariants.SHIPPED_DIGESTS.items():
        text = (POLICY_DIR / "invariants" / f"{name}.rego").read_bytes()
        assert hashlib.sha256(text).hexdigest() == digest, name
    checkout = tmp_path / "checkout-policies"  # the default policies, as in a checkout
    shutil.copytree(POLICY_DIR, checkout)
    shutil.rmtree(checkout / "invariants")
    monkeypatch.setattr(invariants, "default_policy_dir", lambda: checkout)
    refusals = admit(opa_bin, load_bundle(checkout), checkout)
    assert refusals and all("is missing from" in str(refusal) for refusal in refusals)
