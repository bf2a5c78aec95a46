"""Operator approvals for durable writes, kept in the `approval_packet` lane.

An approval covers one session or a whole workspace for a bounded time. It is
never deleted: revoking stamps `revoked_at`, and expired or revoked approvals
stay stored as history but never count. A stored approval must name the same
tenant, workspace and id as its key, so an approval can never cover another
tenant's, workspace's or session's state.

Approvals that may still apply are indexed in the `approval_index` lane, by
tenant, workspace, session (`""` for a whole workspace's) and expiry, with
the approval id: one empty key each, written with the approval and deleted in
the same batch as its revocation (`approval_writes`); the keys of expired ones
are pruned (`service.approval_index`). The lookup a write makes reads its
session's keys and its workspace's, latest expiry first, up to the keys of
approvals expired by then (a bound of the scan, so those are never read): the
approvals of other sessions, revoked ones and expired ones are not read. Each key only points: the approval itself is read and checked (in
force, same session and expiry) before it counts.

A store written before the index existed keeps its approvals without index
keys: until `sessionstate db upgrade` indexes them (`index_approvals`, which
then marks the index complete), lookups scan the workspace's approvals as
before. A store with no approval at all is marked complete when the service
opens it.
"""

from __future__ import annotations

import logging
import secrets
import threading
from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from service.contract import APPROVAL_ID, APPROVAL_ID_PATTERN
from service.policy.input import PolicyApproval
from store.backends.contract import Lanes
from store.bounds import JsonInt
from store.canonical import canonical_json, sha256_digest
from store.keys import LaneKey, TenantResourceLane
from store.scope import ScopeId, TenantScope, is_scope_id

logger = logging.getLogger(__name__)

MAX_APPROVAL_TTL_SECONDS = 86_400
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EXPIRY_BYTES = 8
_LAST_MICROS = (1 << (8 * _EXPIRY_BYTES)) - 1
# Below every approval id (all are "appr_" and 24 hex digits): a key's name is compared after
# its length, so a bound is as long as the names it bounds.
_NO_ID = bytes(len("appr_") + 24)


def _as_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


UtcDatetime = Annotated[AwareDatetime, AfterValidator(_as_utc)]
"""A timezone-aware instant, held in UTC so that it serialises as RFC 3339 with `Z`."""


class ApprovalGrantInput(BaseModel):
    """What an operator posts to grant an approval."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, hide_input_in_errors=True)

    session_id: ScopeId | None = Field(
        default=None, description="the one session approved; absent: the whole workspace"
    )
    ttl_seconds: JsonInt = Field(ge=1, le=MAX_APPROVAL_TTL_SECONDS)
    reason: str = Field(min_length=1, max_length=256)


class Approval(BaseModel):
    """One approval as stored and as returned on the wire."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    approval_id: str = Field(pattern=APPROVAL_ID_PATTERN)
    tenant_id: ScopeId
    workspace_id: ScopeId
    session_id: ScopeId | None = Field(description="None: the whole workspace")
    operator: str = Field(min_length=1, max_length=256, description="the granting actor's sub")
    reason: str = Field(min_length=1, max_length=256)
    issued_at: UtcDatetime
    expires_at: UtcDatetime
    revoked_at: UtcDatetime | None = None

    @model_validator(mode="after")
    def _expires_after_issue(self) -> Approval:
        if self.expires_at <= self.issued_at:
            raise ValueError("expires_at must be after issued_at")
        return self

    def active(self, now: datetime) -> bool:
        return self.revoked_at is None and self.issued_at <= now < self.expires_at

    def to_policy(self) -> PolicyApproval:
        """The approval as the policy input carries it: unix seconds, revoked as a flag."""
        return PolicyApproval(
            approval_id=self.approval_id,
            tenant_id=self.tenant_id,
            workspace_id=self.workspace_id,
            session_id=self.session_id,
            operator=self.operator,
            issued_at=int(self.issued_at.timestamp()),
            expires_at=int(self.expires_at.timestamp()),
            revoked=self.revoked_at is not None,
        )


def is_approval_id(value: object) -> bool:
    return isinstance(value, str) and APPROVAL_ID.fullmatch(value) is not None


def approval_key(tenant_id: str, workspace_id: str, approval_id: str) -> LaneKey:
    return LaneKey(
        TenantResourceLane.APPROVAL_PACKET, tenant_id, workspace_id, "", name=approval_id.encode()
    )


def index_key(approval: Approval) -> LaneKey:
    """The approval's index key: under its session (`""`: its whole workspace), named by
    its expiry and its id. The expiry is 8 bytes big-endian, 2**64 - 1 less microseconds
    since the epoch: a forward scan (cheaper than a backward one) meets the approval that
    expires last first."""
    return LaneKey(
        TenantResourceLane.APPROVAL_INDEX,
        approval.tenant_id,
        approval.workspace_id,
        approval.session_id or "",
        name=_expiry_name(approval.expires_at) + approval.approval_id.encode(),
    )


