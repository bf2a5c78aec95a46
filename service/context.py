"""`ServiceContext`: the objects a request works with, built once from `Settings`.

Routes receive the store, the planner and the policy gate from here; nothing
is a module global, so tests build their own context with their own settings.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from service.approvals.index import ExpiredApprovalPruner, mark_index_complete_if_empty
from service.approvals.lookup import ApprovalStore
from service.auth.session_tokens import SessionTokenIssuer
from service.auth.tokens import TokenVerifier
from service.config.configuration_error import ConfigurationError
from service.config.key_ids import hold_key_ids
from service.config.log_witnesses import WitnessSet
from service.config.secret_values import (
    digest_key,
    jwt_secret,
    secrets_home,
    session_token_issuer,
)
from service.config.settings import Settings
from service.config.store import StoreTarget
from service.config.timestamp_authority import TimestampAuthority
from service.config.values import Configuration
from service.decisions import revisions
from service.decisions.activation_log import ActivationLog
from service.decisions.journal import DecisionJournal
from service.decisions.live import LiveRevisions, instance_id
from service.decisions.log_checkpoints import LogCheckpoints
from service.decisions.rate_limit_log import RateLimitLog
from service.decisions.reader import DecisionLogReader
from service.decisions.retention import RetentionTask
from service.decisions.scrub import DecisionScrub
from service.decisions.timestamping import Timestamping
from service.decisions.witnessing import Witnessing
from service.idle_expiry import IdleExpiry, IdleTTL
from service.observability.metrics import ServiceMetrics
from service.policy.client import UNKNOWN, PolicyClient
from service.policy.gate import PolicyGate
from service.policy.health import PolicyHealth, policy_health, published_policy_health
from service.policy.shadow import ShadowPolicy
from service.policy.source import PolicySnapshots
from service.rate_limits import ActorRateLimiter
from service.replay import SessionReplayPlanner
from service.runtime.worker_beats import WorkerBeats
from store.backends.contract import (
    Lanes,
    ProbeWrite,
    drops_log_tail,
    reachable,
    sync_standby_missing,
    takes_writes,
)
from store.chain.signed_head import SignedHeads
from store.digests import DigestKey
from store.secrets import SecretsHome
from store.session_state import SessionStateStore
from store.session_versions import SessionVersions

log = logging.getLogger("sessionstate.store")


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class ServiceContext:
    settings: Settings
    lanes: Lanes
    store: StoreTarget
    states: SessionStateStore
    versions: SessionVersions  # each session's records, numbered (store.session_versions)
    approvals: ApprovalStore
    planner: SessionReplayPlanner
    gate: PolicyGate
    verifier: TokenVerifier
    digest_key: DigestKey
    secrets: SecretsHome  # where the deployment's keys are (the checkpoint key's, for signing)
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
    # Each tenant's idle TTL, and the sweep (None: SESSIONSTATE_STATE_IDLE_TTL_SECONDS is 0).
    idle_ttl: IdleTTL = field(default_factory=lambda: IdleTTL(0, None))
    expiry: IdleExpiry | None = None
    # The log's witnesses and the job that signs notes on a clock and submits them to them.
    witnesses: WitnessSet = field(default_factory=WitnessSet)
    # The RFC 3161 time-stamping authority of the notes (None: they are not timestamped).
    timestamp_authority: TimestampAuthority | None = None
    log_checkpoints: LogCheckpoints | None = None
    policy_source: PolicySnapshots | None = (
        None  # the sidecar's policy snapshot; None: external OPA
    )
    worker_label: str | None = None  # `slot:pid` of a worker of `serve --workers N`, else None
    # A worker of several: the policy health its parent publishes (`service.policy.health`).
    published_policy: Path | None = None
    workers: WorkerBeats | None = None  # a worker of several: every worker's beat
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
        published_policy: Path | None = None,
    ) -> ServiceContext:
        """`owns_live`: this process opens and closes the data dir's live intervals (not a
        worker of several); `observes_live`: it learns the live revision from OPA's answers
        (by default when it is told of no local sidecar's snapshot, `policy_source`);
        `published_policy`: a worker's parent's policy health (`service.policy.health`)."""
        configuration = Configuration.read(settings)  # what may be refused, before the store
        session_tokens = session_token_issuer(settings)
        metrics = ServiceMetrics()
        store = configuration.store
        lanes = _opened_lanes(store, metrics)
        try:  # one deployment identity: keys the store was not first written with are refused
            hold_key_ids(lanes, settings)
        except ConfigurationError:
            lanes.close()
            raise
        client = PolicyClient(
            opa_url,
            opa_token,
            timeout=settings.opa_timeout_ms / 1000,
            transport=settings.opa_transport,
            grouped=settings.opa_grouped,
        )
        live = LiveRevisions(lanes, instance_id(settings.data_dir), clock, owns=owns_live)
        if owns_live:
            served = None if policy_source is None else policy_source.served.revision
            live.started(deciding_revision(client) if served is None else served)
        observes = policy_source is None if observes_live is None else observes_live
        shadow = (
            None
            if shadow_url is None
            else ShadowPolicy(
                shadow_url,
                shadow_token,
                timeout_ms=settings.shadow_timeout_ms,
                grouped=settings.opa_grouped,
            )
        )
        gate = PolicyGate(
            client,
            durable_writes=settings.durable_writes,
            metrics=metrics,
            clock=clock,
            shadow=shadow,
            observe=live.observe if observes else None,
        )
        journal = _opened_journal(settings, lanes, live, clock, metrics)
        idle_ttl = IdleTTL(settings.state_idle_ttl_seconds, policy_source)
        context = cls(
            settings=settings,
            lanes=lanes,
            store=store,
            states=SessionStateStore(lanes),
            versions=SessionVersions(lanes),
            approvals=ApprovalStore(lanes),
            planner=SessionReplayPlanner(),
            gate=gate,
            verifier=token_verifier(configuration, session_tokens),
            digest_key=digest_key(settings),
            secrets=configuration.secrets,
            metrics=metrics,
            clock=clock,
            journal=journal,
            # One process owns LevelDB: its pages end at the head the journal keeps in memory.
            # On a shared store other replicas append too: the head is read from the store.
            decision_log=DecisionLogReader(
                lanes, head=None if store.capabilities.shared else journal.head
            ),
            rate_limiter=ActorRateLimiter(configuration.rate_limits),
            rate_limit_log=RateLimitLog(journal, configuration.rate_limits, clock=clock),
            session_tokens=session_tokens,
            live=live,
            activations=ActivationLog(
                journal, lanes, live, clock=clock, durable_writes=settings.durable_writes
            ),
            retention=_retention(settings, lanes, clock),
            scrub=_scrub(settings, lanes, clock, metrics),
            policy_source=policy_source,
            approval_pruner=ExpiredApprovalPruner(lanes, clock=clock),
            idle_ttl=idle_ttl,
            expiry=_expiry(settings, lanes, gate, journal, idle_ttl, clock),
            public_origin=configuration.public_origin,
            witnesses=configuration.witnesses,
            timestamp_authority=configuration.timestamp_authority,
            log_checkpoints=_log_checkpoints(settings, lanes, configuration, clock, metrics),
            published_policy=published_policy,
        )
        metrics.watch_policy(context.policy_health)
        return context

    def policy_health(self) -> PolicyHealth:
        """The policy sources' health for `/readyz` and `/metrics`: this process's sidecars',
        or, in a worker of several, what its parent published of its own."""
        if self.published_policy is not None:
            return published_policy_health(self.published_policy)
        return policy_health(
            self.policy_source,
            awaiting_approval=bool(self.activations.awaiting_approval()),
            shadow_refused=self.activations.shadow_refused(),
        )

    def store_reachable(self) -> bool:
        """Whether the store answers now (for `/readyz`)."""
        return reachable(self.lanes)

    def store_takes_writes(self) -> ProbeWrite | None:
        """Whether a probe write commits now (PostgreSQL; None on LevelDB), for `/readyz`."""
        return takes_writes(self.lanes)

    def store_sync_standby_missing(self) -> bool | None:
        """Whether COMMITs wait for a synchronous standby that is not connected (PostgreSQL's
        primary, when it can be told; None on LevelDB), for `/readyz`."""
        return sync_standby_missing(self.lanes)

    def close(self) -> None:
        if self.retention is not None:
            self.retention.close()
        if self.scrub is not None:
            self.scrub.close()
        if self.approval_pruner is not None:
            self.approval_pruner.close()
        if self.expiry is not None:
            self.expiry.close()
        if self.log_checkpoints is not None:
            self.log_checkpoints.close()
        self.rate_limit_log.close()  # its summaries go through the journal
        self.journal.close()
        self.live.stopped()
        self.gate.client.close()
        if self.gate.shadow is not None:
            self.gate.shadow.close()
        self.lanes.close()


def _opened_lanes(store: StoreTarget, metrics: ServiceMetrics) -> Lanes:
    """The configured store, opened and watched by the metrics."""
    lanes = store.open()
    metrics.watch_store(lanes)
    report_dropped_log_bytes(lanes, metrics)
    return lanes


def _opened_journal(
    settings: Settings,
    lanes: Lanes,
    live: LiveRevisions,
    clock: Callable[[], datetime],
    metrics: ServiceMetrics,
) -> DecisionJournal:
    """The decision journal over the store, every chain's head read; says once what an
    older store still lacks (the approval index, the revision summaries)."""
    journal = DecisionJournal(
        lanes,
        clock=clock,
        on_reopened=lambda reopened: report_dropped_log_bytes(reopened, metrics),
        live_revision=live.current,
        signed_heads=SignedHeads(secrets_home(settings)),
    )
    journal.read_every_head()
    if not mark_index_complete_if_empty(lanes):
        # Still correct, by reading every approval of a workspace per lookup.
        log.warning("approvals_not_indexed")
    if not revisions.mark_complete_if_empty(lanes):
        # New decisions are summarised; those before them once `db upgrade` ran.
        log.warning("policy_revisions_not_summarised")
    return journal


def _retention(
    settings: Settings, lanes: Lanes, clock: Callable[[], datetime]
) -> RetentionTask | None:
    """The decision log's pruning, where SESSIONSTATE_DECISION_RETENTION_DAYS asks for it."""
    days = settings.decision_retention_days
    if days is None:
        return None
    return RetentionTask(lanes, days, secrets=secrets_home(settings), clock=clock)


def _scrub(
    settings: Settings, lanes: Lanes, clock: Callable[[], datetime], metrics: ServiceMetrics
) -> DecisionScrub | None:
    """The background walk of every chain; None where SESSIONSTATE_DECISION_SCRUB_SECONDS is 0."""
    interval = settings.decision_scrub_seconds
    if interval == 0:
        return None
    return DecisionScrub(
        lanes, secrets_home(settings), interval=interval, clock=clock, metrics=metrics
    )


def _log_checkpoints(
    settings: Settings,
    lanes: Lanes,
    configuration: Configuration,
    clock: Callable[[], datetime],
    metrics: ServiceMetrics,
) -> LogCheckpoints:
    """The job that signs each grown chain's note every SESSIONSTATE_LOG_CHECKPOINT_SECONDS
    and submits it to SESSIONSTATE_LOG_WITNESSES and SESSIONSTATE_TSA_URL (if set)."""
    witnesses, authority = configuration.witnesses, configuration.timestamp_authority
    return LogCheckpoints(
        lanes,
        secrets_home(settings),
        settings.log_origin,
        Witnessing(witnesses, metrics) if witnesses else None,
        timestamping=None if authority is None else Timestamping(authority, metrics),
        interval=settings.log_checkpoint_seconds,
        clock=clock,
        metrics=metrics,
    )


def _expiry(
    settings: Settings,
    lanes: Lanes,
    gate: PolicyGate,
    journal: DecisionJournal,
    idle_ttl: IdleTTL,
    clock: Callable[[], datetime],
) -> IdleExpiry | None:
    """The idle sweep; None where SESSIONSTATE_STATE_IDLE_TTL_SECONDS is 0."""
    if idle_ttl.seconds == 0:
        return None
    interval = settings.state_expiry_sweep_seconds
    return IdleExpiry(lanes, gate, journal, idle_ttl, interval=interval, clock=clock)


def token_verifier(
    configuration: Configuration, session_tokens: SessionTokenIssuer | None = None
) -> TokenVerifier:
    """What verifies the bearer tokens the settings admit (and the service's own)."""
    settings = configuration.settings
    tokens = session_token_issuer(settings) if session_tokens is None else session_tokens
    return TokenVerifier(
        jwt_secret(settings),
        configuration.jwt_public_key,
        max_lifetime_seconds=settings.jwt_max_lifetime_seconds,
        provider=configuration.identity_provider,
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
