"""The client distribution stands alone: its wheel installs into a clean venv without the server.

The wheel of `clients/python` is built and installed into a fresh venv in a
temporary directory (pip fetches httpx and pydantic, from its cache when it
can). Nothing of the server comes with it: no flask, plyvel, gunicorn or
hypercorn, no `service` or `store`. From that venv, the example model service
runs both flavours against the real served process, and the client's own unit
tests (`clients/python/tests`) pass with only pytest added, run from a directory
outside the repository.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
import venv
from pathlib import Path

import pytest

from service.auth.tokens import mint_token
from tests.support.live import JWT_SECRET
from tests.support.served import ROOT, Served

pytestmark = pytest.mark.slow  # long end to end: `make test-quick` skips it

CLIENT = ROOT / "clients" / "python"
SERVER_ONLY = {"flask", "plyvel", "gunicorn", "hypercorn", "sessionstate", "psycopg", "pyjwt"}


def run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(arg) for arg in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with only the client's wheel (and its dependencies) installed."""
    tmp = tmp_path_factory.mktemp("client-wheel")
    wheels = tmp / "wheels"
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, CLIENT, cwd=tmp)
    (wheel,) = wheels.glob("sessionstate_client-*.whl")
    venv.EnvBuilder(with_pip=True).create(tmp / "venv")
    python = tmp / "venv" / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel, cwd=tmp)
    return python


def test_the_wheel_installs_without_the_server(client_venv: Path) -> None:
    listed = json.loads(
        run(client_venv, "-m", "pip", "list", "--format=json", cwd=client_venv.parent)
    )
    names = {package["name"].lower() for package in listed}
    assert "sessionstate-client" in names and {"httpx", "pydantic"} <= names
    assert names.isdisjoint(SERVER_ONLY), names & SERVER_ONLY
    probe = (
        "import importlib.util, sessionstate_client as c; "
        "print(c.__file__); "
        "print([m for m in ('service', 'store', 'flask') if importlib.util.find_spec(m)])"
    )
    where, found = run(client_venv, "-c", probe, cwd=client_venv.parent).splitlines()
    assert where.startswith(str(client_venv.parent.parent))  # the clean venv's own copy
    assert found == "[]"


def test_the_example_runs_both_flavours_from_the_clean_venv(
    client_venv: Path, served: Served
) -> None:
    def token(role: str) -> str:
        scoped = role == "model-service"
        return mint_token(
            JWT_SECRET.encode(),
            sub="wheel",
            roles=[role],
            tenant="tenant-a",
            workspace="ws-1",
            session="chat-1" if scoped else None,
            ttl_seconds=600,
        )

    grant = (
        "import sys; from sessionstate_client import SessionStateClient as C; "
        "C(sys.argv[1], sys.argv[2]).grant_approval('tenant-a', 'ws-1', "
        "{'ttl_seconds': 600, 'reason': 'wheel'})"
    )
    run(client_venv, "-c", grant, served.url, token("operator"), cwd=client_venv.parent)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "SESSIONSTATE_URL": served.url,
        "SESSIONSTATE_TOKEN": token("model-service"),
    }
    canary = f"PROMPT-CANARY-{uuid.uuid4().hex}"
    example = ROOT / "examples" / "model_service.py"
    sync = run(client_venv, example, f"one {canary}", cwd=client_venv.parent, env=env)
    asynchronous = run(
        client_venv, example, "--asyncio", "two", "three", cwd=client_venv.parent, env=env
    )
    assert sync.startswith(f"echo: one {canary} ") and "0 turns before" in sync
    assert asynchronous.splitlines()[0].endswith("2 turns before]")
    assert asynchronous.splitlines()[1].endswith("4 turns before]")


def test_the_clients_unit_tests_pass_in_the_clean_venv(client_venv: Path, tmp_path: Path) -> None:
    install = ("-m", "pip", "install", "-q", "--disable-pip-version-check", "pytest")
    run(client_venv, *install, cwd=tmp_path)
    # Nothing of the checkout on the path: not its root, not an inherited PYTHONPATH.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    tests = CLIENT / "tests"
    output = run(
        client_venv, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests, cwd=tmp_path, env=env
    )
    summary = re.search(r"^(\d+) passed in ", output, re.MULTILINE)
    assert summary is not None and int(summary.group(1)) > 0, output[-2000:]
