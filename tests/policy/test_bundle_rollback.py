"""No rollback: a signed bundle older than the newest one activated is refused.

Bundles built by `sessionstate policy build --serial N` (OPA's own `opa build
--signing-key`), served by real OPA sidecars and real `sessionstate serve`
processes: a bundle whose serial is below the highest activated on the
deployment, equal to it with other content, or missing is refused as
`policy_bundle_rollback` at a reload (the newer bundle keeps deciding, and the
reload's outcome, `/readyz`, the metrics and the log say so) and at a restart
(the start fails with one line, exit 2); the highest serial lives in the store,
so replicas sharing it refuse too; `SESSIONSTATE_POLICY_BUNDLE_PIN` naming a
bundle's revision serves it anyway, logged.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
import requests

from service.auth.tokens import mint_token
from service.policy.bundle import load_bundle
from service.policy.rollback import (
    HIGHEST_KEY,
    Highest,
    RollbackGuard,
    record_highest,
    stored_highest,
)
from service.policy.sidecar import OpaSidecar
from service.policy.signed_bundle import read_bundle_file
from store.backends.contract import Lanes
from tests.policy.test_signed_bundles import (
    SESSION,
    Keys,
    build,
    cli,
    policies_copy,
    read_decision,
    repack,
    serve,
    serve_env,
)
from tests.support.live import JWT_SECRET
from tests.support.served import start

ROLLBACK = "policy_bundle_rollback"


@pytest.fixture(scope="module")
def signing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return Keys(tmp_path_factory.mktemp("keys")).pair("security-team")


def unnumbered(opa_bin: str, policies: Path, key: Path, out: Path) -> Path:
    """A bundle signed as a release before serials built it: no serial in its manifest."""
    with tempfile.TemporaryDirectory() as stage:
        load_bundle(policies).write_to(Path(stage))
        subprocess.run(
            [opa_bin, "build", "--bundle", ".", "--signing-key", str(key), "--output", str(out)],
            cwd=stage,
            check=True,
            capture_output=True,
        )
    assert read_bundle_file(out).serial is None
    return out


class Bundles:
    """Bundle N (the default policies: reads allowed) and N+1 (reads frozen), both signed."""

    def __init__(self, opa_bin: str, key: Path, tmp: Path) -> None:
        self.opa_bin, self.key, self.tmp = opa_bin, key, tmp
        self.policies = policies_copy(tmp / "n")
        self.frozen = policies_copy(tmp / "n1", frozen=True)
        self.old = build(opa_bin, self.policies, key, tmp / "n.tar.gz", serial=1)
        self.new = build(opa_bin, self.frozen, key, tmp / "n1.tar.gz", serial=2)
        self.old_revision = read_bundle_file(self.old).revision
        self.new_revision = read_bundle_file(self.new).revision

    def numbered(self, serial: int, name: str) -> Path:
        """The default policies (not the frozen ones) under another serial."""
        return build(self.opa_bin, self.policies, self.key, self.tmp / name, serial=serial)


@pytest.fixture
def bundles(opa_bin: str, signing: tuple[Path, Path], tmp_path: Path) -> Bundles:
    return Bundles(opa_bin, signing[0], tmp_path)


def started(opa_bin: str, bundles: Bundles, public: Path, tmp: Path, pin: str | None) -> OpaSidecar:
    live = tmp / "live.tar.gz"
    shutil.copyfile(bundles.new, live)
    sidecar = OpaSidecar(
        opa_bin,
        bundles.policies,
        tmp / "opa",
        bundle_file=live,
        verification_key=public,
        bundle_pin=pin,
    )
    sidecar.start()
    return sidecar


# --- the sidecar, at a reload ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("older", "its serial 1 is below 2, the highest activated on this deployment"),
        ("same serial, other content", "a different bundle claims the same number"),
        ("no serial", "carries no serial"),
    ],
)
def test_a_rollback_at_a_reload_is_refused_and_the_newer_bundle_keeps_deciding(
    opa_bin: str,
    signing: tuple[Path, Path],
    bundles: Bundles,
    tmp_path: Path,
    kind: str,
    says: str,
) -> None:
    sidecar = started(opa_bin, bundles, signing[1], tmp_path, pin=None)
    try:
        assert read_decision(sidecar) == (False, bundles.new_revision)
        back = {
            "older": lambda: bundles.old,
            "same serial, other content": lambda: bundles.numbered(2, "same.tar.gz"),
            "no serial": lambda: unnumbered(
                opa_bin, bundles.policies, signing[0], tmp_path / "none.tar.gz"
            ),
        }[kind]()
        shutil.copyfile(back, tmp_path / "live.tar.gz")
        status = sidecar.reload_policies()
        assert (status.outcome, status.reason, status.revision) == (
            "invalid",
            ROLLBACK,
            bundles.new_revision,
        )
        assert (status.deciding, status.source_valid) == (True, False)
        assert says in status.errors[0]
        assert f"SESSIONSTATE_POLICY_BUNDLE_PIN={bundles.old_revision}" in status.errors[0]
        assert read_decision(sidecar) == (False, bundles.new_revision), "N+1 keeps deciding"
        assert sidecar.signed is not None
        assert (sidecar.signed.rollbacks, sidecar.signed.rejections) == (1, 0)
        assert sidecar.signed.refused_as == ROLLBACK
        # A newer one then loads, and the refusal is over.
        shutil.copyfile(bundles.numbered(3, "n2.tar.gz"), tmp_path / "live.tar.gz")
        loaded = sidecar.reload_policies()
        assert (loaded.outcome, loaded.reason, loaded.source_valid) == ("loaded", None, True)
        assert read_decision(sidecar) == (True, bundles.old_revision)
    finally:
        sidecar.stop()


def test_a_pinned_older_bundle_is_served_and_the_pin_is_logged(
    opa_bin: str,
    signing: tuple[Path, Path],
    bundles: Bundles,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sidecar = started(opa_bin, bundles, signing[1], tmp_path, pin=bundles.old_revision)
    try:
        shutil.copyfile(bundles.old, tmp_path / "live.tar.gz")
        with caplog.at_level(logging.WARNING, logger="sessionstate.policy"):
            status = sidecar.reload_policies()
        assert (status.outcome, status.revision, status.deciding) == (
            "loaded",
            bundles.old_revision,
            True,
        )
        assert read_decision(sidecar) == (True, bundles.old_revision)
        pinned = [r for r in caplog.records if r.getMessage() == "policy_bundle_pinned"]
        assert [(r.policy_revision, r.serial, r.highest_serial) for r in pinned] == [
            (bundles.old_revision, 1, 2)
        ]
        # The pin names that bundle only, and never lowers the highest serial.
        other = policies_copy(tmp_path / "other", frozen=True)
        path = other / "sessionstate" / "read" / "read.rego"
        path.write_text(path.read_text() + "\n# another edit\n")
        build(opa_bin, other, signing[0], tmp_path / "live.tar.gz", serial=1)
        refused = sidecar.reload_policies()
        assert (refused.outcome, refused.reason) == ("invalid", ROLLBACK)
        assert "below 2" in refused.errors[0]
    finally:
        sidecar.stop()


def test_a_serial_raised_after_signing_is_refused_by_opa_and_never_recorded(
    opa_bin: str, signing: tuple[Path, Path], bundles: Bundles, tmp_path: Path
) -> None:
    sidecar = started(opa_bin, bundles, signing[1], tmp_path, pin=None)
    try:
        forged = repack(
            bundles.old,
            tmp_path / "live.tar.gz",
            edit=(".manifest", lambda text: text.replace('"serial":1', '"serial":9')),
        )
        assert read_bundle_file(forged).serial == 9
        status = sidecar.reload_policies()
        assert (status.outcome, status.reason) == ("invalid", "policy_bundle_rejected")
        assert "digest mismatch" in status.errors[0], "the signature covers .manifest"
        assert read_decision(sidecar) == (False, bundles.new_revision)
        assert sidecar.signed is not None
        refused = sidecar.signed.guard.check(3, "sha256:three")
        assert refused is None, "9 was never recorded: 3 is above the highest, 2"
    finally:
        sidecar.stop()


# --- the highest serial, in the store ----------------------------------------------------------


def test_the_highest_serial_is_kept_in_the_store_for_every_replica(lanes_on_both: Lanes) -> None:
    one, two = RollbackGuard(), RollbackGuard()  # two replicas sharing one store
    one.attach(lanes_on_both)
    two.attach(lanes_on_both)
    assert one.check(2, "sha256:two") is None
    one.activated(2, "sha256:two")
    stored = stored_highest(lanes_on_both)
    assert stored is not None and (stored.serial, stored.revision) == (2, "sha256:two")
    # The other replica never activated it, and still refuses what is older, or a twin.
    refused = two.check(1, "sha256:one")
    assert refused is not None and "below 2" in refused
    twin = two.check(2, "sha256:twin")
    assert twin is not None and "the same number" in twin
    assert two.check(2, "sha256:two") is None
    # A lower record never replaces a higher one.
    kept = record_highest(lanes_on_both, Highest(serial=1, revision="sha256:one", at="x"))
    assert kept.serial == 2


def test_a_damaged_record_refuses_every_bundle_until_one_is_pinned(lanes_on_both: Lanes) -> None:
    lanes_on_both.put(HIGHEST_KEY, b"not a record")
    guard = RollbackGuard()
    guard.attach(lanes_on_both)
    refused = guard.check(9, "sha256:nine")
    assert refused is not None and "does not read" in refused
    pinned = RollbackGuard(pin="sha256:nine")
    pinned.attach(lanes_on_both)
    assert pinned.check(9, "sha256:nine") is None
    pinned.activated(9, "sha256:nine")
    stored = stored_highest(lanes_on_both)
    assert stored is not None and stored.serial == 9
    assert guard.check(9, "sha256:nine") is None


# --- `sessionstate serve` ----------------------------------------------------------------------


def token() -> str:
    return mint_token(
        JWT_SECRET.encode(),
        sub="svc-1",
        roles=["model-service"],
        tenant="tenant-a",
        workspace="ws-1",
        session="chat-1",
        ttl_seconds=600,
    )


def read_status(url: str) -> int:
    read = requests.get(
        url + SESSION + "/state", headers={"Authorization": f"Bearer {token()}"}, timeout=5
    )
    return read.status_code  # 404: allowed (nothing stored); 403: reads frozen


def events(log: Path, event: str) -> list[dict[str, object]]:
    lines = (json.loads(line) for line in log.read_text().splitlines() if line.startswith("{"))
    return [line for line in lines if line.get("event") == event]


def test_served_rollback_is_refused_at_a_reload_and_a_restart_until_pinned(
    opa_bin: str, signing: tuple[Path, Path], bundles: Bundles, tmp_path: Path
) -> None:
    live = tmp_path / "live.tar.gz"
    shutil.copyfile(bundles.new, live)
    env = serve_env(live, signing[1])
    served = start(opa_bin, tmp_path / "var", tmp_path, env)
    try:
        assert requests.get(served.url + "/readyz", timeout=5).json()["warnings"] == []
        assert read_status(served.url) == 403, "N+1 freezes reads"
        # N is put back, and a reload asked for.
        shutil.copyfile(bundles.old, live)
        done = cli("policy", "reload", env={"SESSIONSTATE_DATA_DIR": str(served.data_dir)})
        assert done.returncode == 1, done.stderr
        outcome = json.loads(done.stdout)
        assert (outcome["outcome"], outcome["reason"], outcome["revision"]) == (
            "invalid",
            ROLLBACK,
            bundles.new_revision,
        )
        assert "its serial 1 is below 2" in outcome["errors"][0]
        assert read_status(served.url) == 403, "N+1 keeps deciding"
        ready = requests.get(served.url + "/readyz", timeout=5)
        assert ready.status_code == 200
        body = ready.json()
        assert body["warnings"] == ["policy_source_invalid", ROLLBACK]
        assert body["policy_revision"] == bundles.new_revision
        metrics = requests.get(served.url + "/metrics", timeout=5).text
        assert "sessionstate_policy_bundle_rollback_total 1.0" in metrics
        assert "sessionstate_policy_bundle_rejected_total 0.0" in metrics
    finally:
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(20)
    [logged] = events(served.log, ROLLBACK)
    assert logged["level"] == "error" and logged["policy_revision"] == bundles.new_revision
    # A restart with N: the start fails, saying why, in one line; nothing is served.
    refused = serve(opa_bin, tmp_path, env)
    assert refused.returncode == 2, refused.stderr
    [line] = [line for line in refused.stderr.splitlines() if line.startswith("sessionstate:")]
    assert f"is refused, {ROLLBACK}: its serial 1 is below 2" in line
    assert f"SESSIONSTATE_POLICY_BUNDLE_PIN={bundles.old_revision}" in line
    # Pinned explicitly, N is served, and the pin is logged.
    pinned = start(
        opa_bin,
        tmp_path / "var",
        tmp_path,
        {**env, "SESSIONSTATE_POLICY_BUNDLE_PIN": bundles.old_revision},
    )
    try:
        ready = requests.get(pinned.url + "/readyz", timeout=5).json()
        assert (ready["policy_revision"], ready["warnings"]) == (bundles.old_revision, [])
        assert read_status(pinned.url) == 404, "N decides: reads allowed"
    finally:
        pinned.process.send_signal(signal.SIGTERM)
        pinned.process.wait(20)
    [logged] = events(pinned.log, "policy_bundle_pinned")
    assert (logged["policy_revision"], logged["serial"], logged["highest_serial"]) == (
        bundles.old_revision,
        1,
        2,
    )
    # The pin lowered nothing: without it, N is refused again.
    again = serve(opa_bin, tmp_path, env)
    assert again.returncode == 2 and ROLLBACK in again.stderr


@pytest.mark.parametrize(
    "settings",
    [
        {"SESSIONSTATE_POLICY_BUNDLE_PIN": "sha256:" + "0" * 64},
        {"SESSIONSTATE_POLICY_BUNDLE_PIN": "1", "SIGNED": "yes"},
    ],
)
def test_serve_refuses_a_pin_without_a_bundle_or_that_is_no_revision(
    opa_bin: str,
    signing: tuple[Path, Path],
    bundles: Bundles,
    tmp_path: Path,
    settings: dict[str, str],
) -> None:
    env = dict(settings)
    if env.pop("SIGNED", None):
        env |= serve_env(bundles.new, signing[1])
    done = serve(opa_bin, tmp_path, env)
    assert done.returncode == 2, done.stderr
    assert "SESSIONSTATE_POLICY_BUNDLE_PIN names the revision of a signed bundle" in done.stderr
