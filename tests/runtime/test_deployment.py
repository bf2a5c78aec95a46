"""The container deployment: Dockerfile, .dockerignore and docker-compose.yml.

No Docker engine runs where this project is built and tested, so nothing here
builds an image or starts a container. Instead the files are parsed and every
promise of docs/deployment.md is asserted on them; Compose v2 itself (built
by scripts/tools.sh) resolves the file with `docker-compose config`, which
needs no engine; and the pieces that can run without Docker do run: the
compose file's exact OPA command line with the pinned OPA binary, both health
check commands, and the service configured as in compose.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import requests
import yaml

from service.policy.bundle import load_bundle, policy_files
from service.policy.sidecar import TOKEN_ENV, OpaSidecar
from store.secrets import encode_secret
from tests.support.paths import ROOT
from tests.support.ports import free_port
from tests.support.processes import pause

POLICY_DIR = ROOT / "policies"
SERVICE = "sessionstate"
OPA = "opa"
OPA_ADDR = "127.0.0.1:8181"
# Names of secret values (a key *file* path, such as the policy verification key, is none).
SECRET_NAME = re.compile(r"(TOKEN|SECRET|(?<!VERIFICATION_)KEY|PASSWORD)")
REQUIRED_REF = re.compile(r"^\$\{(?P<name>[A-Z0-9_]+):\?[^}]+\}$")
UPDATE_MANIFEST = ".venv/bin/python deploy/policy_manifest.py"


# --- parsing -------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    stage: int


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with their stage index: continuations joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continuation"
    instructions = []
    stage = -1
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, args.strip(), stage))
    return instructions


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), args
    assert all(isinstance(item, str) for item in value), args
    return value


DOCKERFILE = parse_dockerfile((ROOT / "Dockerfile").read_text())
FINAL = [i for i in DOCKERFILE if i.stage == max(i.stage for i in DOCKERFILE)]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]


def final(keyword: str) -> list[str]:
    return [i.args for i in FINAL if i.keyword == keyword]


def image_env() -> dict[str, str]:
    """ENV of the final stage (KEY=VALUE pairs; values without spaces)."""
    env: dict[str, str] = {}
    for args in final("ENV"):
        for pair in shlex.split(args):
            key, sep, value = pair.partition("=")
            assert sep, f"ENV in the legacy `KEY value` form: {args}"
            env[key] = value
    return env


def healthcheck_command(args: str) -> list[str]:
    """The CMD of a HEALTHCHECK, whose options come first."""
    options, sep, command = args.partition("CMD ")
    assert sep, f"HEALTHCHECK without CMD: {args}"
    assert all(option.startswith("--") for option in options.split()), options
    return exec_form(command)


def opa_version() -> str:
    match = re.search(
        r"^OPA_VERSION=(\S+)$", (ROOT / "scripts" / "tools.sh").read_text(), re.MULTILINE
    )
    assert match, "scripts/tools.sh no longer pins OPA_VERSION"
    return match.group(1)


def opa_command() -> list[str]:
    """OPA's argv in docker-compose.yml, as Compose resolves it with none of the optional
    variables set (the policy directory, no signature verification)."""
    command = SERVICES[OPA]["command"]
    assert isinstance(command, list), "OPA's command must be a list: no shell in the image"
    return [_unset_variables(str(arg)) for arg in command]


def _unset_variables(text: str) -> str:
    """`${X:-default}` as the default, `${X:+alternative}` as nothing: X unset."""
    return re.sub(r"\$\{[A-Z0-9_]+:([-+])([^}]*)\}", lambda m: m[2] if m[1] == "-" else "", text)


def flag_value(command: list[str], flag: str) -> list[str]:
    """Every value of `flag`, whether written `--flag value` or `--flag=value`."""
    values = []
    for index, arg in enumerate(command):
        if arg == flag:
            values.append(command[index + 1])
        elif arg.startswith(flag + "="):
            values.append(arg.split("=", 1)[1])
    return values


def compose_volumes(service: str) -> list[dict[str, Any]]:
    """Volumes in the long form, whichever form the file uses."""
    found = []
    for volume in SERVICES[service].get("volumes", []):
        if isinstance(volume, dict):
            found.append(volume)
            continue
        # SOURCE:TARGET[:MODE], where SOURCE may be `${VARIABLE:-default}`.
        parts = re.fullmatch(r"(\$\{[^}]*\}|[^:]+):([^:]+)(?::(.*))?", str(volume))
        assert parts is not None, volume
        found.append(
            {
                "source": parts[1],
                "target": parts[2],
                "read_only": "ro" in (parts[3] or "").split(","),
            }
        )
    return found


def load_manifest_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "policy_manifest", ROOT / "deploy" / "policy_manifest.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sidecar_command() -> list[str]:
    """The argv a sidecar on TCP runs OPA with (service/policy/sidecar.py, `listen="tcp"`):
    the lock-down of an OPA reached over the network. The service's own sidecar listens on
    a Unix socket instead, which keeps every other user out without a token."""
    stub = SimpleNamespace(opa_bin="opa", port=8181, work_dir=Path("/work"), socket_path=None)
    command: list[str] = OpaSidecar._command(stub)  # type: ignore[arg-type]
    return command


# --- the service image -----------------------------------------------------------------


def test_service_image_is_slim_python_at_a_pinned_tag() -> None:
    python_bases = [
        i.args.split()[0] for i in DOCKERFILE if i.keyword == "FROM" and "python" in i.args
    ]
    assert python_bases, "no Python base image"
    for base in python_bases:
        assert re.fullmatch(r"python:3\.11-slim-[a-z]+", base), base
    assert FINAL[0].args.split()[0] in python_bases, "the final stage is not the slim Python image"


def test_image_runs_as_a_non_root_user_it_creates() -> None:
    users = final("USER")
    assert users, "no USER: the service would run as root"
    user, _, group = users[-1].partition(":")
    assert user not in {"root", "0"}
    assert group not in {"root", "0"}
    created = " ".join(final("RUN"))
    assert f"--uid {user}" in created and f"--gid {group or user}" in created, created
    after_user = FINAL[[i.args for i in FINAL].index(users[-1]) :]
    assert not [i for i in after_user if i.keyword == "RUN"], (
        "RUN after USER runs as the service user"
    )


def test_image_runs_sessionstate_serve() -> None:
    cmd = final("CMD")
    assert len(cmd) == 1 and exec_form(cmd[0]) == ["sessionstate", "serve"]
    assert not final("ENTRYPOINT")


def test_project_is_installed_from_wheels_not_editable() -> None:
    build = [i.args for i in DOCKERFILE if i.keyword == "RUN" and i.stage < FINAL[0].stage]
    assert any(re.search(r"pip wheel .*\.$", run) for run in build), build
    installs = [run for run in final("RUN") if "pip install" in run]
    assert len(installs) == 1
    assert "--no-index" in installs[0]
    assert not re.search(r"(^|\s)(-e|--editable)(\s|$)", installs[0])


def test_every_python_package_reaches_the_wheel() -> None:
    """`pip install .` (the image) installs only the packages pyproject lists (setup.py finds
    them instead: tests/repository/test_wheel.py checks that every module reaches the wheel)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"].get("setuptools", {})
    if "packages" in config and isinstance(config["packages"], list):
        listed = set(config["packages"])
        on_disk = {
            ".".join(init.parent.relative_to(ROOT).parts)
            for top in ("store", "service")
            for init in (ROOT / top).rglob("__init__.py")
        }
        missing = sorted(on_disk - listed)
        assert not missing, (
            f"pip install . (and so the image) would lack {missing}: "
            "add them to [tool.setuptools] packages in pyproject.toml"
        )


