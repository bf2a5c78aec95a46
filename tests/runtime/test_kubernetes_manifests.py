"""The Kubernetes manifests (deploy/kubernetes, kustomize).

No Kubernetes cluster runs where this project is built and tested, so nothing here
applies a manifest. Instead: the pinned kustomize (scripts/tools.sh) builds the
directory as `kubectl apply -k` would; the Go check beside the manifests
(deploy/kubernetes/check) decodes every document of the files and of that build strictly
into the k8s.io/api types (of the CloudNativePG Cluster, its envelope and metadata),
and is shown to fail on a manifest with an unknown field; the promises of
docs/deployment.md ("Kubernetes") are asserted on the built objects; and what runs
without a cluster does run: the policies init container's command, the OPA container's
exact argv with the pinned OPA, its liveness command, and the service with the pod's
settings against that OPA.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
import requests
import yaml

from service.policy.bundle import load_bundle
from service.policy.sidecar import TOKEN_ENV
from tests.runtime.test_deployment import (
    SECRET_NAME,
    flag_value,
    image_env,
    opa_command,
    opa_version,
    sidecar_command,
)
from tests.support import postgres as pg
from tests.support.go_tools import go_tool
from tests.support.paths import POLICY_DIR, ROOT
from tests.support.ports import free_port

KUBERNETES = ROOT / "deploy" / "kubernetes"
CHECK = KUBERNETES / "check"
OPA_ADDR = "127.0.0.1:8181"
IDENTITY = "sessionstate-identity"
# The four files of `sessionstate secrets init`, the deployment identity.
IDENTITY_FILES = ["jwt.secret", "digest.key", "checkpoint.key", "token-signing-key.pem"]
# Where the Dockerfile puts the policies in the image (COPY policies/ ...).
IMAGE_POLICIES = "/opt/sessionstate/policies"


def go_env() -> dict[str, str]:
    go = shutil.which("go")
    assert go, "Go is needed for the manifests' strict check (https://go.dev/dl)"
    return os.environ | {"GOFLAGS": "-buildvcs=false", "GOTOOLCHAIN": "local"}


def kustomize_build(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(go_tool("kustomize")), "build", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def k8scheck(*files: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The Go check (deploy/kubernetes/check) on FILEs, `-` reading `stdin`."""
    return subprocess.run(
        ["go", "run", ".", *files],
        cwd=CHECK,
        input=stdin,
        env=go_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def built() -> list[dict[str, Any]]:
    """`kustomize build deploy/kubernetes`: what `kubectl apply -k` sends."""
    done = kustomize_build(KUBERNETES)
    assert done.returncode == 0, done.stderr
    return [document for document in yaml.safe_load_all(done.stdout) if document]


def only(built: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [document for document in built if document["kind"] == kind]
    return found


def pod(built: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    spec: dict[str, Any] = only(built, kind)["spec"]["template"]["spec"]
    return spec


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod_spec["containers"] if c["name"] == name]
    return found


def env_of(pod_container: dict[str, Any]) -> dict[str, Any]:
    return {entry["name"]: entry for entry in pod_container.get("env", [])}


def config(built: list[dict[str, Any]]) -> dict[str, str]:
    data: dict[str, str] = only(built, "ConfigMap")["data"]
    return data


def settings_of(built: list[dict[str, Any]], pod_container: dict[str, Any]) -> dict[str, Any]:
    """The container's environment as the kubelet builds it: the ConfigMap, then `env`."""
    (source,) = pod_container["envFrom"]
    assert source["configMapRef"]["name"] == only(built, "ConfigMap")["metadata"]["name"]
    return {**config(built), **env_of(pod_container)}


# --- kustomize build and the strict Go check -------------------------------------------


def test_kustomize_builds_and_every_document_decodes_strictly_into_the_api_types() -> None:
    done = subprocess.run(
        ["go", "test", "-count=1", "-v", "."],
        cwd=CHECK,
        env=go_env() | {"KUSTOMIZE": str(go_tool("kustomize"))},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    for test in (
        "TestEveryManifestDecodesStrictly",
        "TestTheKustomizeBuildDecodesStrictly",
        "TestWhatFailsTheCheck",
    ):
        assert f"--- PASS: {test} " in done.stdout, done.stdout
    unformatted = subprocess.run(
        ["gofmt", "-l", "."], cwd=CHECK, capture_output=True, text=True, timeout=60
    )
    assert (unformatted.returncode, unformatted.stdout) == (0, "")


def test_a_manifest_with_an_unknown_field_fails_the_check(tmp_path: Path) -> None:
    copy = tmp_path / "kubernetes"
    copy.mkdir()
    for manifest in KUBERNETES.glob("*.yaml"):
        shutil.copy2(manifest, copy)
    files = sorted(str(path) for path in copy.glob("*.yaml"))
    passed = k8scheck(*files)
    assert passed.returncode == 0, passed.stderr
    assert passed.stdout.count("ok ") == len(files)

    deployment = copy / "deployment.yaml"
    text = deployment.read_text()
    assert "\n  replicas: 2\n" in text
    deployment.write_text(text.replace("\n  replicas: 2\n", "\n  replicas: 2\n  replica: 2\n"))
    failed = k8scheck(str(deployment))
    assert failed.returncode == 1
    assert 'unknown field "spec.replica"' in failed.stderr
    # kustomize builds it all the same: only the strict decoding catches it.
    build = kustomize_build(copy)
    assert build.returncode == 0, build.stderr
    assert "replica: 2" in build.stdout
    assert k8scheck("-", stdin=build.stdout).returncode == 1

    cluster = copy / "postgres-cluster.yaml"
    text = cluster.read_text()
    assert "\nmetadata:\n" in text
    cluster.write_text(text.replace("\nmetadata:\n", "\nmetadata:\n  label: {a: b}\n"))
    failed = k8scheck(str(cluster))
    assert failed.returncode == 1
    assert 'unknown field "metadata.label"' in failed.stderr


def test_the_build_holds_each_manifest_of_the_docs(built: list[dict[str, Any]]) -> None:
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in built)
    assert kinds == [
        "Cluster/sessionstate-db",
        "ConfigMap/sessionstate-config",
        "Deployment/sessionstate",
        "Job/sessionstate-db-upgrade",
        "NetworkPolicy/sessionstate",
        "PodDisruptionBudget/sessionstate",
        "Service/sessionstate",
    ]
    assert {d["metadata"]["namespace"] for d in built} == {"sessionstate"}
    doc = (ROOT / "docs" / "deployment.md").read_text()
    for manifest in sorted(KUBERNETES.glob("*.yaml")):
        assert f"`deploy/kubernetes/{manifest.name}`" in doc, manifest.name


# --- the pod: the service and its OPA --------------------------------------------------


def test_two_replicas_on_postgresql_kept_by_a_disruption_budget(
    built: list[dict[str, Any]],
) -> None:
    deployment = only(built, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    budget = only(built, "PodDisruptionBudget")["spec"]
    assert budget["selector"]["matchLabels"] == labels
    assert 1 <= budget["minAvailable"] < deployment["spec"]["replicas"]
    service = only(built, "Service")["spec"]
    assert service["selector"] == labels
    assert [(p["port"], p["targetPort"]) for p in service["ports"]] == [(8080, "http")]


def test_opa_is_the_second_container_on_the_pods_loopback_only(
    built: list[dict[str, Any]],
) -> None:
    spec = pod(built, "Deployment")
    assert [c["name"] for c in spec["containers"]] == ["sessionstate", "opa"]
    opa = container(spec, "opa")
    assert flag_value(opa["args"], "--addr") == [OPA_ADDR]
    assert "ports" not in opa, "OPA must publish no port"
    assert not spec.get("hostNetwork"), "the pod's loopback must be its own"
    service = container(spec, "sessionstate")
    assert settings_of(built, service)["SESSIONSTATE_OPA_URL"] == f"http://{OPA_ADDR}"
    assert [p["containerPort"] for p in service["ports"]] == [8080]
    assert image_env()["SESSIONSTATE_PORT"] == "8080"


def test_opa_runs_pinned_with_the_flags_of_compose_and_the_local_sidecar(
    built: list[dict[str, Any]],
) -> None:
    opa = container(pod(built, "Deployment"), "opa")
    assert opa["image"] == f"openpolicyagent/opa:{opa_version()}"
    # docker-compose.yml's OPA, without its optional signed-bundle flags.
    compose = [arg for arg in opa_command() if not arg.startswith(("--verification", "--sign"))]
    assert opa["args"] == compose
    local = sidecar_command()
    for flag in ("--authentication=token", "--authorization=basic", "--skip-version-check"):
        assert flag in local and flag in opa["args"], flag


def test_opa_loads_the_images_policies_read_only(built: list[dict[str, Any]]) -> None:
    spec = pod(built, "Deployment")
    (copier,) = spec["initContainers"]
    assert copier["image"] == container(spec, "sessionstate")["image"]
    assert copier["command"] == ["cp", "-R", f"{IMAGE_POLICIES}/.", "/policies/"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"COPY policies/ {IMAGE_POLICIES}/" in dockerfile
    opa = container(spec, "opa")
    (mount,) = opa["volumeMounts"]
    (written,) = copier["volumeMounts"]
    assert mount["name"] == written["name"] and mount["readOnly"] is True
    assert flag_value(opa["args"], "--bundle") == [mount["mountPath"]]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes[mount["name"]]


def test_only_the_opa_token_reaches_opa(built: list[dict[str, Any]]) -> None:
    spec = pod(built, "Deployment")
    opa = container(spec, "opa")
    assert set(env_of(opa)) == {TOKEN_ENV}
    assert "envFrom" not in opa
    token = env_of(opa)[TOKEN_ENV]["valueFrom"]["secretKeyRef"]
    service_token = env_of(container(spec, "sessionstate"))[TOKEN_ENV]["valueFrom"]
    assert token == service_token["secretKeyRef"] == {"name": IDENTITY, "key": "opa-token"}
    authz = (POLICY_DIR / "system" / "authz" / "authz.rego").read_text()
    assert f"opa.runtime().env.{TOKEN_ENV}" in authz


def test_probes_ask_healthz_and_readyz(built: list[dict[str, Any]]) -> None:
    service = container(pod(built, "Deployment"), "sessionstate")
    paths = {
        probe: (service[probe]["httpGet"]["path"], service[probe]["httpGet"]["port"])
        for probe in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert paths == {
        "startupProbe": ("/healthz", "http"),
        "livenessProbe": ("/healthz", "http"),
        "readinessProbe": ("/readyz", "http"),
    }
    # OPA is on the loopback, where the kubelet's httpGet cannot go: an exec probe.
    opa = container(pod(built, "Deployment"), "opa")
    assert opa["livenessProbe"]["exec"]["command"][:2] == ["/opa", "eval"]


def test_every_container_requests_resources_and_caps_its_memory(
    built: list[dict[str, Any]],
) -> None:
    for kind in ("Deployment", "Job"):
        spec = pod(built, kind)
        for each in spec["containers"] + spec.get("initContainers", []):
            resources = each["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), (kind, each["name"])
            assert "memory" in resources["limits"], (kind, each["name"])


def test_containers_run_unprivileged_on_read_only_roots(built: list[dict[str, Any]]) -> None:
    for kind in ("Deployment", "Job"):
        spec = pod(built, kind)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["automountServiceAccountToken"] is False
        for each in spec["containers"] + spec.get("initContainers", []):
            context = each["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, each["name"]
            assert context["allowPrivilegeEscalation"] is False, each["name"]
            assert context["capabilities"]["drop"] == ["ALL"], each["name"]
            if each["image"].startswith("sessionstate"):
                # The Dockerfile's user, uid and gid 10001.
                assert (context["runAsUser"], context["runAsGroup"]) == (10001, 10001)


# --- the secrets: one Secret, mounted read-only, and no value in any manifest ----------


def test_the_identity_is_one_secret_mounted_read_only(built: list[dict[str, Any]]) -> None:
    for kind, name in (("Deployment", "sessionstate"), ("Job", "db-upgrade")):
        spec = pod(built, kind)
        identity = [v for v in spec["volumes"] if "secret" in v]
        assert [v["secret"]["secretName"] for v in identity] == [IDENTITY], kind
        (volume,) = identity
        assert volume["secret"]["defaultMode"] == 0o400
        assert [item["key"] for item in volume["secret"]["items"]] == IDENTITY_FILES
        assert [item["path"] for item in volume["secret"]["items"]] == IDENTITY_FILES
        mounts = [
            (each["name"], mount)
            for each in spec["containers"]
            for mount in each["volumeMounts"]
            if mount["name"] == volume["name"]
        ]
        assert [owner for owner, _ in mounts] == [name], "only the service reads the identity"
        ((_, mount),) = mounts
        assert mount["readOnly"] is True
        settings = settings_of(built, container(spec, name))
        assert settings["SESSIONSTATE_SECRETS_DIR"] == mount["mountPath"]
        # The group the Secret's files are given is the image's sessionstate group.
        assert spec["securityContext"]["fsGroup"] == 10001


def test_the_database_uri_comes_from_cloudnativepgs_app_secret(
    built: list[dict[str, Any]],
) -> None:
    cluster = only(built, "Cluster")
    app_secret = f"{cluster['metadata']['name']}-app"  # what CloudNativePG names it
    assert cluster["spec"]["bootstrap"]["initdb"] == {
        "database": "sessionstate",
        "owner": "sessionstate",
    }
    # Its spec is not checked against CloudNativePG's types here: what the deployment relies
    # on is asserted (a commit waits for one synchronous standby, always).
    assert cluster["spec"]["instances"] >= 2
    assert cluster["spec"]["postgresql"]["synchronous"] == {
        "method": "any",
        "number": 1,
        "dataDurability": "required",
    }
    for kind, name in (("Deployment", "sessionstate"), ("Job", "db-upgrade")):
        store = env_of(container(pod(built, kind), name))["SESSIONSTATE_STORE"]
        assert store["valueFrom"]["secretKeyRef"] == {"name": app_secret, "key": "uri"}


def test_no_secret_value_is_in_any_manifest(built: list[dict[str, Any]]) -> None:
    assert not [d for d in built if d["kind"] == "Secret"]
    for name in config(built):
        assert not SECRET_NAME.search(name) or name == "SESSIONSTATE_SECRETS_DIR", name
    for kind in ("Deployment", "Job"):
        spec = pod(built, kind)
        for each in spec["containers"] + spec.get("initContainers", []):
            for name, entry in env_of(each).items():
                if SECRET_NAME.search(name) or name == "SESSIONSTATE_STORE":
                    assert set(entry) == {"name", "valueFrom"}, (kind, name)
                    assert set(entry["valueFrom"]) == {"secretKeyRef"}, (kind, name)
    for manifest in KUBERNETES.glob("*.yaml"):
        text = manifest.read_text()
        for shape in (r"hex:[0-9a-f]{16}", r"-----BEGIN", r"postgres(ql)?://[^@\s]*:[^@\s]*@"):
            assert not re.search(shape, text), (manifest.name, shape)


# --- the schema Job and the network policy ---------------------------------------------


def test_the_job_runs_db_upgrade_with_the_replicas_settings(built: list[dict[str, Any]]) -> None:
    spec = pod(built, "Job")
    job = container(spec, "db-upgrade")
    assert job["command"] == ["sessionstate", "db", "upgrade"]
    assert spec["restartPolicy"] == "Never"
    assert job["image"] == container(pod(built, "Deployment"), "sessionstate")["image"]
    assert job["envFrom"] == container(pod(built, "Deployment"), "sessionstate")["envFrom"]
    data = [m["mountPath"] for m in job["volumeMounts"]]
    assert image_env()["SESSIONSTATE_DATA_DIR"] in data
    # docs/deployment.md applies the Job alone with `-l app.kubernetes.io/component=db-upgrade`.
    selected = [
        d["kind"]
        for d in built
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "db-upgrade"
    ]
    assert selected == ["Job"]


def test_the_network_policy_admits_the_service_port_alone(built: list[dict[str, Any]]) -> None:
    policy = only(built, "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    selected = policy["podSelector"]["matchLabels"]
    for kind in ("Deployment", "Job"):
        labels = only(built, kind)["spec"]["template"]["metadata"]["labels"]
        assert selected.items() <= labels.items(), kind
    admitted = [port for rule in policy["ingress"] for port in rule["ports"]]
    assert admitted == [{"protocol": "TCP", "port": 8080}]
    assert OPA_ADDR.rsplit(":", 1)[1] not in str(policy["ingress"])
    egress = sorted((p["protocol"], p["port"]) for rule in policy["egress"] for p in rule["ports"])
    assert egress == [("TCP", 53), ("TCP", 5432), ("UDP", 53)]
    cluster = only(built, "Cluster")["metadata"]["name"]
    database = [rule for rule in policy["egress"] if rule["ports"][0]["port"] == 5432]
    assert database[0]["to"] == [{"podSelector": {"matchLabels": {"cnpg.io/cluster": cluster}}}]


# --- what runs without a cluster -------------------------------------------------------


@dataclass
class PodOpa:
    url: str
    token: str
    args: list[str]
    probe: list[str]


@pytest.fixture(scope="module")
def pod_opa(
    built: list[dict[str, Any]], opa_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PodOpa]:
    """The policies init container's command, then the OPA container's argv, with the pinned
    OPA on a free loopback port and the paths moved under a temporary directory."""
    spec = pod(built, "Deployment")
    root = tmp_path_factory.mktemp("pod")
    (copier,) = spec["initContainers"]
    image = root / IMAGE_POLICIES.lstrip("/")
    shutil.copytree(POLICY_DIR, image)  # what the Dockerfile's COPY leaves in the image
    (root / "policies").mkdir()
    command = [arg.replace("/opt/", f"{root}/opt/") for arg in copier["command"]]
    command[-1] = f"{root}/policies/"
    subprocess.run(command, check=True, timeout=30)

    opa = container(spec, "opa")
    addr = f"127.0.0.1:{free_port()}"
    args = [
        f"{root}/policies" if arg == "/policies" else arg.replace(OPA_ADDR, addr)
        for arg in opa["args"]
    ]
    token = "t" * 40
    log = root / "opa.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [opa_bin, *args], env={TOKEN_ENV: token}, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://{addr}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/health", timeout=0.5).status_code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(0.05)
    else:
        process.kill()
        raise AssertionError("the pod's OPA argv did not start:\n" + log.read_text())
    probe = [
        opa_bin,
        *(a.replace(OPA_ADDR, addr) for a in opa["livenessProbe"]["exec"]["command"][1:]),
    ]
    yield PodOpa(url, token, args, probe)
    process.terminate()
    process.wait(10)


def test_the_pods_opa_serves_the_images_policies_locked_down(pod_opa: PodOpa) -> None:
    decision = f"{pod_opa.url}/v1/data/sessionstate/read/decision?provenance=true"
    answer = requests.post(
        decision,
        json={"input": {"action": "read"}},
        headers={"Authorization": f"Bearer {pod_opa.token}"},
        timeout=5,
    )
    assert answer.status_code == 200, answer.text
    revisions = [b["revision"] for b in answer.json()["provenance"]["bundles"].values()]
    assert revisions == [load_bundle(POLICY_DIR).revision]
    assert answer.json()["decision_id"]
    assert requests.post(decision, json={"input": {}}, timeout=5).status_code == 401
    refused = requests.get(
        pod_opa.url + "/v1/policies",
        headers={"Authorization": f"Bearer {pod_opa.token}"},
        timeout=5,
    )
    assert refused.status_code == 401


def test_the_opa_liveness_command_checks_the_server(pod_opa: PodOpa) -> None:
    assert subprocess.run(pod_opa.probe, capture_output=True, timeout=15).returncode == 0


def secret_volume(folder: Path) -> Path:
    """The deployment identity as the kubelet mounts the Secret (`defaultMode: 0400`,
    `fsGroup` adding group read): `sessionstate secrets init`'s files behind `..data`,
    each name a link into it, as an atomic-writer volume lays them out."""
    made = subprocess.run(
        [sys.executable, "-m", "service.cli", "secrets", "init", "--out", str(folder / "made")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    volume = folder / "volume"
    timestamped = volume / "..2026_12_03_00_00_00.000000000"
    timestamped.mkdir(parents=True)
    for name in IDENTITY_FILES:
        shutil.copyfile(folder / "made" / name, timestamped / name)
        (timestamped / name).chmod(0o440)
        (volume / name).symlink_to(Path("..data") / name)
    (volume / "..data").symlink_to(timestamped.name)
    return volume


def container_env(
    built: list[dict[str, Any]],
    kind: str,
    name: str,
    pod_opa: PodOpa,
    secrets: dict[tuple[str, str], str],
    data_dir: Path,
    identity: Path,
) -> dict[str, str]:
    """A container's environment as the kubelet builds it (the image's, the ConfigMap's, the
    container's `env` with each secretKeyRef resolved from `secrets`), run here: the pod's
    OPA address is the test's, the data dir a temporary one, and the identity the Secret
    volume `identity` (`secret_volume`) where the pod mounts it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONSTATE_")}
    env |= image_env()
    for variable, value in settings_of(built, container(pod(built, kind), name)).items():
        if isinstance(value, str):
            env[variable] = value.replace(OPA_ADDR, pod_opa.url.removeprefix("http://"))
        else:
            reference = value["valueFrom"]["secretKeyRef"]
            env[variable] = secrets[reference["name"], reference["key"]]
    env.pop("SESSIONSTATE_OPA_BIN")  # with SESSIONSTATE_OPA_URL set, no OPA is started
    env["SESSIONSTATE_SECRETS_DIR"] = str(identity)
    env["SESSIONSTATE_DATA_DIR"] = str(data_dir)
    return env


@contextmanager
def serving(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`sessionstate serve` (the image's CMD) with `env`, stopped with SIGTERM at the end."""
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
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)


def ready(process: subprocess.Popen[bytes], url: str, log: Path) -> dict[str, Any]:
    """The first 200 answer of `url` (the readiness probe's), within 30 s."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        try:
            answer = requests.get(url, timeout=1)
            if answer.status_code == 200:
                body: dict[str, Any] = answer.json()
                return body
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise AssertionError(log.read_text()[-3000:])


def test_the_service_with_the_pods_settings_is_ready_on_the_probe_paths(
    built: list[dict[str, Any]], pod_opa: PodOpa, tmp_path: Path
) -> None:
    """The service container as the pod runs it, with the pod's OPA; its store is the image's
    default here (PostgreSQL: the next test)."""
    secrets = {(IDENTITY, "opa-token"): pod_opa.token, ("sessionstate-db-app", "uri"): ""}
    identity = secret_volume(tmp_path / "identity")
    env = container_env(
        built, "Deployment", "sessionstate", pod_opa, secrets, tmp_path / "data", identity
    )
    port = free_port()
    env |= {
        "SESSIONSTATE_HOST": "127.0.0.1",  # 0.0.0.0 inside the pod's namespace
        "SESSIONSTATE_PORT": str(port),
    }
    env.pop("SESSIONSTATE_STORE")
    service = container(pod(built, "Deployment"), "sessionstate")
    probes = {
        probe: f"http://127.0.0.1:{port}{service[probe]['httpGet']['path']}"
        for probe in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    log = tmp_path / "serve.log"
    with serving(env, log) as process:
        answer = ready(process, probes["readinessProbe"], log)
        assert answer["policy_revision"] == load_bundle(POLICY_DIR).revision
        for url in probes.values():
            assert requests.get(url, timeout=5).status_code == 200, url


@pytest.mark.slow
def test_a_replica_waits_for_the_job_then_serves_on_postgresql(
    built: list[dict[str, Any]], pod_opa: PodOpa, postgres: pg.PostgresServer, tmp_path: Path
) -> None:
    """The order `kubectl apply -k` leaves to Kubernetes: a replica started before the Job
    has run refuses the database without its schema (exit 2, one line; Kubernetes restarts
    it), the Job's command with its settings creates the schema, and a replica then
    serves on it. The database URI has the form CloudNativePG's `uri` key holds."""
    parts = psycopg.conninfo.conninfo_to_dict(postgres.create_database())
    uri = (
        f"postgresql://{parts['user']}:{quote(str(parts['password']), safe='')}"
        f"@{parts['host']}:{parts['port']}/{parts['dbname']}"
    )
    secrets = {(IDENTITY, "opa-token"): pod_opa.token, ("sessionstate-db-app", "uri"): uri}
    port = free_port()
    identity = secret_volume(tmp_path / "identity")
    replica = container_env(
        built, "Deployment", "sessionstate", pod_opa, secrets, tmp_path / "replica", identity
    )
    replica |= {"SESSIONSTATE_HOST": "127.0.0.1", "SESSIONSTATE_PORT": str(port)}

    early = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve"],
        env=replica,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert early.returncode == 2, early.stdout + early.stderr
    assert "no sessionstate schema yet: run `sessionstate db upgrade`" in early.stderr
    assert "Traceback" not in early.stderr and str(parts["password"]) not in early.stderr

    job = container(pod(built, "Job"), "db-upgrade")
    assert job["command"][0] == "sessionstate"
    upgraded = subprocess.run(
        [sys.executable, "-m", "service.cli", *job["command"][1:]],
        env=container_env(built, "Job", "db-upgrade", pod_opa, secrets, tmp_path / "job", identity),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert upgraded.returncode == 0, upgraded.stderr
    done = json.loads(upgraded.stdout)
    assert (done["store"], done["found"], done["changed"]) == ("postgresql", 0, True)
    assert done["key_ids"]["checkpoint_key"].startswith("ed25519:")  # the Secret's, recorded

    readiness = container(pod(built, "Deployment"), "sessionstate")["readinessProbe"]
    log = tmp_path / "serve.log"
    with serving(replica, log) as process:
        answer = ready(process, f"http://127.0.0.1:{port}{readiness['httpGet']['path']}", log)
    assert answer["store"]["kind"] == "postgresql" and answer["store"]["reachable"] is True
    assert answer["policy_revision"] == load_bundle(POLICY_DIR).revision
    assert not (tmp_path / "replica" / "secrets").exists()  # every secret from the volume
