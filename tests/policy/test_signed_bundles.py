"""Signed policy bundles: OPA activates only a bundle whose signature verifies.

Real OPA sidecars serving bundle files built by `sessionstate policy build`
(OPA's own `opa build --signing-key`), and real `sessionstate serve`
processes: a signed bundle activates; an unsigned, a tampered and a wrongly
signed one never do, at start (the start fails, saying why) or at a reload
(OPA keeps deciding with the last good bundle, and `/readyz`, the metrics and
the reload's outcome say so).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from service.policy.client import PolicyClient
from service.policy.sidecar import OpaSidecar, SidecarError
from service.policy.signed_bundle import SigningAlg, build_signed_bundle, read_bundle_file
from tests.support.live import JWT_SECRET
from tests.support.paths import POLICY_DIR
from tests.support.policy_inputs import allowed_input
from tests.support.served import ROOT, start

READ_RULE = 'reasons contains "action_not_supported" if input.action != "read"'
FROZEN_RULE = READ_RULE + '\n\nreasons contains "reads_frozen_for_audit" if input.action == "read"'
SESSION = "/v1/tenants/tenant-a/workspaces/ws-1/sessions/chat-1"


class Keys:
    """Key pairs (RS256 and ES256) and an HS256 secret, in files as an operator keeps them."""

    def __init__(self, where: Path) -> None:
        where.mkdir(parents=True, exist_ok=True)
        self.where = where

    def pair(self, name: str, alg: SigningAlg = "RS256") -> tuple[Path, Path]:
        key = (
            rsa.generate_private_key(public_exponent=65537, key_size=2048)
            if alg == "RS256"
            else ec.generate_private_key(ec.SECP256R1())
        )
        private = self.where / f"{name}.pem"
        public = self.where / f"{name}.pub.pem"
        private.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        public.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return private, public


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def signing(keys: Keys) -> tuple[Path, Path]:
    return keys.pair("security-team")


def policies_copy(tmp: Path, *, frozen: bool = False) -> Path:
    policies = tmp / "policies"
    shutil.copytree(POLICY_DIR, policies)
    if frozen:
        path = policies / "sessionstate" / "read" / "read.rego"
        path.write_text(path.read_text().replace(READ_RULE, FROZEN_RULE))
    return policies


def build(
    opa_bin: str,
    policies: Path,
    key: Path,
    out: Path,
    alg: SigningAlg = "RS256",
    *,
    serial: int = 1,
) -> Path:
    build_signed_bundle(opa_bin, policies, key, alg, out, serial=serial)
    return out


def unsigned(opa_bin: str, policies: Path, out: Path, tmp: Path, *, serial: int = 1) -> Path:
    """The same files, built without a signature."""
    signed = build(opa_bin, policies, _throwaway_key(tmp), tmp / "throwaway.tar.gz", serial=serial)
    return repack(signed, out, drop=".signatures.json")


def tampered(signed: Path, out: Path) -> Path:
    """The signed bundle with one policy changed after signing; its manifest kept as is."""
    return repack(
        signed,
        out,
        edit=("sessionstate/read/read.rego", lambda text: text.replace(READ_RULE, FROZEN_RULE)),
    )


def repack(
    source: Path,
    out: Path,
    *,
    drop: str | None = None,
    edit: tuple[str, object] | None = None,
) -> Path:
    buffer = io.BytesIO()
    with (
        tarfile.open(source, "r:gz") as original,
        tarfile.open(fileobj=buffer, mode="w:gz") as copy,
    ):
        for member in original.getmembers():
            name = member.name.lstrip("/")
            if name == drop:
                continue
            handle = original.extractfile(member)
            assert handle is not None
            content = handle.read()
            if edit is not None and name == edit[0]:
                change = edit[1]
                assert callable(change)
                changed = change(content.decode())
                assert changed != content.decode()
                content = changed.encode()
            member.size = len(content)
            copy.addfile(member, io.BytesIO(content))
    out.write_bytes(buffer.getvalue())
    return out


def _throwaway_key(tmp: Path) -> Path:
    return Keys(tmp / "throwaway").pair("throwaway")[0]


def sidecar_for(
    opa_bin: str, bundle: Path, public: Path, tmp: Path, alg: SigningAlg = "RS256"
) -> OpaSidecar:
    return OpaSidecar(
        opa_bin,
        POLICY_DIR,
        tmp / "opa",
        bundle_file=bundle,
        verification_key=public,
        verification_alg=alg,
    )


def read_decision(sidecar: OpaSidecar) -> tuple[bool, str]:
    client = PolicyClient(sidecar.url, sidecar.token, timeout=2.0)
    try:
        trace = client.decide(allowed_input("read"))
    finally:
        client.close()
    return trace.allow, trace.policy_revision


# --- the sidecar, at start -------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["RS256", "ES256", "HS256"])
def test_a_signed_bundle_activates(
    opa_bin: str, keys: Keys, tmp_path: Path, alg: SigningAlg
) -> None:
    if alg == "HS256":
        private = public = keys.where / "hs256.secret"
        private.write_text("a-shared-secret-of-the-security-team-0123456789")
    else:
        private, public = keys.pair(f"team-{alg}", alg)
    policies = policies_copy(tmp_path)
    bundle = build(opa_bin, policies, private, tmp_path / "bundle.tar.gz", alg)
    sidecar = sidecar_for(opa_bin, bundle, public, tmp_path, alg)
    sidecar.start()
    try:
        from service.policy.bundle import load_bundle

        assert read_decision(sidecar) == (True, load_bundle(policies).revision)
        assert sidecar.policies.valid
    finally:
        sidecar.stop()


@pytest.mark.parametrize("kind", ["unsigned", "tampered", "wrongly signed"])
def test_a_bad_bundle_stops_the_start_saying_why(
    opa_bin: str, keys: Keys, signing: tuple[Path, Path], tmp_path: Path, kind: str
) -> None:
    private, public = signing
    policies = policies_copy(tmp_path)
    good = build(opa_bin, policies, private, tmp_path / "good.tar.gz")
    bad = {
        "unsigned": lambda: unsigned(opa_bin, policies, tmp_path / "bad.tar.gz", tmp_path),
        "tampered": lambda: tampered(good, tmp_path / "bad.tar.gz"),
        "wrongly signed": lambda: build(
            opa_bin, policies, keys.pair("intruder")[0], tmp_path / "bad.tar.gz"
        ),
    }[kind]()
    sidecar = sidecar_for(opa_bin, bad, public, tmp_path)
    with pytest.raises(SidecarError) as refused:
        sidecar.start()
    message = str(refused.value)
    assert "OPA did not activate the policy bundle" in message
    assert "SESSIONSTATE_POLICY_VERIFICATION_KEY" in message
    expected = {
        "unsigned": "missing .signatures.json",
        "tampered": "digest mismatch",
        "wrongly signed": "verification error",
    }[kind]
    assert expected in message
    assert sidecar.pid is None or sidecar._process is None or sidecar._process.poll() is not None


# --- the sidecar, at a reload ----------------------------------------------------------------


@pytest.fixture
def running(
    opa_bin: str, signing: tuple[Path, Path], tmp_path: Path
) -> Iterator[tuple[OpaSidecar, Path]]:
    private, public = signing
    bundle = build(opa_bin, policies_copy(tmp_path), private, tmp_path / "live.tar.gz")
    sidecar = sidecar_for(opa_bin, bundle, public, tmp_path)
    sidecar.start()
    yield sidecar, bundle
    sidecar.stop()


@pytest.mark.parametrize("kind", ["unsigned", "tampered", "wrongly signed"])
def test_a_bad_bundle_at_a_reload_keeps_the_last_good_one(
    opa_bin: str,
    keys: Keys,
    signing: tuple[Path, Path],
    running: tuple[OpaSidecar, Path],
    tmp_path: Path,
    kind: str,
) -> None:
    sidecar, bundle = running
    good_revision = read_decision(sidecar)[1]
    frozen = policies_copy(tmp_path / "edit", frozen=True)
    signed_frozen = build(opa_bin, frozen, signing[0], tmp_path / "frozen.tar.gz", serial=2)
    bad = {
        "unsigned": lambda: unsigned(opa_bin, frozen, tmp_path / "bad.tar.gz", tmp_path, serial=2),
        "tampered": lambda: tampered(bundle, tmp_path / "bad.tar.gz"),
        "wrongly signed": lambda: build(
            opa_bin, frozen, keys.pair("intruder")[0], tmp_path / "bad.tar.gz", serial=2
        ),
    }[kind]()
    shutil.copyfile(bad, bundle)
    status = sidecar.reload_policies()
    assert (status.outcome, status.revision, status.source_valid) == (
        "invalid",
        good_revision,
        False,
    )
    assert status.deciding
    assert status.errors and status.errors[0]
    assert status.reason == "policy_bundle_rejected"
    assert read_decision(sidecar) == (True, good_revision), "the last good bundle decides"
    assert sidecar.signed is not None and sidecar.signed.rejections == 1
    assert sidecar.signed.rollbacks == 0
    # The rightly signed edit then loads, and the refusal is over.
    shutil.copyfile(signed_frozen, bundle)
    loaded = sidecar.reload_policies()
    assert (loaded.outcome, loaded.source_valid, loaded.deciding) == ("loaded", True, True)
    allow, revision = read_decision(sidecar)
    assert (allow, revision) == (False, loaded.revision) and revision != good_revision
    assert sidecar.signed.rejection is None


def test_an_unchanged_bundle_reloads_as_unchanged(running: tuple[OpaSidecar, Path]) -> None:
    sidecar, _ = running
    assert sidecar.reload_policies().outcome == "unchanged"


# --- `sessionstate policy build` ---------------------------------------------------------------


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_policy_build_prints_what_it_built(
    opa_bin: str, signing: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "bundle.tar.gz"
    env = {"SESSIONSTATE_OPA_BIN": opa_bin, "SESSIONSTATE_POLICY_DIR": str(POLICY_DIR)}
    done = cli(
        "policy",
        "build",
        "--signing-key",
        str(signing[0]),
        "--serial",
        "7",
        "--out",
        str(out),
        env=env,
    )
    assert done.returncode == 0, done.stderr
    from service.policy.bundle import load_bundle

    assert json.loads(done.stdout) == {
        "out": str(out),
        "revision": load_bundle(POLICY_DIR).revision,
        "serial": 7,
        "signing_alg": "RS256",
    }
    with tarfile.open(out, "r:gz") as archive:
        names = sorted(member.name.lstrip("/") for member in archive.getmembers())
        data = archive.extractfile("/data.json")
        assert data is not None
        # `opa build` merges the data documents (the tenant settings) into one, at the root.
        assert json.load(data) == {"sessionstate": {"tenants": {"settings": []}}}
        manifest = archive.extractfile("/.manifest")
        assert manifest is not None
        assert json.load(manifest)["metadata"] == {"sessionstate": {"serial": 7}}
    assert read_bundle_file(out).serial == 7
    assert ".signatures.json" in names
    assert not any(name.endswith("_test.rego") for name in names)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--signing-key", "/nonexistent/key.pem"), "--signing-key names no readable file"),
        (("--signing-key", "KEY", "--signing-alg", "ES256"), "refused to sign with that key"),
        (("--signing-key", "KEY", "--signing-alg", "none"), "invalid choice"),
        (("--serial", "1"), "--signing-key"),
        (("--signing-key", "KEY", "--serial", "0"), "must be 1 or more"),
        (("--signing-key", "KEY", "--no-serial"), "--serial"),
    ],
)
def test_policy_build_refuses_bad_usage_with_exit_2(
    opa_bin: str, signing: tuple[Path, Path], tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    args = tuple(str(signing[0]) if arg == "KEY" else arg for arg in args)
    if "--no-serial" in args:
        args = tuple(arg for arg in args if arg != "--no-serial")
    elif "--serial" not in args:
        args = (*args, "--serial", "1")
    env = {"SESSIONSTATE_OPA_BIN": opa_bin}
    done = cli("policy", "build", *args, "--out", str(tmp_path / "b.tar.gz"), env=env)
    assert done.returncode == 2
    assert says in done.stderr
    assert "BEGIN" not in done.stderr, "never a key"
    assert not (tmp_path / "b.tar.gz").exists()


def test_policy_build_refuses_policies_that_do_not_compile(
    opa_bin: str, signing: tuple[Path, Path], tmp_path: Path
) -> None:
    policies = policies_copy(tmp_path)
    path = policies / "sessionstate" / "read" / "read.rego"
    path.write_text(path.read_text().replace("decision :=", "decision :=:= {"))
    env = {"SESSIONSTATE_OPA_BIN": opa_bin, "SESSIONSTATE_POLICY_DIR": str(policies)}
    key = str(signing[0])
    done = cli(
        "policy",
        "build",
        "--signing-key",
        key,
        "--serial",
        "1",
        "--out",
        str(tmp_path / "b"),
        env=env,
    )
    assert done.returncode == 2
    assert "read.rego" in done.stderr


# --- `sessionstate serve` ----------------------------------------------------------------------


def serve(opa_bin: str, tmp: Path, settings: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`sessionstate serve` on a fresh data dir with these settings, run to its end."""
    return cli(
        "serve",
        env={
            "SESSIONSTATE_DATA_DIR": str(tmp / "var"),
            "SESSIONSTATE_PORT": "0",
            "SESSIONSTATE_JWT_SECRET": JWT_SECRET,
            "SESSIONSTATE_OPA_BIN": opa_bin,
            **settings,
        },
    )


