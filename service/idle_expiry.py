"""Idle expiry: sessions not written for their TTL are erased by a background sweep.

The TTL is the deployment's `SESSIONSTATE_STATE_IDLE_TTL_SECONDS` (0: nothing
expires), or a tenant's shorter `idle_ttl_seconds` (a tenant setting; it never
lengthens it), `IdleTTL`. Every `SESSIONSTATE_STATE_EXPIRY_SWEEP_SECONDS` the
sweep (`IdleExpiry`) walks `EXPIRY_BATCH` meta keys (`store.meta_scan`: no
record is read to find the idle ones) from where the last pass stopped (kept in
memory: a restart walks from the start again). Each idle session is an erasure
as `DELETE .../state` is one: decided by `sessionstate.erase` for the actor
`system` with the reason `expired`, committed with its entry (the receipt) in one
journal batch that expects the record the decision saw, so a write landing in
between is not erased (the erasure then does nothing), then expunged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from service.auth.tokens import Actor
from service.decisions.journal import DecisionJournal
from service.decisions.log import entry_body
from service.decisions.pending import PendingDecision
from service.decisions.record_writes import StateErase
from service.policy.bundle import PolicyBundle
from service.policy.gate import PolicyGate
from service.policy.input import PolicyErasure, PolicyTarget
from service.policy.source import PolicySnapshots
from service.policy.tenant_settings import tenant_idle_ttls
from service.runtime.periodic import PeriodicPrune
from store.backends.contract import Lanes
from store.chain.head import format_timestamp, parse_timestamp
from store.key_codec import LaneKey
from store.meta_scan import WrittenSession, meta_page
from store.scope import TenantScope
from store.session_data import SESSION_DATA_LANES, read_meta
from store.session_state import BuiltOn, Precondition, SessionStateStore
from store.version_lane import newest_number, versions_count

log = logging.getLogger("sessionstate.expiry")
EXPIRY_BATCH = 256  # meta keys one pass walks
SYSTEM = "system"  # the actor, and its one role, of every expiry


class IdleTTL:
    """Each tenant's idle TTL: the deployment's, or the tenant setting's shorter one."""

    def __init__(self, seconds: int, source: PolicySnapshots | None) -> None:
        self.seconds = seconds
        self._source = source  # the local sidecar's snapshot (None: an OPA of one's own)
        self._read: tuple[str, dict[str, int]] = ("", {})  # the tenants' TTLs, by revision

    def of(self, tenant_id: str) -> int:
        """The tenant's TTL in seconds; 0: its sessions never expire."""
        if self.seconds == 0 or self._source is None:
            return self.seconds
        shorter = self._tenant_ttls().get(tenant_id, self.seconds)
        return min(self.seconds, shorter)

    def _tenant_ttls(self) -> dict[str, int]:
        """The served snapshot's tenant TTLs, read once per revision."""
        assert self._source is not None
        served = self._source.served
        revision, ttls = self._read
        if revision != served.revision:
            files = served.files if isinstance(served, PolicyBundle) else ()
            ttls = tenant_idle_ttls(files)
            self._read = (served.revision, ttls)
        return ttls

    def expires_at(self, tenant_id: str, updated_at: str | None) -> str | None:
        """RFC 3339: when a record last written at `updated_at` expires; None: never."""
        ttl = self.of(tenant_id)
        written = parse_timestamp(updated_at)
        if ttl == 0 or written is None:
            return None
        return format_timestamp(written + timedelta(seconds=ttl))


def system_actor(scope: TenantScope) -> Actor:
    return Actor(
        sub=SYSTEM,
        roles=(SYSTEM,),
        tenant_id=scope.tenant_id,
        workspace_id=scope.workspace_id,
        session_id=scope.session_id,
    )


class IdleExpiry(PeriodicPrune):
    """The sweep: a bounded pass at start, then every `interval` seconds, until closed."""

    def __init__(
        self,
        lanes: Lanes,
        gate: PolicyGate,
        journal: DecisionJournal,
        ttl: IdleTTL,
        *,
        interval: float,
        clock: Callable[[], datetime],
        batch: int = EXPIRY_BATCH,
    ) -> None:
        self._lanes = lanes
        self._states = SessionStateStore(lanes)
        self._gate = gate
        self._journal = journal
        self._ttl = ttl
        self._clock = clock
        self._batch = batch
        self._after: LaneKey | None = None  # where the last pass stopped
        super().__init__(
            self.sweep, interval=interval, name="idle-expiry", log=log, event="idle_session"
        )

    def sweep(self) -> int:
        """One pass: the next `batch` meta keys walked, each idle session erased; how many."""
        found, after = meta_page(self._lanes, self._after, self._batch)
        erased = 0
        for session in found:
            outcome = self._expire(session)
            if outcome is None:  # the engine did not decide: this page again next pass
                return erased
            erased += outcome
        self._after = after
        return erased

    def _expire(self, session: WrittenSession) -> bool | None:
        """Erase the session if it is idle for its TTL and the policy allows; whether it
        was erased (None: the engine did not decide)."""
        scope = session.scope
        base = self._states.base(scope)
        newest = newest_number(self._lanes, scope)  # what the erasure holds to
        meta = read_meta(self._lanes, scope)  # after both: a write since shows here
        idle = self._idle(scope, None if meta is None else meta.updated_at)
        if base.version is None or idle is None:
            return False
        actor = system_actor(scope)
        erasure = PolicyErasure(
            reason="expired",
            versions=versions_count(self._lanes, scope, record_stored=True),
            state_digest=base.version,
            idle_seconds=idle,
            idle_ttl_seconds=self._ttl.seconds,
        )
        target = PolicyTarget(
            tenant_id=scope.tenant_id, workspace_id=scope.workspace_id, session_id=scope.session_id
        )
        trace, sent, shadow = self._gate.decide("erase", actor, target, erasure=erasure)
        pending = PendingDecision(entry_body(trace, sent, actor, shadow))
        if not trace.allow:
            pending.record(self._journal, 503 if trace.engine_unavailable else 403)
            return None if trace.engine_unavailable else False
        built_on = Precondition(built_on=BuiltOn(base.version))
        erase = StateErase(scope, built_on, "expired", newest)
        result = pending.record_erase(self._journal, erase)
        if result.applied:
            for lane in SESSION_DATA_LANES:
                self._lanes.expunge(lane, scope.tenant_id, scope.workspace_id, scope.session_id)
        return result.applied

    def _idle(self, scope: TenantScope, updated_at: str | None) -> int | None:
        """Whole seconds the session has been idle, when at least its TTL; else None."""
        written = parse_timestamp(updated_at)
        ttl = self._ttl.of(scope.tenant_id)
        if written is None or ttl == 0:
            return None
        idle = int((self._clock() - written).total_seconds())
        return idle if idle >= ttl else None