def test_data_dir_is_a_volume_owned_by_the_service_user() -> None:
    env = image_env()
    data_dir = env["SESSIONSTATE_DATA_DIR"]
    volumes = [path for args in final("VOLUME") for path in exec_form(args)]
    assert volumes == [data_dir]
    user = final("USER")[-1].split(":")[0]
    created = " ".join(final("RUN"))
    assert re.search(rf"install -d -m 0700 -o \S+ -g \S+ {re.escape(data_dir)}", created)
    assert f"--uid {user}" in created


def test_image_listens_on_all_interfaces_of_its_namespace() -> None:
    env = image_env()
    assert env["SESSIONSTATE_HOST"] == "0.0.0.0"
    assert final("EXPOSE") == [env["SESSIONSTATE_PORT"]]


def test_image_alone_can_run_the_pinned_opa_sidecar() -> None:
    """Without SESSIONSTATE_OPA_URL the service starts its own OPA, from this binary."""
    env = image_env()
    stages = {
        i.args.split()[-1]: i.args.split()[0]
        for i in DOCKERFILE
        if i.keyword == "FROM" and " AS " in i.args.upper()
    }
    assert stages["opa"] == f"openpolicyagent/opa:{opa_version()}-static"
    assert f"--from=opa /opa {env['SESSIONSTATE_OPA_BIN']}" in final("COPY")
    copied = {args.split()[-1].rstrip("/") for args in final("COPY") if args.startswith("policies")}
    assert copied == {env["SESSIONSTATE_POLICY_DIR"]}


