"""The server's wheel works on its own: built from the tracked files, installed into a fresh
venv from the lock (as the Dockerfile installs it), served from a directory outside the
checkout, and the five-step walk-through pasted against it.

The venv gets the locked runtime dependencies (`requirements/runtime.txt`, hash-checked)
and then the wheel with `--no-deps`: pip's cache (or `PIP_FIND_LINKS`) keeps that quick,
the index answers what the cache lacks.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest
import requests

from service.policy.bundle import load_bundle, policy_files
from tests.cli.test_walkthrough import answer_of, pasted_commands, printed_walkthrough, run_pasted
from tests.support.served import ROOT, Served, free_port

pytestmark = pytest.mark.slow  # long end to end: `make test-quick` skips it

POLICIES = ROOT / "policies"
PACKAGED = "service/default_policies"


@dataclass(frozen=True)
class Installed:
    wheel: Path
    build_log: str
    venv: Path

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name


def tracked_files() -> list[str]:
    """The files of the repository as the working tree has them (new ones too)."""
    done = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=30,
    )
    return [name for name in done.stdout.decode().split("\0") if name]


def run(args: list[str | Path], cwd: Path, timeout: int = 300) -> str:
    done = subprocess.run(
        [str(arg) for arg in args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel of a copy of the tracked files (no build/, egg-info or venv of the
    checkout can leak in), installed into a venv of its own."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    for name in tracked_files():
        if (ROOT / name).is_file():  # a file deleted in the working tree is not built
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    dist = tmp / "dist"
    build_log = run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, "."],
        source,
    )
    (wheel,) = dist.glob("sessionstate-*.whl")
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", venv], tmp)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet"]
    run([*pip, "--require-hashes", "-r", ROOT / "requirements" / "runtime.txt"], tmp)
    run([*pip, "--no-deps", wheel], tmp)
    return Installed(wheel, build_log, venv)


def test_the_build_warns_about_nothing(installed: Installed) -> None:
    assert "Warning" not in installed.build_log, installed.build_log
    assert "WARNING" not in installed.build_log, installed.build_log


def test_the_wheel_carries_every_module_the_templates_and_the_license(
    installed: Installed,
) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        metadata = Parser().parsestr(
            wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        )
    modules = {
        name
        for name in tracked_files()
        if name.endswith(".py") and name.split("/")[0] in {"service", "store"}
    }
    assert modules - names == set()
    templates = {name for name in tracked_files() if name.startswith("service/templates/")}
    assert templates and templates - names == set()
    assert metadata["License-Expression"] == "Apache-2.0"
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    assert not {name for name in names if name.split("/")[0] not in {"service", "store"}} - {
        name for name in names if ".dist-info/" in name
    }


def test_the_wheel_carries_the_served_policies_their_tests_and_the_schemas(
    installed: Installed,
) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        packaged = {
            name.removeprefix(PACKAGED): wheel.read(name)
            for name in wheel.namelist()
            if name.startswith(PACKAGED + "/")
        }
    served = dict(policy_files(POLICIES))  # what the sidecar serves: "/<path>" -> bytes
    schemas = {
        "/" + path.relative_to(POLICIES).as_posix(): path.read_bytes()
        for path in (POLICIES / "schemas").rglob("*.json")
    }
    manifest = {"/.manifest": (POLICIES / ".manifest").read_bytes()}
    # The tests too: the sidecar serves the policies only once they pass (coverage_gate).
    tests = {
        "/" + path.relative_to(POLICIES).as_posix(): path.read_bytes()
        for path in POLICIES.rglob("*_test.rego")
    }
    # And the deployment's invariants, which are checked before a set is served, never served.
    invariants = {
        "/" + path.relative_to(POLICIES).as_posix(): path.read_bytes()
        for path in (POLICIES / "invariants").rglob("*.rego")
    }
    assert tests and invariants
    assert packaged == served | schemas | manifest | tests | invariants


def installed_python(installed: Installed, code: str, env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        [installed.bin("python"), "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def clean_environment(home: Path) -> dict[str, str]:
    """No SESSIONSTATE_ setting, no PYTHONPATH to the checkout, HOME elsewhere."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("SESSIONSTATE_") and key not in {"PYTHONPATH", "VIRTUAL_ENV"}
    }
    env["HOME"] = str(home)
    return env


def test_the_installed_service_finds_its_packaged_policies_unless_told_otherwise(
    installed: Installed, tmp_path: Path
) -> None:
    code = "from service.config.settings import Settings; print(Settings().policy_dir)"
    env = clean_environment(tmp_path)
    found = Path(installed_python(installed, code, env, tmp_path))
    assert found.is_relative_to(installed.venv) and found.name == "default_policies"
    assert load_bundle(found).revision == load_bundle(POLICIES).revision
    env["SESSIONSTATE_POLICY_DIR"] = str(tmp_path / "ours")
    assert installed_python(installed, code, env, tmp_path) == str(tmp_path / "ours")


@pytest.fixture
def served_from_the_wheel(installed: Installed, opa_bin: str, tmp_path: Path) -> Iterator[Served]:
    """`sessionstate serve` of the venv in an empty directory: data in ./var, its own
    secrets, OPA found on PATH (no SESSIONSTATE_OPA_BIN, no .tools/ to fall back on)."""
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    port = free_port()
    env = clean_environment(tmp_path)
    env |= {
        "PATH": f"{Path(opa_bin).parent}{os.pathsep}{env.get('PATH', '')}",
        "SESSIONSTATE_PORT": str(port),
        "SESSIONSTATE_DURABLE_WRITES": "true",
    }
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [installed.bin("sessionstate"), "serve", "--walkthrough"],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    served = Served(process, f"http://127.0.0.1:{port}", workdir / "var", log)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if requests.get(served.url + "/readyz", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.1)
        else:
            raise AssertionError("the installed service did not become ready:\n" + log.read_text())
        yield served
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(30)


def test_the_installed_service_serves_the_walkthrough_outside_the_checkout(
    served_from_the_wheel: Served, installed: Installed, tmp_path: Path
) -> None:
    ready = requests.get(served_from_the_wheel.url + "/readyz", timeout=5).json()
    assert ready["policy_revision"] == load_bundle(POLICIES).revision

    text = printed_walkthrough(served_from_the_wheel)
    commands = pasted_commands(text)
    assert f"SVC=$({installed.bin('sessionstate')} token" in commands[0], commands[0]
    workdir = served_from_the_wheel.data_dir.parent
    outputs = run_pasted(commands, tmp_path, cwd=workdir)

    preview = json.loads(answer_of(commands, outputs, "/state/preview"))
    assert preview["decision"]["allow"] is True, preview
    assert "borrow checker" not in json.dumps(preview)
    assert "hmac-sha256:" in json.dumps(preview["record"])
    approval = json.loads(answer_of(commands, outputs, "/approvals"))
    assert approval["approval"]["reason"] == "walkthrough"
    written = answer_of(commands, outputs, "-X PUT")
    assert written.startswith("HTTP/1.1 201"), written
    read = json.loads(answer_of(commands, outputs, "curl -s http"))
    assert read["read_report"]["record"] is not None, read
    replay = json.loads(answer_of(commands, outputs, "/replay-preview"))
    assert replay["preview"]["allowed"] is True, replay
    # The data and the generated secrets went to ./var of the directory it was started in.
    assert (workdir / "var").is_dir()
