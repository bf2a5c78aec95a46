"""The service's secrets from the settings: the JWT secret, the digest key and the token
signing key, each configured or generated once into the data dir.

A configured secret is read in `store.secrets`' format (`hex:…`, or UTF-8 text) and must
be long enough; what cannot be used is a `ConfigurationError` that names the variable,
never the value.
"""

from __future__ import annotations

from service.auth.session_tokens import SessionTokenIssuer, SigningKeyInvalid, signing_key
from service.config.configuration_error import ConfigurationError
from service.config.settings import Settings
from store.digests import DigestKey
from store.secrets import decode_secret, encode_secret, local_secret, stored_secret

MIN_SECRET_BYTES = 32


def jwt_secret(settings: Settings) -> bytes:
    """SESSIONSTATE_JWT_SECRET, or a secret generated once into the data dir."""
    if settings.jwt_secret is None:
        return local_secret(settings.data_dir, "jwt.secret")
    return configured_secret("SESSIONSTATE_JWT_SECRET", settings.jwt_secret)


def digest_key(settings: Settings) -> DigestKey:
    """SESSIONSTATE_DIGEST_KEY, or a key generated once into the data dir."""
    if settings.digest_key is None:
        return DigestKey(local_secret(settings.data_dir, "digest.key"))
    return DigestKey(configured_secret("SESSIONSTATE_DIGEST_KEY", settings.digest_key))


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
        ("SESSIONSTATE_JWT_SECRET", settings.jwt_secret, "jwt.secret"),
        ("SESSIONSTATE_DIGEST_KEY", settings.digest_key, "digest.key"),
    ):
        if configured is not None:
            secret = configured_secret(variable, configured)
        else:
            stored = stored_secret(settings.data_dir, name)
            if stored is None:
                raise ConfigurationError(
                    f"the data dir holds no {name} (and {variable} is unset): "
                    "start the service on it once, or check SESSIONSTATE_DATA_DIR"
                )
            secret = stored
        lines.append(f"{variable}={encode_secret(secret)}")
    return lines


def session_token_issuer(settings: Settings) -> SessionTokenIssuer:
    """What `POST /v1/token` signs with (SESSIONSTATE_TOKEN_*): the key file's key, or the
    data dir's, generated on first use."""
    ttl = settings.token_exchange_ttl_seconds
    if ttl > settings.jwt_max_lifetime_seconds:
        if "token_exchange_ttl_seconds" in settings.model_fields_set:
            raise ConfigurationError(
                "SESSIONSTATE_TOKEN_EXCHANGE_TTL_SECONDS must not exceed "
                "SESSIONSTATE_JWT_MAX_LIFETIME_SECONDS: the service would refuse its own tokens"
            )
        ttl = settings.jwt_max_lifetime_seconds  # the default, lowered to what is accepted
    try:
        key = signing_key(settings.data_dir, settings.token_signing_key_file)
    except OSError:
        if settings.token_signing_key_file is None:
            raise ConfigurationError(
                "the data dir's token signing key cannot be read or written "
                "(SESSIONSTATE_DATA_DIR, or set SESSIONSTATE_TOKEN_SIGNING_KEY_FILE)"
            ) from None
        raise ConfigurationError("SESSIONSTATE_TOKEN_SIGNING_KEY_FILE cannot be read") from None
    except SigningKeyInvalid as error:
        raise ConfigurationError(f"SESSIONSTATE_TOKEN_SIGNING_KEY_FILE {error}") from None
    return SessionTokenIssuer(key, issuer=settings.token_issuer, ttl_seconds=ttl)
