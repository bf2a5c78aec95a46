"""`check_settings`: everything a worker will need from the settings, checked before
anything starts, so that a setting which cannot work stops `serve` with its variable's
name rather than a worker later."""

from __future__ import annotations

from service.config.configuration_error import ConfigurationError
from service.config.secret_values import digest_key, jwt_secret, session_token_issuer
from service.config.settings import Settings
from service.config.values import Configuration
from service.policy.client import PolicyClient


def check_settings(settings: Settings) -> Configuration:
    """Everything a worker will need from the settings, checked before anything starts."""
    jwt_secret(settings)
    digest_key(settings)
    configuration = Configuration.read(settings)
    session_token_issuer(settings)  # generates the data dir's key before workers start
    if settings.workers > 1 and not configuration.store.capabilities.shared:
        raise ConfigurationError(
            "SESSIONSTATE_WORKERS (or --workers) above 1 needs a shared store: LevelDB admits "
            "one process; set SESSIONSTATE_STORE to a PostgreSQL database, or serve 1 worker"
        )
    if settings.policy_activation_approvals > 1 and (
        settings.jwt_jwks_url is None and settings.jwt_public_key_file is None
    ):
        raise ConfigurationError(
            "SESSIONSTATE_POLICY_ACTIVATION_APPROVALS above 1 needs an identity provider "
            "(SESSIONSTATE_JWT_JWKS_URL or SESSIONSTATE_JWT_PUBLIC_KEY_FILE): a token this host "
            "mints with its HS256 secret can name anyone, so it approves nothing"
        )
    for name, url in (
        ("SESSIONSTATE_OPA_URL", settings.opa_url),
        ("SESSIONSTATE_SHADOW_OPA_URL", settings.shadow_opa_url),
    ):
        if url is not None:
            try:
                PolicyClient(url).close()
            except ValueError:
                raise ConfigurationError(
                    f"{name} must be http(s)://host:port or http+unix://<socket path, "
                    "percent-encoded>"
                ) from None
    return configuration
