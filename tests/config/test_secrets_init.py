"""One deployment identity: `sessionstate secrets init --out DIR` makes the four secrets every
replica shares, once, and a service or command started with `SESSIONSTATE_SECRETS_DIR=DIR`
reads them from there and writes nothing into it; a variable naming one secret still wins.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from service.config.configuration_error import ConfigurationError
from service.config.secret_values import (
    checkpoint_signer,
    digest_key,
    jwt_secret,
    secrets_home,
    session_token_issuer,
)
from service.config.settings import Settings
from service.policy.sidecar import OpaSidecar
from store.chain.checkpoints import CheckpointSigner
from store.secrets import SecretsHome, decode_secret
from tests.config.test_secrets import cli
from tests.support.factories import state_input
from tests.support.live import DIGEST_KEY, live_service, service_settings

FILES = {"jwt.secret", "digest.key", "checkpoint.key", "token-signing-key.pem"}


def init(folder: Path) -> dict[str, object]:
    made = cli("secrets", "init", "--out", str(folder), env={})
    assert made.returncode == 0, made.stderr
    lines = made.stdout.splitlines()
    assert len(lines) == 1
    return dict(json.loads(lines[0]))


def test_init_writes_the_four_secrets_once_owner_only_and_prints_no_value(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "identity"
    said = init(folder)
    assert set(said["files"]) == FILES  # type: ignore[arg-type]
    assert {path.name for path in folder.iterdir()} == FILES
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for path in folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_text().strip() not in json.dumps(said)  # ids only, never a value
    home = SecretsHome.provisioned_at(folder)
    assert said["checkpoint_key_id"] == CheckpointSigner.of(home).key_id
    for name in ("jwt.secret", "digest.key", "checkpoint.key"):
        assert len(home.secret(name)) == 32


def test_init_refuses_a_folder_that_holds_any_of_them_and_writes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "identity"
    folder.mkdir()
    (folder / "digest.key").write_text("kept\n")
    refused = cli("secrets", "init", "--out", str(folder), env={})
    assert refused.returncode == 2
    assert refused.stderr.strip().endswith("name an empty or new folder")
    assert "digest.key" in refused.stderr and "kept" not in refused.stderr
    assert {path.name for path in folder.iterdir()} == {"digest.key"}
    assert (folder / "digest.key").read_text() == "kept\n"
    made = init(tmp_path / "fresh")
    again = cli("secrets", "init", "--out", str(tmp_path / "fresh"), env={})
    assert again.returncode == 2 and made["digest_key_id"]  # never overwritten
    other = tmp_path / "other"
    other.mkdir()
    (other / "README").write_text("notes\n")
    refused = cli("secrets", "init", "--out", str(other), env={})
    assert refused.returncode == 2 and "--out is not empty" in refused.stderr
    assert {path.name for path in other.iterdir()} == {"README"}


def test_an_empty_folder_made_before_is_made_the_owners_alone(tmp_path: Path) -> None:
    folder = tmp_path / "identity"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    init(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_the_settings_read_every_secret_from_the_provisioned_folder(tmp_path: Path) -> None:
    folder = tmp_path / "identity"
    init(folder)
    settings = Settings(data_dir=tmp_path / "var", secrets_dir=folder)
    home = SecretsHome.provisioned_at(folder)
    assert secrets_home(settings) == home
    assert jwt_secret(settings) == home.secret("jwt.secret")
    other = Settings(data_dir=tmp_path / "other", secrets_dir=folder)
    assert digest_key(settings).key_id == digest_key(other).key_id
    assert checkpoint_signer(settings).key_id == CheckpointSigner.of(home).key_id
    assert not (tmp_path / "var").exists()  # nothing generated into the data dir


def test_a_variable_naming_one_secret_wins_over_its_file(tmp_path: Path) -> None:
    folder = tmp_path / "identity"
    init(folder)
    settings = Settings(data_dir=tmp_path / "var", secrets_dir=folder, digest_key=DIGEST_KEY)
    assert digest_key(settings).key_id != digest_key(Settings(secrets_dir=folder)).key_id
    assert jwt_secret(settings) == decode_secret((folder / "jwt.secret").read_text().strip())


READERS = {
    "jwt.secret": jwt_secret,
    "digest.key": digest_key,
    "checkpoint.key": checkpoint_signer,
    "token-signing-key.pem": session_token_issuer,
}


@pytest.mark.parametrize("missing", sorted(FILES))
def test_a_provisioned_folder_missing_a_file_is_named_with_the_variable(
    tmp_path: Path, missing: str
) -> None:
    folder = tmp_path / "identity"
    init(folder)
    (folder / missing).unlink()
    settings = Settings(data_dir=tmp_path / "var", secrets_dir=folder)
    with pytest.raises(
        ConfigurationError, match=f"SESSIONSTATE_SECRETS_DIR holds no readable {missing}"
    ):
        READERS[missing](settings)
    assert not (folder / missing).exists()  # never made in a provisioned folder
    assert not (tmp_path / "var").exists()


def test_a_command_refused_for_a_missing_file_says_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "identity"
    init(folder)
    (folder / "jwt.secret").unlink()
    env = {"SESSIONSTATE_SECRETS_DIR": str(folder), "SESSIONSTATE_DATA_DIR": str(tmp_path / "var")}
    refused = cli("token", "--sub", "op", "--role", "operator", "--tenant", "acme", env=env)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1
    assert "SESSIONSTATE_SECRETS_DIR holds no readable jwt.secret" in refused.stderr


def test_a_damaged_file_is_named_never_shown(tmp_path: Path) -> None:
    folder = tmp_path / "identity"
    init(folder)
    (folder / "digest.key").write_text("hex:not-hex-at-all\n")
    with pytest.raises(ConfigurationError) as refused:
        digest_key(Settings(data_dir=tmp_path / "var", secrets_dir=folder))
    assert "digest.key is not a usable secret" in str(refused.value)
    assert "not-hex" not in str(refused.value)


def test_a_service_on_a_provisioned_folder_digests_with_it_and_writes_nothing_into_it(
    sidecar: OpaSidecar, tmp_path: Path
) -> None:
    folder = tmp_path / "identity"
    said = init(folder)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    settings = service_settings(tmp_path / "var", digest_key=None, secrets_dir=folder)
    with live_service(sidecar, settings) as service:
        service.approve()
        written = service.call(
            "PUT", service.session_path() + "/state", service.token(), json=state_input()
        )
        assert written.status_code == 201, written.text
        assert f"hmac-sha256:{said['digest_key_id']}:" in written.text
        auditor = service.token("auditor", sub="au", workspace=None, session=None)
        verified = service.call("GET", "/v1/decisions/verify", auditor)
        assert verified.json()["checkpoint"]["key_id"] == said["checkpoint_key_id"]
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before
    assert not (tmp_path / "var" / "secrets").exists()
