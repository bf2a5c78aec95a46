"""The service's secrets from the settings: the JWT secret, the digest key, the token
signing key and the checkpoint key, each from the variable that names it, else from the
deployment's secrets folder (`SESSIONSTATE_SECRETS_DIR`, provisioned once by `sessionstate
secrets init` for every replica), else generated once into the data dir.

A configured secret is read in `store.secrets`' format (`hex:…`, or UTF-8 text) and must
be long enough; what cannot be used is a `ConfigurationError` that names the variable
(and the file), never the value.
"""

from __future__ import annotations

from service.auth.session_tokens import (
    SIGNING_KEY_NAME,
    SessionTokenIssuer,
    SigningKeyInvalid,
    signing_key,
)
from service.config.configuration_error import ConfigurationError
from service.config.settings import Settings
from store.chain.checkpoints import KEY_FILE as CHECKPOINT_KEY_FILE
from store.chain.checkpoints import CheckpointSigner
from store.digests import DigestKey
from store.secrets import SecretMissing, SecretsHome, decode_secret, encode_secret

MIN_SECRET_BYTES = 32
SECRETS_DIR_VARIABLE = "SESSIONSTATE_SECRETS_DIR"
JWT_SECRET_FILE = "jwt.secret"  # noqa: S105 (a file name)
DIGEST_KEY_FILE = "digest.key"


def secrets_home(settings: Settings) -> SecretsHome:
    """SESSIONSTATE_SECRETS_DIR, provisioned (read, never written into), else the data dir's
    own secrets folder."""
    if settings.secrets_dir is not None:
        return SecretsHome.provisioned_at(settings.secrets_dir)
    return SecretsHome.local(settings.data_dir)


def jwt_secret(settings: Settings) -> bytes:
    """SESSIONSTATE_JWT_SECRET, else the deployment's `jwt.secret`."""
    if settings.jwt_secret is None:
        return home_secret(settings, JWT_SECRET_FILE)
    return configured_secret("SESSIONSTATE_JWT_SECRET", settings.jwt_secret)


def digest_key(settings: Settings) -> DigestKey:
    """SESSIONSTATE_DIGEST_KEY, else the deployment's `digest.key`."""
    if settings.digest_key is None:
        return DigestKey(home_secret(settings, DIGEST_KEY_FILE))
    return DigestKey(configured_secret("SESSIONSTATE_DIGEST_KEY", settings.digest_key))


def checkpoint_signer(settings: Settings) -> CheckpointSigner:
    """The deployment's checkpoint key (`checkpoint.key`), which signs the decision log's
    checkpoints, notes, anchors and bundles."""
    try:
        return CheckpointSigner.of(secrets_home(settings))
    except SecretMissing as missing:
        raise _missing(missing) from None
    except ValueError:
        raise _unusable(settings, CHECKPOINT_KEY_FILE) from None


def home_secret(settings: Settings, name: str) -> bytes:
    """The named secret of the deployment's secrets folder (in a data dir, generated once);
    one that is missing or unusable there is named with SESSIONSTATE_SECRETS_DIR."""
    try:
        secret = secrets_home(settings).secret(name)
    except SecretMissing as missing:
        raise _missing(missing) from None
    except ValueError:
        raise _unusable(settings, name) from None
    if len(secret) < MIN_SECRET_BYTES:
        raise _unusable(settings, name)
    return secret


def _home_name(settings: Settings) -> str:
    return SECRETS_DIR_VARIABLE if settings.secrets_dir is not None else "the data dir"


def _missing(missing: SecretMissing) -> ConfigurationError:
    return ConfigurationError(
        f"{SECRETS_DIR_VARIABLE} {missing}: provision the folder `sessionstate secrets init "
        "--out DIR` wrote (every replica the same), or check the variable"
    )


def _unusable(settings: Settings, name: str) -> ConfigurationError:
    return ConfigurationError(
        f"{_home_name(settings)}: {name} is not a usable secret "
        f"(hex:…, at least {MIN_SECRET_BYTES} bytes)"
    )


def configured_secret(variable: str, text: str) -> bytes:
    """A secret from the environment, in store.secrets' format: `hex:…`, or UTF-8 text."""
    try:
        secret = decode_secret(text)
    except ValueError as error:
        raise ConfigurationError(f"{variable} {error}") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigurationError(f"{variable} must be at least {MIN_SECRET_BYTES} bytes")
    return secret


def secret_lines(settings: Settings) -> list[str]:
    """`VARIABLE=hex:…` for the JWT secret and the digest key, as the service would use them.

    Read only: a secret the data dir does not hold yet is an error, not a new secret.
    """
    lines = []
    for variable, configured, name in (
        ("SESSIONSTATE_JWT_SECRET", settings.jwt_secret, JWT_SECRET_FILE),
        ("SESSIONSTATE_DIGEST_KEY", settings.digest_key, DIGEST_KEY_FILE),
    ):
        if configured is not None:
            secret = configured_secret(variable, configured)
        else:
            stored = secrets_home(settings).stored(name)
            if stored is None:
                raise ConfigurationError(
                    f"{_home_name(settings)} holds no {name} (and {variable} is unset): "
                    "start the service on it once, or check SESSIONSTATE_DATA_DIR"
                )
            secret = stored
        lines.append(f"{variable}={encode_secret(secret)}")
    return lines


def session_token_issuer(settings: Settings) -> SessionTokenIssuer:
    """What `POST /v1/token` signs with (SESSIONSTATE_TOKEN_*): the key file's key, else the
    deployment's (provisioned, or generated into the data dir on first use)."""
    ttl = settings.token_exchange_ttl_seconds
    if ttl > settings.jwt_max_lifetime_seconds:
        if "token_exchange_ttl_seconds" in settings.model_fields_set:
            raise ConfigurationError(
                "SESSIONSTATE_TOKEN_EXCHANGE_TTL_SECONDS must not exceed "
                "SESSIONSTATE_JWT_MAX_LIFETIME_SECONDS: the service would refuse its own tokens"
            )
        ttl = settings.jwt_max_lifetime_seconds  # the default, lowered to what is accepted
    try:
        key = signing_key(secrets_home(settings), settings.token_signing_key_file)
    except SecretMissing as missing:
        raise _missing(missing) from None
    except OSError:
        if settings.token_signing_key_file is None:
            raise ConfigurationError(
                "the data dir's token signing key cannot be read or written "
                "(SESSIONSTATE_DATA_DIR, or set SESSIONSTATE_TOKEN_SIGNING_KEY_FILE)"
            ) from None
        raise ConfigurationError("SESSIONSTATE_TOKEN_SIGNING_KEY_FILE cannot be read") from None
    except SigningKeyInvalid as error:
        if settings.token_signing_key_file is None:
            raise ConfigurationError(
                f"{_home_name(settings)}: {SIGNING_KEY_NAME} {error}"
            ) from None
        raise ConfigurationError(f"SESSIONSTATE_TOKEN_SIGNING_KEY_FILE {error}") from None
    return SessionTokenIssuer(key, issuer=settings.token_issuer, ttl_seconds=ttl)