def serve_env(bundle: Path, public: Path) -> dict[str, str]:
    return {
        "SESSIONSTATE_POLICY_BUNDLE": str(bundle),
        "SESSIONSTATE_POLICY_VERIFICATION_KEY": str(public),
    }


def test_serve_refuses_to_start_on_a_wrongly_signed_bundle(
    opa_bin: str, keys: Keys, signing: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle = build(opa_bin, policies_copy(tmp_path), keys.pair("intruder")[0], tmp_path / "b.tgz")
    done = serve(opa_bin, tmp_path, serve_env(bundle, signing[1]))
    assert done.returncode == 2, done.stderr
    assert "OPA did not activate the policy bundle" in done.stderr
    assert "verification error" in done.stderr


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"SESSIONSTATE_POLICY_BUNDLE": "B"}, "SESSIONSTATE_POLICY_VERIFICATION_KEY"),
        ({"SESSIONSTATE_POLICY_VERIFICATION_KEY": "K"}, "SESSIONSTATE_POLICY_BUNDLE"),
        (
            {
                "SESSIONSTATE_POLICY_BUNDLE": "/nonexistent.tar.gz",
                "SESSIONSTATE_POLICY_VERIFICATION_KEY": "K",
            },
            "SESSIONSTATE_POLICY_BUNDLE names no readable file",
        ),
    ],
)
def test_serve_names_an_incomplete_signing_setup(
    opa_bin: str,
    signing: tuple[Path, Path],
    tmp_path: Path,
    settings: dict[str, str],
    says: str,
) -> None:
    bundle = tmp_path / "b.tar.gz"
    bundle.write_bytes(b"")
    values = {
        name: str(bundle) if value == "B" else str(signing[1]) if value == "K" else value
        for name, value in settings.items()
    }
    done = serve(opa_bin, tmp_path, values)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr


def test_served_bad_bundle_at_reload_keeps_deciding_and_readyz_and_metrics_say_so(
    opa_bin: str, keys: Keys, signing: tuple[Path, Path], tmp_path: Path
) -> None:
    private, public = signing
    policies = policies_copy(tmp_path)
    live = tmp_path / "live.tar.gz"
    build(opa_bin, policies, private, live)
    served = start(opa_bin, tmp_path / "var", tmp_path, serve_env(live, public))
    try:
        ready = requests.get(served.url + "/readyz", timeout=5).json()
        good = ready["policy_revision"]
        assert ready["warnings"] == [] and ready["policy_source_valid"] is True
        # An intruder's bundle of frozen reads replaces the file, and a reload is asked for.
        frozen = policies_copy(tmp_path / "edit", frozen=True)
        build(opa_bin, frozen, keys.pair("intruder")[0], live, serial=2)
        env = {"SESSIONSTATE_DATA_DIR": str(served.data_dir)}
        done = cli("policy", "reload", env=env)
        assert done.returncode == 1, done.stderr
        outcome = json.loads(done.stdout)
        assert (outcome["outcome"], outcome["revision"]) == ("invalid", good)
        assert "verification error" in outcome["errors"][0]
        assert outcome["reason"] == "policy_bundle_rejected"
        # Reads are still decided by the last good bundle.
        from service.auth.tokens import mint_token

        token = mint_token(
            JWT_SECRET.encode(),
            sub="svc-1",
            roles=["model-service"],
            tenant="tenant-a",
            workspace="ws-1",
            session="chat-1",
            ttl_seconds=600,
        )
        read = requests.get(
            served.url + SESSION + "/state", headers={"Authorization": f"Bearer {token}"}, timeout=5
        )
        assert read.status_code == 404, read.text  # allowed (nothing stored), not frozen
        ready = requests.get(served.url + "/readyz", timeout=5)
        assert ready.status_code == 200
        body = ready.json()
        assert body["policy_revision"] == good
        assert body["warnings"] == ["policy_source_invalid", "policy_bundle_rejected"]
        assert body["policy_source_valid"] is False
        metrics = requests.get(served.url + "/metrics", timeout=5).text
        assert "sessionstate_policy_bundle_rejected_total 1.0" in metrics
        assert "sessionstate_policy_source_valid 0.0" in metrics
    finally:
        served.process.terminate()
        served.process.wait(20)
