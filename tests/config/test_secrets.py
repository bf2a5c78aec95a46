"""One secret format: a data dir's secrets move into the environment and stay the same keys.

A data dir file holds `hex:` and the secret's hex digits (or, written before the
prefix existed, bare hex digits); the environment takes `hex:…` as those bytes
and any other text as its UTF-8 bytes. `sessionstate secrets export` prints a
data dir's secrets as environment lines for compose.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import jwt
import pytest
import requests

from service.auth.tokens import TokenVerifier, mint_token
from service.cli.walkthrough import EXAMPLE_STATE
from service.config.configuration_error import ConfigurationError
from service.config.secret_values import configured_secret
from store.secrets import decode_secret, encode_secret, local_secret, stored_secret
from tests.support.served import ROOT, Served, start

STATE = json.loads(EXAMPLE_STATE)
SESSION = "/v1/tenants/acme/workspaces/support/sessions/chat-1"
DIGEST = re.compile(r"hmac-sha256:[^\"]+")


def write_legacy_secrets(data_dir: Path) -> dict[str, bytes]:
    """Secrets as the code before the `hex:` prefix wrote them: bare hex, mode 0600."""
    folder = data_dir / "secrets"
    folder.mkdir(mode=0o700, parents=True)
    written = {}
    for name in ("jwt.secret", "digest.key"):
        value = secrets.token_bytes(32)
        (folder / name).write_text(value.hex() + "\n")
        (folder / name).chmod(0o600)
        written[name] = value
    return written


def cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONSTATE_")}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *argv],
        env=clean | env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def stop(served: Served) -> None:
    os.killpg(served.process.pid, signal.SIGTERM)
    served.process.wait(30)


def call(served: Served, method: str, path: str, token: str, body: Any) -> requests.Response:
    return requests.request(
        method,
        served.url + path,
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


# --- the format ---------------------------------------------------------------------


def test_hex_prefix_spells_the_bytes_and_other_text_is_utf8() -> None:
    value = bytes(range(32))
    assert encode_secret(value) == "hex:" + value.hex()
    assert decode_secret(encode_secret(value)) == value
    assert decode_secret("HEX:00") == b"HEX:00"  # the prefix is exact
    assert decode_secret("a passphrase, ünïcode") == "a passphrase, ünïcode".encode()


def test_bad_hex_after_the_prefix_names_the_variable_never_the_value() -> None:
    text = "hex:" + "zz-not-hex-" * 6
    with pytest.raises(ConfigurationError) as raised:
        configured_secret("SESSIONSTATE_DIGEST_KEY", text)
    message = str(raised.value)
    assert message.startswith("SESSIONSTATE_DIGEST_KEY starts with hex:")
    assert "zz" not in message
    with pytest.raises(ConfigurationError, match="at least 32 bytes"):
        configured_secret("SESSIONSTATE_JWT_SECRET", "hex:" + "00" * 31)


def test_a_data_dir_file_is_what_the_environment_takes(tmp_path: Path) -> None:
    """`SESSIONSTATE_JWT_SECRET=$(cat <data dir>/secrets/jwt.secret)` is the same secret."""
    made = local_secret(tmp_path, "jwt.secret")
    text = (tmp_path / "secrets" / "jwt.secret").read_text()
    assert re.fullmatch(r"hex:[0-9a-f]{64}\n", text)
    assert configured_secret("SESSIONSTATE_JWT_SECRET", text.strip()) == made
    assert local_secret(tmp_path, "jwt.secret") == made  # read back, not made again


def test_files_written_before_the_prefix_keep_their_bytes(tmp_path: Path) -> None:
    legacy = write_legacy_secrets(tmp_path)
    for name, value in legacy.items():
        assert local_secret(tmp_path, name) == value
        assert stored_secret(tmp_path, name) == value
    # Their bare hex given as text would be another key: that is what `export` is for.
    token = mint_token(legacy["jwt.secret"], sub="a", roles=["auditor"], ttl_seconds=60)
    bare = (tmp_path / "secrets" / "jwt.secret").read_text().strip()
    with pytest.raises(jwt.InvalidTokenError):
        jwt.decode(token, configured_secret("X", bare), algorithms=["HS256"])


# --- sessionstate secrets export ------------------------------------------------------


def test_export_prints_env_lines_of_the_data_dir(tmp_path: Path) -> None:
    legacy = write_legacy_secrets(tmp_path)
    done = cli("secrets", "export", env={"SESSIONSTATE_DATA_DIR": str(tmp_path)})
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        f"SESSIONSTATE_JWT_SECRET=hex:{legacy['jwt.secret'].hex()}\n"
        f"SESSIONSTATE_DIGEST_KEY=hex:{legacy['digest.key'].hex()}\n"
    )


def test_export_prints_a_secret_set_in_the_environment_in_the_same_form(tmp_path: Path) -> None:
    write_legacy_secrets(tmp_path)
    passphrase = "a passphrase set by hand, long enough: 0123456789"
    done = cli(
        "secrets",
        "export",
        env={"SESSIONSTATE_DATA_DIR": str(tmp_path), "SESSIONSTATE_JWT_SECRET": passphrase},
    )
    assert done.returncode == 0
    first = done.stdout.splitlines()[0]
    assert first == f"SESSIONSTATE_JWT_SECRET=hex:{passphrase.encode().hex()}"


def test_export_makes_no_secret_and_says_what_is_missing(tmp_path: Path) -> None:
    done = cli("secrets", "export", env={"SESSIONSTATE_DATA_DIR": str(tmp_path)})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "holds no jwt.secret" in done.stderr
    assert not (tmp_path / "secrets").exists()


def test_export_help_says_it_prints_the_secrets() -> None:
    done = cli("secrets", "export", "--help", env={})
    assert "the secrets themselves, on stdout" in " ".join(done.stdout.split())


# --- the move, against served processes -------------------------------------------------


@pytest.mark.slow
def test_a_local_data_dir_moves_to_env_secrets_keeping_tokens_and_digests(
    opa_bin: str, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    write_legacy_secrets(local)  # a data dir of the code before the prefix
    local_env = {"SESSIONSTATE_DATA_DIR": str(local)}

    served = start(opa_bin, local, tmp_path, env_secrets=False)
    try:
        minted = cli(
            "token", "--sub", "svc", "--role", "model-service", "--tenant", "acme",
            "--workspace", "support", "--session", "chat-1", env=local_env,
        )  # fmt: skip
        operator = cli(
            "token", "--sub", "op", "--role", "operator", "--tenant", "acme", env=local_env
        )
        svc, op = minted.stdout.strip(), operator.stdout.strip()
        preview = call(served, "POST", SESSION + "/state/preview", svc, STATE)
        assert preview.status_code == 200, preview.text
        approval = call(
            served, "POST", "/v1/tenants/acme/workspaces/support/approvals", op,
            {"ttl_seconds": 600, "reason": "move"},
        )  # fmt: skip
        assert approval.status_code == 201, approval.text
        written = call(served, "PUT", SESSION + "/state", svc, STATE)
        assert written.status_code == 201, written.text
    finally:
        stop(served)
    digests_before = DIGEST.findall(json.dumps(preview.json()["record"]))
    assert digests_before

    exported = cli("secrets", "export", env=local_env)
    assert exported.returncode == 0, exported.stderr
    env_lines = dict(line.split("=", 1) for line in exported.stdout.splitlines())
    assert set(env_lines) == {"SESSIONSTATE_JWT_SECRET", "SESSIONSTATE_DIGEST_KEY"}

    # As in compose: the data moves, the secrets come from the environment only.
    moved = tmp_path / "moved"
    shutil.copytree(local, moved, ignore=shutil.ignore_patterns("*.lock"))
    shutil.rmtree(moved / "secrets")
    served = start(opa_bin, moved, tmp_path, env_lines)
    try:
        again = call(served, "POST", SESSION + "/state/preview", svc, STATE)
        assert again.status_code == 200, again.text  # the token minted before still holds
        assert DIGEST.findall(json.dumps(again.json()["record"])) == digests_before
        read = call(served, "GET", SESSION + "/state", svc, None)
        assert read.status_code == 200, read.text
        assert read.json()["read_report"]["record"] == written.json()["record"]
        assert read.json()["read_report"]["corrupt"] is False
        replaced = call(served, "PUT", SESSION + "/state", svc, STATE)
        assert replaced.status_code == 200, replaced.text  # same digests: the same record
        assert replaced.headers["ETag"] == written.headers["ETag"]
    finally:
        stop(served)
    assert not (moved / "secrets" / "jwt.secret").exists(), "the service made a secret of its own"
    assert TokenVerifier(decode_secret(env_lines["SESSIONSTATE_JWT_SECRET"])).verify(
        f"Bearer {svc}"
    )
