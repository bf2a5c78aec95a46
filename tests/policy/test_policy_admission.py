"""Every decision package defined, or nothing loads (`service.policy.admission`).

A policy set that compiles but leaves a decision package undefined (the `decison := …` typo),
or answers something other than `{allow, reasons}`, is refused wherever a set would be
served or signed: at start, by `sessionstate policy reload`, SIGHUP, a signed bundle's
reload, for the shadow set, as an impact candidate, and by `sessionstate policy build`. The
old revision keeps deciding, and the refusal names the package. What the representative
inputs do not reach (a tenant no file names) answers 503 `policy_decision_undefined` at
request time, for that tenant's requests only. Real OPA, real `sessionstate serve`.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from service.auth.tokens import mint_token
from service.policy.admission import admit
from service.policy.bundle import load_bundle
from service.policy.client import PolicyClient
from service.policy.reload import STATUS_FILE, PolicyStatus, read_status
from service.policy.sidecar import OpaSidecar
from service.policy.source import PolicyRefused
from tests.policy.test_signed_bundles import Keys
from tests.support.factories import state_input
from tests.support.live import JWT_SECRET
from tests.support.paths import POLICY_DIR
from tests.support.policy_inputs import allowed_input
from tests.support.served import ROOT, Served, start

WRITE = Path("sessionstate") / "write" / "write.rego"
READ = Path("sessionstate") / "read" / "read.rego"
SETTINGS = Path("sessionstate") / "tenants" / "data.json"
DECISION = 'decision := {"allow": allow, "reasons": sort(reasons)}'
UNSEEN = "tenant-unseen"  # a tenant no policy file and no representative input names


def _copy(tmp: Path, name: str = "policies") -> Path:
    policies = tmp / name
    shutil.copytree(POLICY_DIR, policies)
    return policies


def _edit(policies: Path, file: Path, old: str, new: str) -> None:
    path = policies / file
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def _typo(policies: Path) -> None:
    _edit(policies, WRITE, "\ndecision :=", "\ndecison :=")


def _untypo(policies: Path) -> None:
    _edit(policies, WRITE, "\ndecison :=", "\ndecision :=")


def _reads_undefined_for(policies: Path, tenant: str) -> None:
    _edit(policies, READ, DECISION, f'{DECISION} if input.target.tenant_id != "{tenant}"')


def _settings_for(policies: Path, tenant: str) -> None:
    (policies / SETTINGS).write_text(json.dumps({"settings": [{"tenant_id": tenant}]}))


def _eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


# --- the check itself ----------------------------------------------------------------------


def test_the_default_policies_are_admitted(opa_bin: str) -> None:
    assert admit(opa_bin, load_bundle(POLICY_DIR), POLICY_DIR) == []


def test_an_undefined_decision_is_refused_naming_the_package(opa_bin: str, tmp_path: Path) -> None:
    policies = _copy(tmp_path)
    _typo(policies)
    (refusal,) = admit(opa_bin, load_bundle(policies), policies)
    assert refusal.reason == "policy_decision_undefined"
    assert refusal.detail.startswith("sessionstate.write: `decision` is undefined for ")
    assert "action preview, write" in refusal.detail


def test_a_decision_of_another_shape_is_refused_saying_what_is_missing(
    opa_bin: str, tmp_path: Path
) -> None:
    policies = _copy(tmp_path)
    _edit(policies, READ, DECISION, 'decision := {"allow": allow, "reasons": "none"}')
    (refusal,) = admit(opa_bin, load_bundle(policies), policies)
    assert refusal.detail.startswith(
        "sessionstate.read: `decision.reasons` is not an array of strings for "
    )


def test_a_candidate_reaches_no_host_while_it_is_checked(opa_bin: str, tmp_path: Path) -> None:
    """The admission evaluates a set nothing has vouched for yet (a signed bundle's signature
    is OPA's to check later): its `http.send` must reach nobody."""
    asked: list[str] = []

    class Listener(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.end_headers()

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Listener) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/leak"
        policies = _copy(tmp_path)
        probe = f'http.send({{"method": "GET", "url": "{url}", "raise_error": false}}).status_code'
        _edit(policies, WRITE, DECISION, f"{DECISION} if {probe} == 200")
        refusals = admit(opa_bin, load_bundle(policies), policies)
        server.shutdown()
    assert asked == []
    assert [refusal.reason for refusal in refusals] == ["policy_decision_undefined"]


def test_a_tenant_the_settings_name_is_among_the_representative_inputs(
    opa_bin: str, tmp_path: Path
) -> None:
    policies = _copy(tmp_path)
    _reads_undefined_for(policies, UNSEEN)
    assert admit(opa_bin, load_bundle(policies), policies) == []  # no file names it
    _settings_for(policies, UNSEEN)
    (refusal,) = admit(opa_bin, load_bundle(policies), policies)
    assert refusal.detail.startswith("sessionstate.read: `decision` is undefined for ")
    assert f"target tenant {UNSEEN})" in refusal.detail


# --- where a set would be served -----------------------------------------------------------


def test_a_sidecar_reload_refuses_it_and_the_old_revision_decides(
    opa_bin: str, tmp_path: Path
) -> None:
    policies = _copy(tmp_path)
    sidecar = OpaSidecar(opa_bin, policies, tmp_path / "opa")
    sidecar.start()
    client = PolicyClient(sidecar.url, sidecar.token, timeout=2.0)
    try:
        good = sidecar.policies.served.revision
        _typo(policies)
        refused = sidecar.reload_policies()
        assert refused.outcome == "invalid" and refused.revision == good and refused.deciding
        assert refused.source_valid is False
        assert refused.reasons == ["policy_decision_undefined"]
        assert refused.errors[0].startswith("policy_decision_undefined: sessionstate.write: ")
        assert sidecar.policies.refusals == ("policy_decision_undefined",)
        assert read_status(sidecar.status_path) == refused
        kept = client.decide(allowed_input("write"))
        assert kept.allow and kept.policy_revision == good
    finally:
        client.close()
        sidecar.stop()


def test_the_start_refuses_it_in_one_line(opa_bin: str, tmp_path: Path) -> None:
    policies = _copy(tmp_path)
    _typo(policies)
    with pytest.raises(PolicyRefused) as refused:
        OpaSidecar(opa_bin, policies, tmp_path / "opa").start()
    assert refused.value.reasons == ("policy_decision_undefined",)
    started = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve"],
        env={
            **os.environ,
            "SESSIONSTATE_DATA_DIR": str(tmp_path / "var"),
            "SESSIONSTATE_OPA_BIN": opa_bin,
            "SESSIONSTATE_POLICY_DIR": str(policies),
            "SESSIONSTATE_PORT": "0",  # refused before it serves: never 8080, which may be taken
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 2
    (line,) = [line for line in started.stderr.splitlines() if line.startswith("sessionstate:")]
    assert "policy_decision_undefined: sessionstate.write: `decision` is undefined" in line


def test_policy_build_signs_nothing(opa_bin: str, tmp_path: Path) -> None:
    policies = _copy(tmp_path)
    _typo(policies)
    key = Keys(tmp_path / "keys").pair("team")[0]
    out = tmp_path / "bundle.tar.gz"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "policy",
            "build",
            "--signing-key",
            str(key),
            "--serial",
            "1",
            "--out",
            str(out),
        ],
        env={
            **os.environ,
            "SESSIONSTATE_OPA_BIN": opa_bin,
            "SESSIONSTATE_POLICY_DIR": str(policies),
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 1, built.stderr
    assert "policy_decision_undefined: sessionstate.write" in built.stderr
    assert built.stdout == "" and not out.exists()


def _signed(opa_bin: str, policies: Path, key: Path, out: Path, tmp: Path, serial: int) -> Path:
    """The directory signed by `opa build` itself, with no admission: as a bundle could be made
    without `sessionstate policy build`."""
    stage = tmp / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    load_bundle(policies).write_to(stage, serial=serial)
    subprocess.run(
        [
            opa_bin,
            "build",
            "--bundle",
            ".",
            "--signing-key",
            str(key),
            "--signing-alg",
            "RS256",
            "--output",
            str(out),
        ],
        cwd=stage,
        check=True,
        capture_output=True,
    )
    return out


def test_a_signed_bundle_is_refused_at_start_and_at_a_reload(opa_bin: str, tmp_path: Path) -> None:
    private, public = Keys(tmp_path / "keys").pair("team")
    policies = _copy(tmp_path)
    live = _signed(opa_bin, policies, private, tmp_path / "live.tar.gz", tmp_path, serial=1)
    _typo(policies)
    typo = _signed(opa_bin, policies, private, tmp_path / "typo.tar.gz", tmp_path, serial=2)

    def sidecar_for(bundle: Path, work: str) -> OpaSidecar:
        return OpaSidecar(
            opa_bin, POLICY_DIR, tmp_path / work, bundle_file=bundle, verification_key=public
        )

    with pytest.raises(PolicyRefused):
        sidecar_for(typo, "opa-typo").start()

    sidecar = sidecar_for(live, "opa")
    sidecar.start()
    try:
        good = sidecar.policies.served.revision
        shutil.copyfile(typo, live)
        refused = sidecar.reload_policies()
        assert refused.outcome == "invalid" and refused.revision == good and refused.deciding
        assert refused.reasons == ["policy_decision_undefined"]
        assert sidecar.signed is not None and sidecar.signed.rejection is None  # never offered
        assert sidecar.deciding_revision() == good
    finally:
        sidecar.stop()


def test_the_shadow_set_and_an_impact_candidate_are_refused(opa_bin: str, tmp_path: Path) -> None:
    candidate = _copy(tmp_path, "candidate")
    _typo(candidate)
    export = tmp_path / "none.ndjson"
    export.write_text("")
    impact = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "policy",
            "impact",
            str(candidate),
            "--decisions",
            str(export),
        ],
        env={**os.environ, "SESSIONSTATE_OPA_BIN": opa_bin},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert impact.returncode == 2
    assert "policy_decision_undefined: sessionstate.write" in impact.stderr
    shadow = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve"],
        env={
            **os.environ,
            "SESSIONSTATE_DATA_DIR": str(tmp_path / "var"),
            "SESSIONSTATE_OPA_BIN": opa_bin,
            "SESSIONSTATE_SHADOW_POLICIES": str(candidate),
            "SESSIONSTATE_PORT": "0",  # refused before it serves: never 8080, which may be taken
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shadow.returncode == 2
    assert "policy_decision_undefined: sessionstate.write" in shadow.stderr


# --- a served process: reload, SIGHUP, readyz, the log, request time --------------------------


@pytest.fixture
def served_copy(opa_bin: str, tmp_path: Path) -> Iterator[tuple[Served, Path]]:
    policies = _copy(tmp_path)
    running = start(opa_bin, tmp_path / "var", tmp_path, {"SESSIONSTATE_POLICY_DIR": str(policies)})
    yield running, policies
    if running.process.poll() is None:
        running.process.send_signal(signal.SIGTERM)
        running.process.wait(20)


def _token(tenant: str) -> str:
    return mint_token(
        JWT_SECRET.encode(),
        sub="s",
        roles=["model-service"],
        ttl_seconds=600,
        tenant=tenant,
        workspace="ws-1",
        session="chat-1",
    )


def _session(served: Served, tenant: str = "tenant-a") -> str:
    return f"{served.url}/v1/tenants/{tenant}/workspaces/ws-1/sessions/chat-1"


def _preview(served: Served) -> requests.Response:
    return requests.post(
        _session(served) + "/state/preview",
        json=state_input(),
        headers={"Authorization": f"Bearer {_token('tenant-a')}"},
        timeout=10,
    )


def _read(served: Served, tenant: str) -> requests.Response:
    return requests.get(
        _session(served, tenant) + "/state",
        headers={"Authorization": f"Bearer {_token(tenant)}"},
        timeout=10,
    )


def _reload(served: Served) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "policy", "reload"],
        env={**os.environ, "SESSIONSTATE_DATA_DIR": str(served.data_dir)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_typo_through_reload_and_sighup(served_copy: tuple[Served, Path]) -> None:
    served, policies = served_copy
    revision = _preview(served).json()["decision"]["policy_revision"]
    _typo(policies)
    reloaded = _reload(served)
    assert reloaded.returncode == 1
    status = PolicyStatus.model_validate_json(reloaded.stdout)
    assert (status.outcome, status.revision, status.deciding) == ("invalid", revision, True)
    assert status.reasons == ["policy_decision_undefined"]
    assert status.errors[0].startswith("policy_decision_undefined: sessionstate.write: ")
    ready = requests.get(served.url + "/readyz", timeout=5).json()
    assert ready["ready"] is True and ready["policy_revision"] == revision
    assert ready["warnings"] == ["policy_source_invalid", "policy_decision_undefined"]
    preview = _preview(served)  # the old revision decides
    assert preview.status_code == 200
    assert preview.json()["decision"]["policy_revision"] == revision
    rejected = [
        json.loads(line)
        for line in served.log.read_text().splitlines()
        if '"event":"policy_reload_rejected"' in line
    ]
    assert rejected[-1]["reasons"] == ["policy_decision_undefined"]
    assert "sessionstate.write" in rejected[-1]["errors"][0]

    _untypo(policies)
    assert _reload(served).returncode == 0
    assert requests.get(served.url + "/readyz", timeout=5).json()["warnings"] == []
    before = read_status(served.data_dir / STATUS_FILE)
    assert before is not None
    _typo(policies)
    served.process.send_signal(signal.SIGHUP)

    def reported() -> bool:
        after = read_status(served.data_dir / STATUS_FILE)
        return after is not None and after.generation > before.generation

    _eventually(reported, "the SIGHUP reload reports")
    after = read_status(served.data_dir / STATUS_FILE)
    assert after is not None and after.outcome == "invalid"
    assert after.reasons == ["policy_decision_undefined"] and after.revision == revision
    assert _preview(served).status_code == 200


def test_a_decision_undefined_for_one_tenant_answers_503_for_that_tenant_only(
    served_copy: tuple[Served, Path],
) -> None:
    served, policies = served_copy
    _reads_undefined_for(policies, UNSEEN)
    reloaded = _reload(served)  # no file names the tenant: the admission cannot see it
    assert reloaded.returncode == 0, reloaded.stdout
    revision = PolicyStatus.model_validate_json(reloaded.stdout).revision
    assert _read(served, "tenant-a").status_code == 404  # allowed; nothing stored
    undefined = _read(served, UNSEEN)
    assert undefined.status_code == 503
    body = undefined.json()
    assert body["reason"] == "policy_decision_undefined"
    assert "did not answer in time" not in body["detail"]
    assert body["decision"]["policy_revision"] == revision
    assert body["decision"]["allow"] is False
    assert body["decision"]["reasons"] == ["policy_decision_undefined"]
    assert undefined.headers["Retry-After"] == "60"

    _settings_for(policies, UNSEEN)  # now a file names it: the reload is refused
    refused = _reload(served)
    assert refused.returncode == 1
    status = PolicyStatus.model_validate_json(refused.stdout)
    assert status.reasons == ["policy_decision_undefined"] and status.revision == revision
    assert f"target tenant {UNSEEN})" in status.errors[0]