def test_dockerignore_admits_only_what_the_dockerfile_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*", "start from nothing: an allow-list cannot leak .env or var/"
    admitted = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    sources = set()
    for instruction in DOCKERFILE:
        if instruction.keyword == "COPY" and "--from" not in instruction.args:
            sources |= {s.rstrip("/") for s in instruction.args.split()[:-1]}
    assert admitted == sources
    assert not admitted & {".env", "deploy", "var", ".venv", ".tools", ".git"}


class _Readyz(BaseHTTPRequestHandler):
    status = HTTPStatus.OK

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/readyz" else HTTPStatus.NOT_FOUND)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_image_healthcheck_fails_unless_readyz_answers_200() -> None:
    checks = final("HEALTHCHECK")
    assert len(checks) == 1
    command = healthcheck_command(checks[0])
    assert command[:2] == ["python", "-c"] and "/readyz" in command[2]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Readyz)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {**os.environ, "SESSIONSTATE_PORT": str(server.server_address[1])}
    probe = [sys.executable, *command[1:]]
    try:
        assert subprocess.run(probe, env=env, capture_output=True, timeout=10).returncode == 0
        _Readyz.status = HTTPStatus.SERVICE_UNAVAILABLE
        assert subprocess.run(probe, env=env, capture_output=True, timeout=10).returncode != 0
    finally:
        _Readyz.status = HTTPStatus.OK
        server.shutdown()
        server.server_close()
    env["SESSIONSTATE_PORT"] = str(free_port())  # nothing listens
    assert subprocess.run(probe, env=env, capture_output=True, timeout=10).returncode != 0


# --- docker-compose.yml ----------------------------------------------------------------


def test_compose_has_the_service_and_its_opa() -> None:
    assert set(SERVICES) == {SERVICE, OPA}
    assert SERVICES[SERVICE]["build"]["context"] == "."


def test_opa_image_is_official_and_pinned_to_the_tools_version() -> None:
    assert SERVICES[OPA]["image"] == f"openpolicyagent/opa:{opa_version()}"


def test_opa_is_a_true_sidecar_published_nowhere() -> None:
    opa = SERVICES[OPA]
    assert opa["network_mode"] == f"service:{SERVICE}"
    assert not {"ports", "expose", "networks", "hostname"} & set(opa)
    published = [str(port) for port in SERVICES[SERVICE].get("ports", [])]
    opa_port = OPA_ADDR.rsplit(":", 1)[1]
    assert not [p for p in published if p.split(":")[-1] == opa_port]


def test_opa_follows_the_service_into_its_new_namespace() -> None:
    """Compose must restart OPA after it restarts the service (the long form with restart)."""
    dependency = SERVICES[OPA]["depends_on"]
    assert isinstance(dependency, dict), "the short form would drop `restart: true`"
    assert dependency[SERVICE]["restart"] is True


def test_opa_listens_on_loopback_where_the_service_looks() -> None:
    assert flag_value(opa_command(), "--addr") == [OPA_ADDR]
    assert SERVICES[SERVICE]["environment"]["SESSIONSTATE_OPA_URL"] == f"http://{OPA_ADDR}"


def test_opa_mounts_the_policies_read_only_and_loads_them_as_a_bundle() -> None:
    mounts = [v for v in compose_volumes(OPA) if v["target"] == "/policies"]
    # The directory by default; a signed bundle file when SESSIONSTATE_POLICY_BUNDLE names one.
    assert [v["source"] for v in mounts] == ["${SESSIONSTATE_POLICY_BUNDLE:-./policies}"]
    assert mounts[0]["read_only"] is True
    command = opa_command()
    assert flag_value(command, "--bundle") == [mounts[0]["target"]]
    assert "*_test.rego" in flag_value(command, "--ignore")


