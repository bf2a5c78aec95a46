"""`ServiceContext`: the objects a request works with, built once from `Settings`.

Routes receive the store, the planner and the policy gate from here; nothing
is a module global, so tests build their own context with their own settings.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from service.approvals.index import ExpiredApprovalPruner, mark_index_complete_if_empty
from service.approvals.lookup import ApprovalStore
from service.auth import ProviderSettings, TokenVerifier
from service.decisions import revisions
from service.decisions.activation_log import ActivationLog
from service.decisions.journal import DecisionJournal
from service.decisions.live import LiveRevisions, instance_id
from service.decisions.rate_limit_log import RateLimitLog
from service.decisions.reader import DecisionLogReader
from service.decisions.retention import RetentionTask
from service.decisions.scrub import DecisionScrub
from service.metrics import ServiceMetrics
from service.policy.client import UNKNOWN, PolicyClient
from service.policy.gate import PolicyGate
from service.policy.shadow import ShadowPolicy
from service.policy.source import PolicySnapshots
from service.rate_limits import ActorRateLimiter, RateLimits, parse_budget
from service.replay import SessionReplayPlanner
from service.session_tokens import SessionTokenIssuer, SigningKeyInvalid, signing_key
from service.settings import Settings
from service.store_backend import (
    StoreSettingInvalid,
    StoreTarget,
    reachable,
    store_target,
    takes_writes,
)
from service.token_exchange import public_origin
from store.backends.contract import Lanes, drops_log_tail
from store.digests import DigestKey
from store.secrets import decode_secret, encode_secret, local_secret, stored_secret
from store.session_state import SessionStateStore
from store.signed_head import SignedHeads

MIN_SECRET_BYTES = 32
log = logging.getLogger("sessionstate.store")


def utc_now() -> datetime:
    return datetime.now(UTC)


class ConfigurationError(ValueError):
    """A setting that cannot work; the message names the variable, never its value."""


@dataclass
class ServiceContext:
    settings: Settings
    lanes: Lanes
    store: StoreTarget
    states: SessionStateStore
    approvals: ApprovalStore
    planner: SessionReplayPlanner
    gate: PolicyGate
    verifier: TokenVerifier
    digest_key: DigestKey
    metrics: ServiceMetrics
    clock: Callable[[], datetime]
    journal: DecisionJournal
    decision_log: DecisionLogReader
    rate_limiter: ActorRateLimiter
    rate_limit_log: RateLimitLog
    session_tokens: SessionTokenIssuer
    live: LiveRevisions
    activations: ActivationLog  # the sidecars it is told to follow (`serve`)
    retention: RetentionTask | None = None
    scrub: DecisionScrub | None = None  # None: SESSIONSTATE_DECISION_SCRUB_SECONDS is 0
    approval_pruner: ExpiredApprovalPruner | None = None
    policy_source: PolicySnapshots | None = (
        None  # the sidecar's policy snapshot; None: external OPA
    )
    worker_label: str | None = None  # `slot:pid` of a worker of `serve --workers N`, else None
    public_origin: str | None = None  # SESSIONSTATE_PUBLIC_URL's origin; None: unset

    @classmethod
    def open(
        cls,
        settings: Settings,
        *,
        opa_url: str,
        opa_token: str | None,
        clock: Callable[[], datetime] = utc_now,
        policy_source: PolicySnapshots | None = None,
        shadow_url: str | None = None,
        shadow_token: str | None = None,
        owns_live: bool = True,
        observes_live: bool | None = None,
    ) -> ServiceContext:
        """`owns_live`: this process opens and closes the data dir's live intervals (not a
        worker of several); `observes_live`: it learns the live revision from OPA's answers
        (by default when it is told of no local sidecar's snapshot, `policy_source`)."""
        limits = rate_limits(settings)
        session_tokens = session_token_issuer(settings)
        metrics = ServiceMetrics()
        store = configured_store(settings)
        lanes = store.open()
        metrics.watch_store(lanes)
        if policy_source is not None:
            metrics.watch_policy_source(policy_source)
        report_dropped_log_bytes(lanes, metrics)
        client = PolicyClient(
            opa_url,
            opa_token,
            timeout=settings.opa_timeout_ms / 1000,
            transport=settings.opa_transport,
        )
        live = LiveRevisions(lanes, instance_id(settings.data_dir), clock, owns=owns_live)
        if owns_live:
            live.started(
                policy_source.served.revision
                if policy_source is not None
                else deciding_revision(client)
            )
        observes = policy_source is None if observes_live is None else observes_live
        journal = DecisionJournal(
            lanes,
            clock=clock,
            on_reopened=lambda reopened: report_dropped_log_bytes(reopened, metrics),
            live_revision=live.current,
            signed_heads=SignedHeads(settings.data_dir),
        )
        journal.read_every_head()
        if not mark_index_complete_if_empty(lanes):
            # Still correct, by reading every approval of a workspace per lookup.
            log.warning("approvals_not_indexed")
        if not revisions.mark_complete_if_empty(lanes):
            # New decisions are summarised; those before them once `db upgrade` ran.
            log.warning("policy_revisions_not_summarised")
        return cls(
            settings=settings,
            lanes=lanes,
            store=store,
            states=SessionStateStore(lanes),
            approvals=ApprovalStore(lanes),
            planner=SessionReplayPlanner(),
            gate=PolicyGate(
                client,
                durable_writes=settings.durable_writes,
                metrics=metrics,
                clock=clock,
                shadow=(
                    None
                    if shadow_url is None
                    else ShadowPolicy(
                        shadow_url, shadow_token, timeout_ms=settings.shadow_timeout_ms
                    )
                ),
                observe=live.observe if observes else None,
            ),
            verifier=token_verifier(settings, session_tokens),
            digest_key=digest_key(settings),
            metrics=metrics,
            clock=clock,
            journal=journal,
            # One process owns LevelDB: its pages end at the head the journal keeps in memory.
            # On a shared store other replicas append too: the head is read from the store.
            decision_log=DecisionLogReader(
                lanes, head=None if store.capabilities.shared else journal.head
            ),
            rate_limiter=ActorRateLimiter(limits),
            rate_limit_log=RateLimitLog(journal, limits, clock=clock),
            session_tokens=session_tokens,
            live=live,
            activations=ActivationLog(
                journal, lanes, live, clock=clock, durable_writes=settings.durable_writes
            ),
            retention=(
                None
                if settings.decision_retention_days is None
                else RetentionTask(
                    lanes,
                    settings.decision_retention_days,
                    data_dir=settings.data_dir,
                    clock=clock,
                )
            ),
            scrub=(
                None
                if settings.decision_scrub_seconds == 0
                else DecisionScrub(
                    lanes,
                    settings.data_dir,
                    interval=settings.decision_scrub_seconds,
                    clock=clock,
                    metrics=metrics,
                )
            ),
            policy_source=policy_source,
            approval_pruner=ExpiredApprovalPruner(lanes, clock=clock),
            public_origin=configured_public_origin(settings),
        )

    def store_reachable(self) -> bool:
        """Whether the store answers now (for `/readyz`)."""
        return reachable(self.lanes)

    def store_takes_writes(self) -> bool | None:
        """Whether a probe write commits now (PostgreSQL; None on LevelDB), for `/readyz`."""
        return takes_writes(self.lanes)

    def close(self) -> None:
        if self.retention is not None:
            self.retention.close()
        if self.scrub is not None:
            self.scrub.close()
        if self.approval_pruner is not None:
            self.approval_pruner.close()
        self.rate_limit_log.close()  # its summaries go through the journal
        self.journal.close()
        self.live.stopped()
        self.gate.client.close()
        if self.gate.shadow is not None:
            self.gate.shadow.close()
        self.lanes.close()


def token_verifier(
    settings: Settings, session_tokens: SessionTokenIssuer | None = None
) -> TokenVerifier:
    """What verifies the bearer tokens the settings admit (and the service's own)."""
    tokens = session_token_issuer(settings) if session_tokens is None else session_tokens
    return TokenVerifier(
        jwt_secret(settings),
        _public_key(settings.jwt_public_key_file),
        max_lifetime_seconds=settings.jwt_max_lifetime_seconds,
        provider=identity_provider(settings),
        own_keys=tokens.verification_keys(),
        own_issuer=tokens.issuer,
    )


def deciding_revision(client: PolicyClient) -> str | None:
    """The revision an OPA of the operator's decides with now; None when it does not say."""
    probe = client.probe()
    revision = probe.policy_revision
    return None if probe.engine_unavailable or revision == UNKNOWN else revision


def report_dropped_log_bytes(lanes: Lanes, metrics: ServiceMetrics) -> None:
    """Say once, as an error and in the metric, what opening the store dropped from its log.

    Only a store with a log of its own (LevelDB) drops a torn tail from it.
    """
    if not drops_log_tail(lanes):
        return
    dropped = lanes.dropped_log_bytes
    if dropped > 0:
        log.error("store_log_tail_dropped", extra={"dropped_bytes": dropped})
        metrics.store_log_bytes_dropped.inc(dropped)
        lanes.acknowledge_dropped_log_bytes()


def check_settings(settings: Settings) -> None:
    """Everything a worker will need from the settings, checked before anything starts."""
    jwt_secret(settings)
    digest_key(settings)
    _public_key(settings.jwt_public_key_file)
    identity_provider(settings)
    rate_limits(settings)
    configured_public_origin(settings)
    session_token_issuer(settings)  # generates the data dir's key before workers start
    store = configured_store(settings)
    if settings.workers > 1 and not store.capabilities.shared:
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
                raise ConfigurationError(f"{name} must be http(s)://host:port") from None


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


def configured_public_origin(settings: Settings) -> str | None:
    """SESSIONSTATE_PUBLIC_URL as the origin a token request's resource URL must name."""
    if settings.public_url is None:
        return None
    try:
        return public_origin(settings.public_url)
    except ValueError as error:
        raise ConfigurationError(f"SESSIONSTATE_PUBLIC_URL {error}") from None


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


def configured_store(settings: Settings) -> StoreTarget:
    """SESSIONSTATE_STORE, parsed: the embedded LevelDB, or a PostgreSQL database."""
    try:
        return store_target(settings)
    except StoreSettingInvalid as error:
        raise ConfigurationError(str(error)) from None


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


def _public_key(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError:
        raise ConfigurationError("SESSIONSTATE_JWT_PUBLIC_KEY_FILE cannot be read") from None
