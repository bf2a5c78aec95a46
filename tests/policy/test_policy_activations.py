"""Every activation of a policy set is an entry of the decision log's `~system` chain: the
start and each reload, with the revision, the previous one, how, who (an operator a reload's
token names, else `system`), a signed bundle's signer key id and the commit the manifest
names. Operators verify that chain offline as any other; an auditor of a tenant sees the
activations beside each revision in `GET /v1/decisions/policy-revisions`.

End to end over real `sessionstate serve` processes with their OPA sidecar.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from service.auth.tokens import mint_token
from service.policy.activation import Activated, signer_key_id
from service.policy.bundle import load_bundle
from service.policy.reload import STATUS_FILE, read_status
from service.policy.sidecar import OpaSidecar
from service.policy.signed_bundle import build_signed_bundle
from store.chain.head import SYSTEM_CHAIN
from store.chain.keys import is_chain_name
from store.scope import is_scope_id
from tests.runtime.test_deployment import load_manifest_tool
from tests.support.live import JWT_SECRET
from tests.support.paths import POLICY_DIR
from tests.support.served import ROOT, Served, start

REVISIONS = "/v1/decisions/policy-revisions"
READ_REGO = Path("sessionstate") / "read" / "read.rego"
COMMIT = "v1.4.0-3-g1a2b3c4"


def _auditor() -> str:
    return mint_token(
        JWT_SECRET.encode(), sub="aud-1", roles=["auditor"], tenant="tenant-a", ttl_seconds=600
    )


def _cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env={  # the service's own settings: its JWT secret mints `--operator`'s token
            **os.environ,
            "SESSIONSTATE_DATA_DIR": str(data_dir),
            "SESSIONSTATE_JWT_SECRET": JWT_SECRET,
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _activations(served: Served) -> dict[str, list[dict[str, Any]]]:
    """Each listed revision's activations, as an auditor of tenant-a sees them."""
    answer = requests.get(
        served.url + REVISIONS, headers={"Authorization": f"Bearer {_auditor()}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    return {r["policy_revision"]: r["activations"] for r in answer.json()["revisions"]}


def _edit(policies: Path, note: str) -> None:
    """An edit that changes no decision, but the revision."""
    rego = policies / READ_REGO
    rego.write_text(rego.read_text() + f"\n# {note}\n")


def _stop(served: Served) -> None:
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(30) == 0


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    """A copy of the policies whose manifest names the commit they came from."""
    copy = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, copy)
    (copy / ".manifest").write_text(load_manifest_tool().expected_manifest(copy, COMMIT))
    return copy


@pytest.fixture
def serving(opa_bin: str, tmp_path: Path) -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for served in started:
        if served.process.poll() is None:
            os.killpg(served.process.pid, signal.SIGKILL)
            served.process.wait()


def test_a_start_and_an_operators_reload_are_on_the_system_chain_and_in_policy_revisions(
    opa_bin: str, tmp_path: Path, policies: Path, serving: list[Served]
) -> None:
    serving.append(
        served := start(
            opa_bin, tmp_path / "var", tmp_path, {"SESSIONSTATE_POLICY_DIR": str(policies)}
        )
    )
    data_dir = served.data_dir
    first = requests.get(served.url + "/readyz", timeout=10).json()["policy_revision"]

    # A token that names no operator refuses the reload: nothing is read, nothing recorded.
    auditor_token = tmp_path / "auditor.jwt"
    auditor_token.write_text(_auditor())
    _edit(policies, "an edit an auditor asks to reload")
    refused = _cli(data_dir, "policy", "reload", "--token-file", str(auditor_token))
    assert refused.returncode == 1, refused.stderr
    status = json.loads(refused.stdout)
    assert (status["outcome"], status["revision"]) == ("refused", first)
    assert status["errors"] == ["operator token: the token has no operator role"]

    # An operator's reload: the edit goes live, and who asked is recorded.
    reloaded = _cli(data_dir, "policy", "reload", "--operator", "alice")
    assert reloaded.returncode == 0, reloaded.stderr
    second = json.loads(reloaded.stdout)["revision"]
    assert json.loads(reloaded.stdout)["outcome"] == "loaded" and second != first

    listed = _activations(served)
    (started,) = listed[first]
    assert started["how"] == "start" and started["who"] == "system"
    assert started["policy_set"] == "live" and started["previous_revision"] is None
    assert started["commit"] == COMMIT  # the manifest is of these files
    assert started["signer_key_id"] is None  # a policy directory
    (reload,) = listed[second]
    assert (reload["how"], reload["who"], reload["previous_revision"]) == (
        "reload",
        "alice",
        first,
    )
    assert reload["commit"] is None  # the manifest names other files now: no commit claimed
    assert reload["instance"] == started["instance"]
    assert started["at"] < reload["at"]

    _stop(served)
    # Operators verify the chain offline, as any other, and --all-tenants includes it.
    verified = _cli(data_dir, "decisions", "verify", "--tenant", "~system")
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["ok"] is True
    assert json.loads(verified.stdout)["entries"] == 2
    every = _cli(data_dir, "decisions", "verify", "--all-tenants")
    assert every.returncode == 0, every.stderr
    assert json.loads(every.stdout)["chains"]["~system"]["entries"] == 2
    exported = _cli(data_dir, "decisions", "export", "--tenant", "~system")
    assert exported.returncode == 0, exported.stderr
    entries = [json.loads(line)["sessionstate"] for line in exported.stdout.splitlines()]
    assert [e["input"]["kind"] for e in entries] == ["policy_activation"] * 2
    assert [e["decision"]["action"] for e in entries] == ["policy.activate"] * 2
    assert [e["decision"]["policy"] for e in entries] == ["sessionstate/policy_activation"] * 2
    assert [e["decision"]["engine"]["name"] for e in entries] == ["sessionstate"] * 2
    assert [e["input"]["revision"] for e in entries] == [first, second]
    assert [e["actor"]["sub"] for e in entries] == ["system", "alice"]
    no_target = {"tenant_id": None, "workspace_id": None, "session_id": None}
    assert [e["target"] for e in entries] == [no_target, no_target]
    assert entries[1]["decision"]["decision_id"] == reload["decision_id"]

    # The next start is an activation too, after the one this instance made last.
    serving.append(
        again := start(opa_bin, data_dir, tmp_path, {"SESSIONSTATE_POLICY_DIR": str(policies)})
    )
    (restarted,) = [a for a in _activations(again)[second] if a["how"] == "start"]
    assert restarted["previous_revision"] == second


def test_a_bare_sighup_is_named_as_such(
    opa_bin: str, tmp_path: Path, policies: Path, serving: list[Served]
) -> None:
    serving.append(
        served := start(
            opa_bin, tmp_path / "var", tmp_path, {"SESSIONSTATE_POLICY_DIR": str(policies)}
        )
    )
    status_file = served.data_dir / STATUS_FILE
    before = read_status(status_file)
    assert before is not None
    _edit(policies, "reloaded by a bare SIGHUP")
    # `kill -HUP`: no request of `policy reload` beside it.
    os.kill(int((served.data_dir / "sessionstate.pid").read_text()), signal.SIGHUP)
    after = before
    while after is None or after.generation == before.generation:  # the reload is under way
        assert served.process.poll() is None
        time.sleep(0.05)
        after = read_status(status_file)
    assert after.outcome == "loaded"
    (activation,) = _activations(served)[after.revision]
    assert (activation["how"], activation["who"]) == ("sighup", "system")
    assert activation["previous_revision"] == before.revision


def test_the_watcher_names_itself(opa_bin: str, tmp_path: Path, policies: Path) -> None:
    """The sidecar tells of what its watcher loaded (`serve --watch-policies`), as `watcher`."""
    sidecar = OpaSidecar(opa_bin, policies, tmp_path / "opa", watch_policies=True)
    told: list[Activated] = []
    seen = threading.Event()
    sidecar.start()
    try:
        assert sidecar.started_as() == Activated(
            revision=sidecar.policies.served.revision, how="start", commit=COMMIT
        )

        def tell(activated: Activated) -> None:
            told.append(activated)
            seen.set()

        sidecar.on_live = tell
        _edit(policies, "picked up by the watcher")
        assert seen.wait(60)
    finally:
        sidecar.stop()
    (activated,) = told
    assert (activated.how, activated.who, activated.policy_set) == ("watcher", "system", "live")
    assert activated.revision == sidecar.policies.served.revision
    assert activated.commit is None  # the manifest names the files before the edit


def test_a_signed_bundle_names_its_signer_key_and_commit(
    opa_bin: str, tmp_path: Path, policies: Path, serving: list[Served]
) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = tmp_path / "signer.pem", tmp_path / "signer.pub.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    bundle = tmp_path / "bundle.tar.gz"
    built = build_signed_bundle(opa_bin, policies, private, "RS256", bundle, serial=1)
    env = {
        "SESSIONSTATE_POLICY_BUNDLE": str(bundle),
        "SESSIONSTATE_POLICY_VERIFICATION_KEY": str(public),
    }
    serving.append(served := start(opa_bin, tmp_path / "var", tmp_path, env))
    (started,) = _activations(served)[built.revision]
    assert started["signer_key_id"] == "sha256:" + hashlib.sha256(der).hexdigest()
    assert started["signer_key_id"] == signer_key_id(public, "RS256")
    assert started["commit"] == COMMIT  # signed into the bundle's manifest


def test_the_parent_of_workers_records_its_sidecars_activations_on_postgresql(
    postgres_conninfo: str, opa_bin: str, tmp_path: Path, policies: Path, serving: list[Served]
) -> None:
    env = {"SESSIONSTATE_STORE": postgres_conninfo, "SESSIONSTATE_POLICY_DIR": str(policies)}
    serving.append(
        served := start(opa_bin, tmp_path / "var", tmp_path, env, args=("--workers", "2"))
    )
    first = requests.get(served.url + "/readyz", timeout=10).json()["policy_revision"]
    _edit(policies, "reloaded by bob, for two workers")
    reloaded = _cli(served.data_dir, "policy", "reload", "--operator", "bob")
    assert reloaded.returncode == 0, reloaded.stderr
    second = json.loads(reloaded.stdout)["revision"]
    listed = _activations(served)
    assert [(a["how"], a["who"]) for a in listed[first]] == [("start", "system")]
    assert [(a["how"], a["who"], a["previous_revision"]) for a in listed[second]] == [
        ("reload", "bob", first)
    ]
    # PostgreSQL is verified while the service runs.
    every = subprocess.run(
        [sys.executable, "-m", "service.cli", "decisions", "verify", "--all-tenants"],
        env={**os.environ, **env, "SESSIONSTATE_DATA_DIR": str(served.data_dir)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert every.returncode == 0, every.stderr
    assert json.loads(every.stdout)["chains"]["~system"]["entries"] == 2
    _stop(served)


def test_no_tenant_can_be_the_system_chain() -> None:
    assert is_chain_name(SYSTEM_CHAIN) and not is_scope_id(SYSTEM_CHAIN)


def test_the_manifest_tool_records_the_commit_of_a_checkout_and_check_ignores_it(
    tmp_path: Path,
) -> None:
    tool = load_manifest_tool()
    repo = tmp_path / "repo"
    shutil.copytree(POLICY_DIR, repo / "policies")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for step in (["init", "-q"], ["add", "."], ["commit", "-qm", "policies"]):
        subprocess.run([*git, *step], check=True, capture_output=True)
    policies = repo / "policies"
    described = subprocess.run(
        [*git, "describe", "--always", "--dirty"], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert tool.main(["--policy-dir", str(policies)]) == 0  # not asked: left as it was
    assert (policies / ".manifest").read_text() == (POLICY_DIR / ".manifest").read_text()
    assert tool.main(["--policy-dir", str(policies), "--commit"]) == 0
    manifest = json.loads((policies / ".manifest").read_text())
    assert manifest["metadata"] == {"commit": described}  # clean: the manifest was committed
    assert manifest["revision"] == load_bundle(policies).revision
    assert load_bundle(policies).commit == described  # what the sidecar and `policy build` carry
    assert tool.main(["--policy-dir", str(policies), "--check"]) == 0
    _edit(policies, "an edit after the manifest")
    assert tool.main(["--policy-dir", str(policies), "--check"]) == 1
    assert load_bundle(policies).commit is None  # a stale manifest claims no commit
    assert tool.main(["--policy-dir", str(policies), "--commit"]) == 0
    assert json.loads((policies / ".manifest").read_text())["metadata"] == {
        "commit": described + "-dirty"
    }
    outside = tmp_path / "outside"
    shutil.copytree(POLICY_DIR, outside)
    assert tool.main(["--policy-dir", str(outside), "--commit"]) == 0
    assert "metadata" not in json.loads((outside / ".manifest").read_text())
