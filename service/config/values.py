"""Settings parsed into the typed values the service works with: the store, the rate
limits, the identity provider, the JWT public key, the public origin and the log's
witnesses (`service.config.log_witnesses`).

Each function reads one concern of `Settings`; a value that cannot work is a
`ConfigurationError` that names the variable, never the value. `Configuration`
holds them all, parsed once when the settings are read, so a process works
with values rather than with the text of its environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from service.auth.token_exchange import public_origin
from service.auth.tokens import ProviderSettings
from service.config.configuration_error import ConfigurationError
from service.config.log_witnesses import WitnessSet, log_witnesses
from service.config.secret_values import secrets_home
from service.config.settings import Settings
from service.config.store import StoreTarget, configured_store
from service.config.timestamp_authority import TimestampAuthority, timestamp_authority
from service.rate_limits import RateLimits, parse_budget
from store.secrets import SecretsHome


def rate_limits(settings: Settings) -> RateLimits:
    """SESSIONSTATE_RATE_LIMIT and SESSIONSTATE_DENIAL_RATE_LIMIT, parsed."""
    budgets = {}
    for variable, text in (
        ("SESSIONSTATE_RATE_LIMIT", settings.rate_limit),
        ("SESSIONSTATE_DENIAL_RATE_LIMIT", settings.denial_rate_limit),
    ):
        try:
            budgets[variable] = parse_budget(text)
        except ValueError:
            raise ConfigurationError(
                f"{variable} must be rate limits such as '20/minute' or "
                "'500/second;15000/minute', or 'off'"
            ) from None
    return RateLimits(
        requests=budgets["SESSIONSTATE_RATE_LIMIT"],
        denials=budgets["SESSIONSTATE_DENIAL_RATE_LIMIT"],
    )


def identity_provider(settings: Settings) -> ProviderSettings:
    """The identity provider's JWKS URL, issuer and audience (SESSIONSTATE_JWT_*)."""
    url = settings.jwt_jwks_url
    if url is not None and urlsplit(url).scheme not in ("https", "http"):
        raise ConfigurationError("SESSIONSTATE_JWT_JWKS_URL must be an https:// (or http://) URL")
    return ProviderSettings(
        jwks_url=url,
        issuer=settings.jwt_issuer,
        audience=settings.jwt_audience,
        jwks_cache_seconds=settings.jwt_jwks_cache_seconds,
        jwks_refresh_cooldown_seconds=settings.jwt_jwks_refresh_cooldown_seconds,
        jwks_timeout_seconds=settings.jwt_jwks_timeout_ms / 1000,
    )


def jwt_public_key(settings: Settings) -> bytes | None:
    """SESSIONSTATE_JWT_PUBLIC_KEY_FILE's key, as the file holds it; None when unset."""
    path = settings.jwt_public_key_file
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError:
        raise ConfigurationError("SESSIONSTATE_JWT_PUBLIC_KEY_FILE cannot be read") from None


def configured_public_origin(settings: Settings) -> str | None:
    """SESSIONSTATE_PUBLIC_URL as the origin a token request's resource URL must name."""
    if settings.public_url is None:
        return None
    try:
        return public_origin(settings.public_url)
    except ValueError as error:
        raise ConfigurationError(f"SESSIONSTATE_PUBLIC_URL {error}") from None


@dataclass(frozen=True)
class Configuration:
    """What the settings mean, parsed once when they are read (the secrets themselves, which
    may be generated into the data dir, are `service.config.secret_values`'; `secrets` says
    where they are)."""

    settings: Settings
    secrets: SecretsHome
    store: StoreTarget
    rate_limits: RateLimits
    identity_provider: ProviderSettings
    jwt_public_key: bytes | None
    public_origin: str | None
    witnesses: WitnessSet
    timestamp_authority: TimestampAuthority | None

    @classmethod
    def read(cls, settings: Settings) -> Configuration:
        """Every value parsed; the first that cannot work raises `ConfigurationError`."""
        return cls(
            settings=settings,
            secrets=secrets_home(settings),
            jwt_public_key=jwt_public_key(settings),
            identity_provider=identity_provider(settings),
            rate_limits=rate_limits(settings),
            public_origin=configured_public_origin(settings),
            witnesses=log_witnesses(settings),
            timestamp_authority=timestamp_authority(settings),
            store=configured_store(settings),
        )