def test_opa_command_has_the_lockdown_of_the_local_sidecar() -> None:
    """The same flags as a sidecar on TCP (service/policy/sidecar.py), so the two cannot
    drift apart."""
    local = sidecar_command()
    assert local[1] == "run" and opa_command()[0] == "run"
    # The local sidecar's address and config file are its own; every other flag is shared.
    local_flags = [
        arg
        for index, arg in enumerate(local)
        if arg.startswith("--")
        and arg not in {"--addr", "--config-file"}
        and local[index - 1] not in {"--addr", "--config-file"}
    ]
    assert {"--authentication=token", "--authorization=basic", "--server"} <= set(local_flags)
    missing = [flag for flag in local_flags if flag not in opa_command()]
    assert not missing, f"the local sidecar runs OPA with {missing}, compose does not"


def test_opa_logs_decisions_to_its_console_like_the_local_sidecar(tmp_path: Path) -> None:
    stub = SimpleNamespace(
        work_dir=tmp_path,
        poll_seconds=1,
        _bundles=SimpleNamespace(url="x"),
        verification_key=None,
        tracing=None,
    )
    OpaSidecar._write_config(stub)  # type: ignore[arg-type]
    local = json.loads((tmp_path / "opa-config.json").read_text())
    assert local["decision_logs"] == {"console": True}
    assert "decision_logs.console=true" in flag_value(opa_command(), "--set")


def test_opa_token_is_shared_and_no_other_secret_reaches_opa() -> None:
    opa_env = SERVICES[OPA]["environment"]
    assert set(opa_env) == {TOKEN_ENV}
    assert opa_env[TOKEN_ENV] == SERVICES[SERVICE]["environment"][TOKEN_ENV]
    authz = (POLICY_DIR / "system" / "authz" / "authz.rego").read_text()
    assert f"opa.runtime().env.{TOKEN_ENV}" in authz


def test_secrets_are_required_references_never_literals() -> None:
    for name, service in SERVICES.items():
        assert "secrets" not in service or service["secrets"], name
        environment = service.get("environment", {})
        assert isinstance(environment, dict), f"{name}: use the mapping form of environment"
        for key, value in environment.items():
            if SECRET_NAME.search(key):
                reference = REQUIRED_REF.match(str(value))
                assert reference, f"{name}.{key} must be ${{{key}:?…}}, not a literal or a default"
                assert reference.group("name") == key


def test_service_data_dir_is_on_a_named_volume() -> None:
    data_dir = image_env()["SESSIONSTATE_DATA_DIR"]
    mounts = [v for v in compose_volumes(SERVICE) if v["target"] == data_dir]
    assert len(mounts) == 1
    assert mounts[0]["source"] in COMPOSE["volumes"], "a named volume, not a host path"


def test_service_is_published_on_host_loopback_by_default() -> None:
    (published,) = SERVICES[SERVICE]["ports"]
    assert re.fullmatch(r"\$\{SESSIONSTATE_PUBLISH:-127\.0\.0\.1:8080\}:8080", published)


def test_both_containers_have_health_checks() -> None:
    service_check = SERVICES[SERVICE]["healthcheck"]["test"]
    assert service_check[0] == "CMD"
    assert service_check[1:] == healthcheck_command(final("HEALTHCHECK")[0])
    opa_check = SERVICES[OPA]["healthcheck"]["test"]
    assert opa_check[:3] == ["CMD", "/opa", "eval"] and "--fail" in opa_check
    assert f"http://{OPA_ADDR}/health" in opa_check[-1]


def test_compose_interpolates_nothing_but_its_variables() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert not re.search(r"\$(?!\{[A-Z0-9_]+(:[?+-][^}]*)?\})", text), "a stray $ is interpolated"


@pytest.fixture(scope="module")
def compose_bin() -> str:
    """Docker Compose v2, standalone: scripts/tools.sh builds it on first use (`make tools`).

    Its `config` reads and resolves the compose file without a Docker engine.
    """
    built = subprocess.run(
        [str(ROOT / "scripts" / "tools.sh"), "compose"], capture_output=True, text=True
    )
    assert built.returncode == 0, f"scripts/tools.sh compose failed:\n{built.stderr[-3000:]}"
    return built.stdout.strip()


