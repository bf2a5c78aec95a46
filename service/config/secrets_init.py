"""`sessionstate secrets init --out DIR`: one deployment identity, made once.

The four secrets every replica must share, each in its own file (mode 0600) of one folder
(mode 0700) that the operator then provisions to every replica and CLI as
`SESSIONSTATE_SECRETS_DIR`: the JWT secret, the digest key, the checkpoint key (which signs
the decision log's checkpoints and notes) and the token signing key. A folder that holds
any of them already is refused before anything is written: a deployment's identity is made
once, never overwritten.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from service.auth.session_tokens import SIGNING_KEY_NAME, SigningKey
from service.config.configuration_error import ConfigurationError
from service.config.secret_values import DIGEST_KEY_FILE, JWT_SECRET_FILE
from store.chain.checkpoints import KEY_FILE as CHECKPOINT_KEY_FILE
from store.chain.checkpoints import CheckpointSigner
from store.digests import DigestKey
from store.secrets import SecretsHome, encode_secret, local_key_file

SECRET_BYTES = 32
IDENTITY_FILES = (JWT_SECRET_FILE, DIGEST_KEY_FILE, CHECKPOINT_KEY_FILE, SIGNING_KEY_NAME)


class ProvisionedIdentity(BaseModel):
    """What `secrets init` made: the files, and the ids a reviewer pins (never a value)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    out: str
    files: list[str]
    digest_key_id: str
    checkpoint_key_id: str
    token_signing_key_id: str


def provision(folder: Path) -> ProvisionedIdentity:
    """Write the four secrets into folder (new, or empty; mode 0700); `ConfigurationError`
    for a folder that holds anything (naming the first secret it already holds), before
    anything is written."""
    if folder.exists() and not folder.is_dir():
        raise ConfigurationError("--out must name a folder (it is a file)")
    held = [name for name in IDENTITY_FILES if (folder / name).exists()]
    if held:
        raise ConfigurationError(
            f"--out already holds {held[0]}: a deployment's secrets are made once; "
            "name an empty or new folder"
        )
    if folder.exists() and any(folder.iterdir()):
        raise ConfigurationError("--out is not empty: name an empty or new folder")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)  # an empty folder made before, under any umask: the owner's alone
    for name in (JWT_SECRET_FILE, DIGEST_KEY_FILE, CHECKPOINT_KEY_FILE):
        local_key_file(folder, name, _new_secret)
    local_key_file(folder, SIGNING_KEY_NAME, SigningKey.generated)
    home = SecretsHome.provisioned_at(folder)
    return ProvisionedIdentity(
        out=str(folder),
        files=list(IDENTITY_FILES),
        digest_key_id=DigestKey(home.secret(DIGEST_KEY_FILE)).key_id,
        checkpoint_key_id=CheckpointSigner.of(home).key_id,
        token_signing_key_id=SigningKey((folder / SIGNING_KEY_NAME).read_bytes()).kid,
    )


def _new_secret() -> bytes:
    return (encode_secret(secrets.token_bytes(SECRET_BYTES)) + "\n").encode("ascii")
