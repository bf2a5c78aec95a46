"""One deployment identity, as an operator runs two replicas on one PostgreSQL (issue 31).

`sessionstate secrets init` makes the secrets once; `db upgrade` and both replicas read them
from `SESSIONSTATE_SECRETS_DIR`. Then a token minted or exchanged on one replica is honoured
by the other, one body gets one digest whichever replica stored it, and both sign the
decision log with one key a reviewer pins once. The store records the identity's key ids
at `db upgrade`; a replica (or a `db upgrade`) with other keys is refused before it serves,
in one line that names the variable and shows no value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from service.auth.tokens import mint_token
from store.secrets import SecretsHome
from tests.config.test_secrets import cli
from tests.runtime.test_postgres_service import stop
from tests.support import postgres as pg
from tests.support.factories import state_input
from tests.support.live import DIGEST_KEY
from tests.support.served import ROOT, Served, start

TENANT, WORKSPACE = "acme", "support"
SESSION = f"/v1/tenants/{TENANT}/workspaces/{WORKSPACE}/sessions"
GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TYPE = "urn:ietf:params:oauth:token-type:jwt"

pytestmark = pytest.mark.skipif(pg.unavailable_reason() is not None, reason="no PostgreSQL")


def identity(folder: Path) -> dict[str, Any]:
    made = cli("secrets", "init", "--out", str(folder), env={})
    assert made.returncode == 0, made.stderr
    said: dict[str, Any] = json.loads(made.stdout)
    return said


def upgrade(conninfo: str, tmp: Path, secrets: Path | None) -> subprocess.CompletedProcess[str]:
    env = {"SESSIONSTATE_STORE": conninfo, "SESSIONSTATE_DATA_DIR": str(tmp / "admin")}
    if secrets is not None:
        env["SESSIONSTATE_SECRETS_DIR"] = str(secrets)
    return cli("db", "upgrade", env=env)


@pytest.fixture
def deployment(postgres: pg.PostgresServer, opa_bin: str, tmp_path: Path) -> Iterator[Any]:
    """A database upgraded under one provisioned identity, and a way to start replicas."""
    secrets = tmp_path / "identity"
    said = identity(secrets)
    conninfo = postgres.create_database()
    upgraded = upgrade(conninfo, tmp_path, secrets)
    assert upgraded.returncode == 0, upgraded.stderr
    recorded = json.loads(upgraded.stdout)["key_ids"]
    assert recorded == {
        "digest_key": said["digest_key_id"],
        "checkpoint_key": said["checkpoint_key_id"],
    }
    started: list[Served] = []

    def replica(name: str, **env: str) -> Served:
        served = start(
            opa_bin,
            tmp_path / f"var-{name}",
            tmp_path,
            {
                "SESSIONSTATE_STORE": conninfo,
                "SESSIONSTATE_SECRETS_DIR": str(secrets),
                "SESSIONSTATE_RATE_LIMIT": "off",
                **env,
            },
            env_secrets=False,
        )
        started.append(served)
        return served

    try:
        yield secrets, said, conninfo, replica
    finally:
        for served in started:
            stop(served)


def test_two_replicas_of_one_identity_honour_each_others_tokens_digests_and_key(
    deployment: Any, tmp_path: Path
) -> None:
    secrets, said, _, replica = deployment
    a, b = replica("a"), replica("b")
    home = SecretsHome.provisioned_at(secrets)

    # An operator token from the CLI (reading the folder) approves writes on either replica.
    minted = cli(
        "token", "--sub", "op", "--role", "operator", "--tenant", TENANT,
        env={"SESSIONSTATE_SECRETS_DIR": str(secrets), "SESSIONSTATE_DATA_DIR": str(tmp_path / "cli")},
    )  # fmt: skip
    assert minted.returncode == 0, minted.stderr
    operator = {"Authorization": f"Bearer {minted.stdout.strip()}"}
    for served in (a, b):
        approved = requests.post(
            f"{served.url}/v1/tenants/{TENANT}/workspaces/{WORKSPACE}/approvals",
            json={"ttl_seconds": 3600, "reason": "identity test"},
            headers=operator,
            timeout=30,
        )
        assert approved.status_code == 201, approved.text

    # A session token exchanged on A acts on B.
    bot = mint_token(
        home.secret("jwt.secret"), sub="bot", roles=["model-service"], tenant=TENANT,
        workspace=WORKSPACE, ttl_seconds=3600,
    )  # fmt: skip
    exchanged = requests.post(
        f"{a.url}/v1/token",
        data={
            "grant_type": GRANT,
            "subject_token_type": JWT_TYPE,
            "subject_token": bot,
            "resource": f"{SESSION}/chat-a",
        },
        timeout=30,
    )
    assert exchanged.status_code == 200, exchanged.text
    session_token = {"Authorization": f"Bearer {exchanged.json()['access_token']}"}
    on_b = requests.put(
        f"{b.url}{SESSION}/chat-a/state", json=state_input(), headers=session_token, timeout=30
    )
    assert on_b.status_code == 201, on_b.text

    # The same body, written through A into another session, digests alike.
    on_a = requests.put(
        f"{a.url}{SESSION}/chat-b/state",
        json=state_input(),
        headers={"Authorization": f"Bearer {_session_bot(home, 'chat-b')}"},
        timeout=30,
    )
    assert on_a.status_code == 201, on_a.text
    turns_a, turns_b = on_a.json()["record"]["turns"], on_b.json()["record"]["turns"]
    assert [t["payload_digest"] for t in turns_a] == [t["payload_digest"] for t in turns_b]
    assert turns_a[0]["payload_digest"].startswith(f"hmac-sha256:{said['digest_key_id']}:")

    # Both sign the log with the one key: its checkpoints and its note key are the same.
    auditor = {"Authorization": f"Bearer {_auditor(home)}"}
    keys, checkpoints = set(), set()
    for served in (a, b):
        verified = requests.get(f"{served.url}/v1/decisions/verify", headers=auditor, timeout=60)
        assert verified.status_code == 200 and verified.json()["ok"], verified.text
        checkpoints.add(verified.json()["checkpoint"]["key_id"])
        keys.add(
            requests.get(f"{served.url}/v1/decisions/log-key", headers=auditor, timeout=30).text
        )
    assert checkpoints == {said["checkpoint_key_id"]}
    assert len(keys) == 1
    assert not (tmp_path / "var-a" / "secrets").exists()
    assert not (tmp_path / "var-b" / "secrets").exists()


def test_a_replica_or_an_upgrade_with_other_keys_is_refused_in_one_line(
    deployment: Any, tmp_path: Path, opa_bin: str
) -> None:
    secrets, said, conninfo, replica = deployment
    other = tmp_path / "other-identity"
    theirs = identity(other)
    running = replica("a")  # the deployment's own replica serves

    refused_upgrade = upgrade(conninfo, tmp_path, other)
    assert refused_upgrade.returncode == 2
    _one_line_naming(refused_upgrade.stderr, "SESSIONSTATE_SECRETS_DIR (digest.key)", other)
    assert said["digest_key_id"] in refused_upgrade.stderr
    assert theirs["digest_key_id"] in refused_upgrade.stderr

    for env, named in (
        ({"SESSIONSTATE_SECRETS_DIR": str(other)}, "SESSIONSTATE_SECRETS_DIR (digest.key)"),
        # A digest key given by its variable wins over the folder, and is named.
        ({"SESSIONSTATE_DIGEST_KEY": DIGEST_KEY}, "SESSIONSTATE_DIGEST_KEY"),
        # The data dir's own keys, where no folder is provisioned: given the identity's digest
        # key, its checkpoint key is still not the one recorded (not made yet).
        (
            {
                "SESSIONSTATE_SECRETS_DIR": "",
                "SESSIONSTATE_DIGEST_KEY": (secrets / "digest.key").read_text().strip(),
            },
            "SESSIONSTATE_DATA_DIR (secrets/checkpoint.key)",
        ),
    ):
        serve = _serve_refused(opa_bin, tmp_path, conninfo, env)
        assert serve.returncode == 2, serve.stdout
        _one_line_naming(serve.stdout, named, other)
    # The commands that read the store hold the keys too: none verifies, proves or prints
    # the log key of another identity against it.
    for command in (("decisions", "verify", "--all-tenants"), ("decisions", "log-key")):
        env = {
            "SESSIONSTATE_STORE": conninfo,
            "SESSIONSTATE_SECRETS_DIR": str(other),
            "SESSIONSTATE_DATA_DIR": str(tmp_path / "review"),
        }
        refused = cli(*command, env=env)
        assert refused.returncode == 2, refused.stdout
        assert refused.stdout == ""
        _one_line_naming(refused.stderr, "SESSIONSTATE_SECRETS_DIR (digest.key)", other)
        allowed = cli(*command, env=env | {"SESSIONSTATE_SECRETS_DIR": str(secrets)})
        assert allowed.returncode == 0, allowed.stderr
    assert requests.get(f"{running.url}/readyz", timeout=10).status_code == 200


def _serve_refused(
    opa_bin: str, tmp: Path, conninfo: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """`sessionstate serve` with these settings over the deployment's, until it exits."""
    settings = {
        "SESSIONSTATE_STORE": conninfo,
        "SESSIONSTATE_DATA_DIR": str(tmp / "var-refused"),
        "SESSIONSTATE_SECRETS_DIR": str(tmp / "identity"),
        "SESSIONSTATE_OPA_BIN": opa_bin,
        "SESSIONSTATE_PORT": "0",
        **env,
    }
    settings = {name: value for name, value in settings.items() if value}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONSTATE_")}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "serve"],
        env=clean | settings,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )


def _one_line_naming(output: str, named: str, other: Path) -> None:
    refusals = [line for line in output.splitlines() if "every replica must use the same" in line]
    assert len(refusals) == 1, output
    assert named in refusals[0], refusals[0]
    for path in other.iterdir():  # no secret's value, in any line
        assert path.read_text().strip().removeprefix("hex:") not in output


def _session_bot(home: SecretsHome, session: str) -> str:
    return mint_token(
        home.secret("jwt.secret"), sub="bot", roles=["model-service"], tenant=TENANT,
        workspace=WORKSPACE, session=session, ttl_seconds=3600,
    )  # fmt: skip


def _auditor(home: SecretsHome) -> str:
    return mint_token(
        home.secret("jwt.secret"), sub="au", roles=["auditor"], tenant=TENANT, ttl_seconds=3600
    )
