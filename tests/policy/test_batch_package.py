"""`sessionstate.batch` is the service's own package (service.policy.batch_reserved), served
beside every policy set, and a set OPA will not ask it of is asked one decision at a time.
Real OPA sidecars over copies of `policies/`."""

from __future__ import annotations

import shutil
import tarfile
import threading
from pathlib import Path

import pytest

from service.policy.batch import LIVE_BATCH_MODULE_PATH, live_batch_module
from service.policy.client import PolicyClient
from service.policy.sidecar import OpaSidecar
from service.policy.signed_bundle import build_signed_bundle
from service.policy.source import PolicyRefused, PolicySourceError
from service.policy.trace import DecisionTrace
from tests.policy.test_signed_bundles import Keys
from tests.support.paths import POLICY_DIR
from tests.support.policy_inputs import allowed_input

AUTHZ = Path("system") / "authz" / "authz.rego"


def _copy(tmp: Path) -> Path:
    policies = tmp / "policies"
    shutil.copytree(POLICY_DIR, policies)
    return policies


def _concurrent_reads(client: PolicyClient, count: int = 16) -> list[DecisionTrace]:
    traces: list[DecisionTrace] = []
    start = threading.Barrier(count)
    guard = threading.Lock()

    def one() -> None:
        start.wait()
        for _ in range(8):
            trace = client.decide(allowed_input("read"))
            with guard:
                traces.append(trace)

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return traces


def _grouped_reads(sidecar: OpaSidecar) -> tuple[list[DecisionTrace], PolicyClient]:
    """Concurrent reads through a grouping client of the sidecar, started and stopped here."""
    sidecar.start()
    client = PolicyClient(
        sidecar.url, sidecar.token, timeout=2, transport="keep-alive", grouped=True
    )
    try:
        return _concurrent_reads(client), client
    finally:
        client.close()
        sidecar.stop()


def test_a_set_that_declares_the_batch_package_is_refused(opa_bin: str, tmp_path: Path) -> None:
    policies = _copy(tmp_path)
    mine = policies / "sessionstate" / "mine" / "mine.rego"
    mine.parent.mkdir()
    mine.write_text("package sessionstate.batch\n\nhelper := 1\n")
    with pytest.raises(PolicyRefused) as refused:
        OpaSidecar(opa_bin, policies, tmp_path / "opa").start()
    assert refused.value.reasons == ("policy_package_reserved",)
    assert "sessionstate/mine/mine.rego declares package sessionstate.batch" in str(refused.value)


def test_a_set_that_decides_batches_its_own_way_is_refused(opa_bin: str, tmp_path: Path) -> None:
    policies = _copy(tmp_path)
    mine = policies / "sessionstate" / "batch" / "batch.rego"
    mine.parent.mkdir()
    mine.write_text('package sessionstate.batch\n\ndecision := {"0": {"allow": true}}\n')
    with pytest.raises(PolicySourceError):  # it does not even compile beside the service's
        OpaSidecar(opa_bin, policies, tmp_path / "opa").start()


def test_a_signed_bundle_carries_the_module_and_is_asked_in_batches(
    opa_bin: str, tmp_path: Path
) -> None:
    private, public = Keys(tmp_path / "keys").pair("team")
    out = tmp_path / "bundle.tar.gz"
    build_signed_bundle(opa_bin, POLICY_DIR, private, "RS256", out, serial=1)
    with tarfile.open(out) as archive:
        member = archive.extractfile(LIVE_BATCH_MODULE_PATH)
        assert member is not None and member.read() == live_batch_module()
    sidecar = OpaSidecar(
        opa_bin, POLICY_DIR, tmp_path / "opa", bundle_file=out, verification_key=public
    )
    traces, client = _grouped_reads(sidecar)
    assert all(trace.allow for trace in traces)
    assert client.groups is not None and client.groups.batches > 0
    assert any(trace.batch is not None for trace in traces)


def test_an_authorization_policy_without_the_batch_is_asked_one_by_one(
    opa_bin: str, tmp_path: Path
) -> None:
    policies = _copy(tmp_path)
    authz = policies / AUTHZ
    without = authz.read_text().replace('\t"batch",\n', "")
    assert '"batch"' not in without
    authz.write_text(without)
    sidecar = OpaSidecar(opa_bin, policies, tmp_path / "opa", listen="tcp")  # authz on TCP
    traces, client = _grouped_reads(sidecar)
    assert all(trace.allow and trace.batch is None for trace in traces)
    assert client.groups is not None and client.groups.fallbacks >= 1