INDEX_COMPLETE = LaneKey(TenantResourceLane.APPROVAL_INDEX, name=b"complete")
"""Says every stored approval that may apply has its index key (no tenant: the store's own)."""


def _expiry_name(moment: datetime) -> bytes:
    micros = max(0, (moment - _EPOCH) // timedelta(microseconds=1))
    return (_LAST_MICROS - micros).to_bytes(_EXPIRY_BYTES, "big")


def indexed_as(key: LaneKey) -> tuple[datetime, str] | None:
    """The expiry and approval id an index key names; None for a key the index never writes."""
    if len(key.name) <= _EXPIRY_BYTES or not key.tenant:
        return None
    approval_id = key.name[_EXPIRY_BYTES:].decode("ascii", errors="replace")
    if not is_approval_id(approval_id):
        return None
    micros = _LAST_MICROS - int.from_bytes(key.name[:_EXPIRY_BYTES], "big")
    try:
        return _EPOCH + timedelta(microseconds=micros), approval_id
    except OverflowError:  # no expiry the index writes
        return None


class ApprovalStore:
    """Approvals over a lane store (`Lanes`), one key per approval under its tenant and
    workspace, and one index key per approval that may still apply."""

    def __init__(self, lanes: Lanes) -> None:
        self._lanes = lanes
        # Revocation reads, then writes: this lock makes that atomic in the one process.
        self._write_lock = threading.Lock()
        self._index_complete = False

    def grant(
        self,
        tenant_id: str,
        workspace_id: str,
        grant: ApprovalGrantInput,
        operator: str,
        now: datetime,
    ) -> Approval:
        """Store and return a new approval, issued at `now` (whole seconds)."""
        approval = self.new_approval(tenant_id, workspace_id, grant, operator, now)
        self._put(approval)
        return approval

    @staticmethod
    def new_approval(
        tenant_id: str,
        workspace_id: str,
        grant: ApprovalGrantInput,
        operator: str,
        now: datetime,
    ) -> Approval:
        """A new approval, not yet stored (the service stores it with its decision entry)."""
        issued_at = now.replace(microsecond=0)
        return Approval(
            approval_id="appr_" + secrets.token_hex(12),
            tenant_id=tenant_id,
            workspace_id=workspace_id,
            session_id=grant.session_id,
            operator=operator,
            reason=grant.reason,
            issued_at=issued_at,
            expires_at=issued_at + timedelta(seconds=grant.ttl_seconds),
        )

    def get(self, tenant_id: str, workspace_id: str, approval_id: str) -> Approval | None:
        """The stored approval, revoked or expired alike; None when absent or unreadable."""
        if not (is_scope_id(tenant_id) and is_scope_id(workspace_id)):
            return None
        if not is_approval_id(approval_id):
            return None
        key = approval_key(tenant_id, workspace_id, approval_id)
        stored = self._lanes.get(key)
        return None if stored is None else parse_stored(key, stored)

    def active(self, tenant_id: str, workspace_id: str, now: datetime) -> list[Approval]:
        """The workspace's approvals in force at `now`, oldest first."""
        if not (is_scope_id(tenant_id) and is_scope_id(workspace_id)):
            return []
        if not self.index_complete():
            current = self._in_force(tenant_id, workspace_id, now)
        else:
            current = []
            lane = TenantResourceLane.APPROVAL_INDEX
            for key, _ in self._lanes.scan(lane, tenant_id, workspace_id):
                approval = self._pointed(key, now)
                if approval is not None:
                    current.append(approval)
        return sorted(current, key=lambda approval: (approval.issued_at, approval.approval_id))

    def revoke(
        self, tenant_id: str, workspace_id: str, approval_id: str, now: datetime
    ) -> Approval | None:
        """Revoke at once; revoking twice keeps the first `revoked_at`. None when absent."""
        with self._write_lock:
            approval = self.get(tenant_id, workspace_id, approval_id)
            revoked = None if approval is None else revocation(approval, now)
            if revoked is None:
                return approval
            self._put(revoked)
        return revoked

    def covering(self, scope: TenantScope, now: datetime) -> Approval | None:
        """The approval in force for scope: its session's own first, else a workspace-wide one;
        of several, the one that expires last (then the greatest id)."""
        if not self.index_complete():
            return self._covering_by_scan(scope, now)
        if not (is_scope_id(scope.tenant_id) and is_scope_id(scope.workspace_id)):
            return None
        for session_id in (scope.session_id, ""):
            found = self._newest_in_force(scope.tenant_id, scope.workspace_id, session_id, now)
            if found is not None:
                return found
        return None

    def index_complete(self) -> bool:
        """Whether every stored approval that may apply has its index key (once true, for good)."""
        if not self._index_complete:
            self._index_complete = self._lanes.get(INDEX_COMPLETE) is not None
        return self._index_complete

    def _newest_in_force(
        self, tenant_id: str, workspace_id: str, session_id: str, now: datetime
    ) -> Approval | None:
        """Walk the session's index keys, latest expiry first, up to those expired by `now`:
        the first in force (of several expiring at the same instant, the greatest id)."""
        found: Approval | None = None
        lane = TenantResourceLane.APPROVAL_INDEX
        # Every key from here on names an approval that expired by `now`: none is read.
        expired = LaneKey(lane, tenant_id, workspace_id, session_id, _expiry_name(now) + _NO_ID)
        for key, _ in self._lanes.scan(lane, tenant_id, workspace_id, session_id, stop=expired):
            indexed = indexed_as(key)
            if indexed is not None and (
                indexed[0] <= now or (found is not None and indexed[0] != found.expires_at)
            ):
                break  # expired, as is every one after it; or later than the one found
            approval = self._pointed(key, now)
            if approval is not None and (found is None or approval.approval_id > found.approval_id):
                found = approval
        return found

    def _pointed(self, key: LaneKey, now: datetime) -> Approval | None:
        """The approval an index key points at, if it is stored there, matches the key and is
        in force at `now`."""
        indexed = indexed_as(key)
        if indexed is None:
            logger.warning(
                "skipping an unreadable approval index key", extra={"key_digest": key.digest()}
            )
            return None
        expires_at, approval_id = indexed
        if expires_at <= now:
            return None
        approval = self.get(key.tenant, key.workspace, approval_id)
        if (
            approval is None
            or not approval.active(now)
            or (approval.session_id or "") != key.session
            or index_key(approval) != key
        ):
            return None
        return approval

    def _covering_by_scan(self, scope: TenantScope, now: datetime) -> Approval | None:
        """`covering` over a store not indexed yet: every approval of the workspace is read."""
        current = self._in_force(scope.tenant_id, scope.workspace_id, now)
        for session_id in (scope.session_id, None):
            matching = [approval for approval in current if approval.session_id == session_id]
            if matching:
                return max(
                    matching, key=lambda approval: (approval.expires_at, approval.approval_id)
                )
        return None

    def _in_force(self, tenant_id: str, workspace_id: str, now: datetime) -> list[Approval]:
        """Active approvals of exactly this tenant and workspace: one key range, nothing else."""
        if not (is_scope_id(tenant_id) and is_scope_id(workspace_id)):
            return []
        lane = TenantResourceLane.APPROVAL_PACKET
        parsed = (
            parse_stored(key, value)
            for key, value in self._lanes.scan(lane, tenant_id, workspace_id)
        )
        return [approval for approval in parsed if approval is not None and approval.active(now)]

    def _put(self, approval: Approval) -> None:
        with self._lanes.batch(sync=True) as batch:
            for key, change in approval_writes(approval):
                if change is None:
                    batch.delete(key)
                else:
                    batch.put(key, change)


def revocation(approval: Approval, now: datetime) -> Approval | None:
    """The approval revoked at `now`, not yet stored; None when it already was revoked
    (revoking twice keeps the first `revoked_at`)."""
    if approval.revoked_at is not None:
        return None
    return Approval.model_validate({**approval.model_dump(), "revoked_at": now})


def stored_form(approval: Approval) -> tuple[LaneKey, bytes]:
    """Where and how an approval is stored: its key and its canonical JSON."""
    key = approval_key(approval.tenant_id, approval.workspace_id, approval.approval_id)
    return key, canonical_json(approval.model_dump(mode="json"))


def approval_writes(approval: Approval) -> list[tuple[LaneKey, bytes | None]]:
    """What storing an approval changes, to commit in one batch: the approval, and its index
    key, kept while it is not revoked and deleted (None) once it is."""
    indexed: bytes | None = None if approval.revoked_at is not None else b""
    return [stored_form(approval), (index_key(approval), indexed)]


def parse_stored(key: LaneKey, stored: bytes) -> Approval | None:
    """The approval stored under key, or None if the bytes are not one that belongs there."""
    try:
        approval = Approval.model_validate_json(stored)
    except Exception:  # a ValidationError's text may quote the stored bytes: never re-raised
        approval = None
    if (
        approval is None
        or approval_key(approval.tenant_id, approval.workspace_id, approval.approval_id) != key
    ):
        logger.warning(
            "skipping an unreadable approval",
            extra={"key_digest": key.digest(), "error_digest": sha256_digest(stored)},
        )
        return None
    return approval