def test_docker_compose_config_accepts_the_file_and_refuses_missing_secrets(
    compose_bin: str, tmp_path: Path
) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONSTATE_")}
    # No Docker engine: `config` must not need one, so point it at none.
    clean["DOCKER_HOST"] = f"unix://{tmp_path}/no-docker.sock"
    empty = tmp_path / "empty.env"
    empty.write_text("")
    refused = subprocess.run(
        [compose_bin, "--env-file", str(empty), "config", "--quiet"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "SESSIONSTATE_" in refused.stderr
    filled = tmp_path / "filled.env"
    filled.write_text(
        "".join(
            f"{name}={'x' * 40}\n"
            for name in (TOKEN_ENV, "SESSIONSTATE_JWT_SECRET", "SESSIONSTATE_DIGEST_KEY")
        )
    )
    quiet = subprocess.run(
        [compose_bin, "--env-file", str(filled), "config", "--quiet"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (quiet.returncode, quiet.stdout) == (0, ""), quiet.stderr
    accepted = subprocess.run(
        [compose_bin, "--env-file", str(filled), "config", "--format", "json"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert accepted.returncode == 0, accepted.stderr
    resolved = json.loads(accepted.stdout)["services"]
    assert resolved[OPA]["network_mode"] == f"service:{SERVICE}"
    assert resolved[OPA]["depends_on"][SERVICE]["restart"] is True
    (policies,) = [v for v in resolved[OPA]["volumes"] if v["target"] == "/policies"]
    assert policies["read_only"] is True and Path(policies["source"]) == POLICY_DIR


def test_compose_passes_exported_secrets_through_unchanged(
    compose_bin: str, tmp_path: Path
) -> None:
    """`sessionstate secrets export` lines in the env file reach the service as they are."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONSTATE_")}
    clean["DOCKER_HOST"] = f"unix://{tmp_path}/no-docker.sock"
    exported = {
        "SESSIONSTATE_JWT_SECRET": encode_secret(bytes(range(32))),
        "SESSIONSTATE_DIGEST_KEY": encode_secret(bytes(range(32, 64))),
    }
    env_file = tmp_path / "compose.env"
    env_file.write_text(
        f"{TOKEN_ENV}={'t' * 43}\n" + "".join(f"{k}={v}\n" for k, v in exported.items())
    )
    resolved = subprocess.run(
        [compose_bin, "--env-file", str(env_file), "config", "--format", "json"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert resolved.returncode == 0, resolved.stderr
    environment = json.loads(resolved.stdout)["services"][SERVICE]["environment"]
    assert {k: environment[k] for k in exported} == exported


def test_deployment_doc_lists_every_setting_compose_reads() -> None:
    compose = set(re.findall(r"\$\{([A-Z0-9_]+)", (ROOT / "docker-compose.yml").read_text()))
    doc = (ROOT / "docs" / "deployment.md").read_text()
    configure = doc.split("## Configure", 1)[1].split("\n## ", 1)[0]
    table = set(re.findall(r"^\| `([A-Z0-9_]+)` \|", configure, re.MULTILINE))
    assert table == compose
    secrets = {name for name in compose if SECRET_NAME.search(name)}
    words = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}
    assert (
        f"Compose reads {words[len(compose)]} settings, {words[len(secrets)]} of them secrets"
        in configure
    )
    example = (ROOT / "deploy" / ".env.example").read_text()
    assert set(re.findall(r"^#? ?([A-Z0-9_]+)=", example, re.MULTILINE)) == compose


# --- the bundle revision ---------------------------------------------------------------


def test_bundle_manifest_carries_the_current_policy_revision() -> None:
    tool = load_manifest_tool()
    manifest = POLICY_DIR / ".manifest"
    assert manifest.exists(), f"policies/.manifest is missing: run {UPDATE_MANIFEST}"
    assert not tool.is_stale(POLICY_DIR, manifest.read_text()), (
        f"policies/.manifest is stale after a policy change: run {UPDATE_MANIFEST}"
    )


# --- rehearsal: the compose OPA and service, run without Docker --------------------------


@dataclass
class ComposeOpa:
    url: str
    addr: str
    token: str
    log: Path
    process: subprocess.Popen[bytes]

    def rewrite(self, value: str) -> str:
        """A string of docker-compose.yml, with this run's address for OPA's."""
        return value.replace(OPA_ADDR, self.addr)


@pytest.fixture(scope="module")
def compose_opa(opa_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeOpa]:
    """docker-compose.yml's OPA argv on a free loopback port, policies from the repo."""
    addr = f"127.0.0.1:{free_port()}"
    (bundle_dir,) = flag_value(opa_command(), "--bundle")
    argv = [opa_bin] + [
        str(POLICY_DIR) if arg == bundle_dir else arg.replace(OPA_ADDR, addr)
        for arg in opa_command()
    ]
    token = "t" * 40
    log = tmp_path_factory.mktemp("compose-opa") / "opa.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv,
            env={"PATH": os.environ.get("PATH", ""), TOKEN_ENV: token},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    running = ComposeOpa(f"http://{addr}", addr, token, log, process)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if requests.get(running.url + "/health", timeout=0.5).status_code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(0.05)
    else:
        process.kill()
        raise AssertionError("the compose OPA command did not start:\n" + log.read_text())
    yield running
    process.terminate()
    process.wait(10)


def _opa_healthcheck(opa_bin: str, compose_opa: ComposeOpa) -> int:
    test = SERVICES[OPA]["healthcheck"]["test"]
    argv = [opa_bin, *(compose_opa.rewrite(arg) for arg in test[2:])]
    return subprocess.run(argv, capture_output=True, timeout=15).returncode


def test_compose_opa_serves_the_manifest_revision_locked_down(
    opa_bin: str, compose_opa: ComposeOpa
) -> None:
    decision = f"{compose_opa.url}/v1/data/sessionstate/read/decision?provenance=true"
    answer = requests.post(
        decision,
        json={"input": {"action": "read"}},
        headers={"Authorization": f"Bearer {compose_opa.token}"},
        timeout=5,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    revisions = [b["revision"] for b in body["provenance"]["bundles"].values()]
    assert revisions == [load_bundle(POLICY_DIR).revision]
    assert body["decision_id"], "decision logging is off: the service would refuse every answer"
    assert body["decision_id"] in compose_opa.log.read_text(), "not in the console decision log"
    # The lock-down: no token, no decision; the token opens nothing but decisions.
    assert requests.post(decision, json={"input": {}}, timeout=5).status_code == 401
    for path in ("/v1/policies", "/v1/data/sessionstate/read_test"):
        refused = requests.get(
            compose_opa.url + path,
            headers={"Authorization": f"Bearer {compose_opa.token}"},
            timeout=5,
        )
        assert refused.status_code == 401, path


def test_compose_bundle_arguments_load_exactly_the_hashed_files(
    opa_bin: str, tmp_path: Path
) -> None:
    """`--bundle` plus `--ignore '*_test.rego'`: OPA holds the files the revision hashes.

    The locked-down OPA cannot list its policies, so this runs the compose command
    without the two lock-down flags, briefly, on another loopback port.
    """
    addr = f"127.0.0.1:{free_port()}"
    (bundle_dir,) = flag_value(opa_command(), "--bundle")
    argv = [opa_bin] + [
        str(POLICY_DIR) if arg == bundle_dir else arg.replace(OPA_ADDR, addr)
        for arg in opa_command()
        if arg not in {"--authentication=token", "--authorization=basic"}
    ]
    log = tmp_path / "opa.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        listed = None
        deadline = time.monotonic() + 20
        while listed is None and time.monotonic() < deadline:
            try:
                listed = requests.get(f"http://{addr}/v1/policies", timeout=0.5).json()["result"]
            except requests.RequestException:
                time.sleep(0.05)
        assert listed is not None, log.read_text()
        # OPA names a file of a bundle directory by that directory and the file's path.
        loaded = sorted(policy["id"].rsplit(str(POLICY_DIR), 1)[1] for policy in listed)
    finally:
        process.terminate()
        process.wait(10)
    # The data documents (tenant settings) are data, not policies: OPA lists only the Rego.
    assert loaded == [name for name, _ in policy_files(POLICY_DIR) if name.endswith(".rego")]


def test_compose_opa_healthcheck_checks_the_server(opa_bin: str, compose_opa: ComposeOpa) -> None:
    assert _opa_healthcheck(opa_bin, compose_opa) == 0
    pause(compose_opa.process.pid)
    try:
        assert _opa_healthcheck(opa_bin, compose_opa) != 0, "a hung OPA must be unhealthy"
    finally:
        compose_opa.process.send_signal(signal.SIGCONT)
    assert _opa_healthcheck(opa_bin, compose_opa) == 0


def test_service_configured_as_in_compose_is_ready_with_the_manifest_revision(
    compose_opa: ComposeOpa, tmp_path: Path
) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONSTATE_")}
    env |= image_env()
    for key, value in SERVICES[SERVICE]["environment"].items():
        reference = REQUIRED_REF.match(str(value))
        env[key] = (
            "s" * 40
            if reference
            else compose_opa.rewrite(re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value)))
        )
    env |= {
        TOKEN_ENV: compose_opa.token,
        "SESSIONSTATE_DATA_DIR": str(tmp_path / "data"),
        "SESSIONSTATE_HOST": "127.0.0.1",  # 0.0.0.0 inside the container's namespace
        "SESSIONSTATE_PORT": str(port),
    }
    env.pop("SESSIONSTATE_OPA_BIN")  # with SESSIONSTATE_OPA_URL set, no OPA is started
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        ready = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            try:
                answer = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=1)
                if answer.status_code == 200:
                    ready = answer.json()
                    break
            except requests.RequestException:
                pass
            time.sleep(0.1)
        assert ready is not None, log.read_text()[-3000:]
        revision = load_bundle(POLICY_DIR).revision
        assert ready["policy_revision"] == revision
        check = [sys.executable, *SERVICES[SERVICE]["healthcheck"]["test"][2:]]
        assert subprocess.run(check, env=env, capture_output=True, timeout=10).returncode == 0
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)


# --- docker-compose.ha.yml ---------------------------------------------------------------

HA_SECRETS = (TOKEN_ENV, "SESSIONSTATE_IDENTITY")


def _ha_config(
    compose_bin: str, tmp_path: Path, names: tuple[str, ...]
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONSTATE_")}
    clean["DOCKER_HOST"] = f"unix://{tmp_path}/no-docker.sock"
    env_file = tmp_path / "ha.env"
    env_file.write_text("".join(f"{name}={'x' * 40}\n" for name in names))
    return subprocess.run(
        [
            compose_bin,
            "-f",
            "docker-compose.ha.yml",
            "--env-file",
            str(env_file),
            "config",
            "--format",
            "json",
        ],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_ha_compose_is_postgresql_and_two_replicas_each_with_its_sidecar(
    compose_bin: str, tmp_path: Path
) -> None:
    refused = _ha_config(compose_bin, tmp_path, HA_SECRETS)  # no PostgreSQL password
    assert refused.returncode != 0 and "SESSIONSTATE_POSTGRES_PASSWORD" in refused.stderr
    done = _ha_config(compose_bin, tmp_path, (*HA_SECRETS, "SESSIONSTATE_POSTGRES_PASSWORD"))
    assert done.returncode == 0, done.stderr
    resolved = json.loads(done.stdout)
    services = resolved["services"]
    postgres = services["postgres"]
    assert postgres["image"].startswith("postgres:15")
    assert any(
        v["target"] == "/var/lib/postgresql/data" and v["type"] == "volume"
        for v in postgres["volumes"]
    )
    assert services["schema"]["command"] == ["sessionstate", "db", "upgrade"]
    # One deployment identity: the one secret, mounted into the schema job and both replicas.
    assert set(resolved["secrets"]) == {"identity"}
    for name in ("schema", "sessionstate-1", "sessionstate-2"):
        environment = services[name]["environment"]
        assert [mount["source"] for mount in services[name]["secrets"]] == ["identity"]
        assert environment["SESSIONSTATE_SECRETS_DIR"] == "/run/secrets/identity"
        assert not {"SESSIONSTATE_JWT_SECRET", "SESSIONSTATE_DIGEST_KEY"} & set(environment)
    for replica in ("1", "2"):
        service, opa = services[f"sessionstate-{replica}"], services[f"opa-{replica}"]
        assert service["environment"]["SESSIONSTATE_STORE"].startswith("postgresql://sessionstate:")
        assert service["environment"]["SESSIONSTATE_OPA_URL"] == "http://127.0.0.1:8181"
        assert service["depends_on"]["schema"]["condition"] == "service_completed_successfully"
        assert opa["network_mode"] == f"service:sessionstate-{replica}"
        assert opa["depends_on"][f"sessionstate-{replica}"]["restart"] is True
        assert "ports" not in opa
        assert opa["command"] == opa_command()  # the policy directory, unsigned, by default
        assert {p["host_ip"] for p in service["ports"]} == {"127.0.0.1"}
    text = (ROOT / "docker-compose.ha.yml").read_text()
    for name in (*HA_SECRETS, "SESSIONSTATE_POSTGRES_PASSWORD"):
        assert re.search(r"\$\{" + name + r":\?", text), name  # required, never a literal


def _compose_opa_argv(compose_bin: str, tmp: Path, extra: dict[str, str]) -> list[str]:
    """docker-compose.yml's OPA argv as Compose resolves it with `extra` in the environment,
    each container path of a mount replaced by its host path."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONSTATE_")}
    clean["DOCKER_HOST"] = f"unix://{tmp}/no-docker.sock"
    env_file = tmp / "compose.env"
    env_file.write_text(
        f"{TOKEN_ENV}={'t' * 43}\n"
        f"SESSIONSTATE_JWT_SECRET={'j' * 40}\nSESSIONSTATE_DIGEST_KEY={'d' * 40}\n"
    )
    resolved = subprocess.run(
        [compose_bin, "--env-file", str(env_file), "config", "--format", "json"],
        cwd=ROOT,
        env=clean | extra,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert resolved.returncode == 0, resolved.stderr
    opa = json.loads(resolved.stdout)["services"][OPA]
    mounts = {volume["target"]: volume["source"] for volume in opa["volumes"]}
    argv = []
    for arg in opa["command"]:
        for target, source in mounts.items():
            if arg == target or arg.endswith("=" + target):
                arg = arg[: len(arg) - len(target)] + source
        argv.append(arg)
    return argv


def _compose_opa_activates(opa_bin: str, argv: list[str], tmp: Path) -> bool:
    """Whether OPA, run with argv on a free port, activates its bundle (health?bundles)."""
    addr = f"127.0.0.1:{free_port()}"
    argv = [opa_bin] + [arg.replace(OPA_ADDR, addr) for arg in argv]
    with open(tmp / f"opa-{addr.split(':')[1]}.log", "wb") as out:
        process = subprocess.Popen(
            argv,
            env={"PATH": os.environ.get("PATH", ""), TOKEN_ENV: "t" * 40},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and process.poll() is None:
            try:
                answer = requests.get(f"http://{addr}/health?bundles", timeout=0.5)
                if answer.status_code == 200:
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.1)
        return False
    finally:
        process.kill()
        process.wait()


def test_compose_opa_activates_only_a_signed_bundle_that_verifies(
    compose_bin: str, opa_bin: str, tmp_path: Path
) -> None:
    """SESSIONSTATE_POLICY_BUNDLE and _VERIFICATION_KEY in the compose environment: OPA's own
    signature check (--verification-key) admits the signed bundle, and nothing else."""
    from tests.policy.test_signed_bundles import Keys, build, policies_copy, tampered, unsigned

    keys = Keys(tmp_path / "keys")
    private, public = keys.pair("security-team")
    _, other_public = keys.pair("someone-else")
    signed = build(opa_bin, policies_copy(tmp_path), private, tmp_path / "signed.tar.gz")
    bad_copy = tampered(signed, tmp_path / "tampered.tar.gz")
    bare = unsigned(opa_bin, POLICY_DIR, tmp_path / "unsigned.tar.gz", tmp_path)

    def activates(bundle: Path | None, key: Path | None) -> bool:
        extra = {}
        if bundle is not None:
            extra["SESSIONSTATE_POLICY_BUNDLE"] = str(bundle)
        if key is not None:
            extra["SESSIONSTATE_POLICY_VERIFICATION_KEY"] = str(key)
        return _compose_opa_activates(
            opa_bin, _compose_opa_argv(compose_bin, tmp_path, extra), tmp_path
        )

    assert activates(None, None), "the policy directory, unsigned, as before"
    assert activates(signed, public)
    assert not activates(bad_copy, public), "a bundle changed after signing"
    assert not activates(bare, public), "an unsigned bundle"
    assert not activates(signed, other_public), "signed with another key"
    assert not activates(signed, None), "a bundle without a key to verify it with"
