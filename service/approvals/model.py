"""An approval: what an operator posts, the approval as stored and returned, and where
it is stored.

An approval covers one session or a whole workspace for a bounded time. It is
never deleted: revoking stamps `revoked_at`, and expired or revoked approvals
stay stored as history but never count. An approval is stored in the
`approval_packet` lane under its tenant, workspace and id, as the canonical
JSON of its wire shape. A stored approval must name the same tenant, workspace
and id as its key, so an approval can never cover another tenant's,
workspace's or session's state.

An approval that may still apply also has a key in the `approval_index` lane:
an empty value under its tenant, workspace and session (`""` for a whole
workspace's), named by its expiry and its id, so that a forward scan meets the
approval that expires last first. The key only points: the approval itself is
read and checked before it counts.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from service.api.v1 import APPROVAL_ID, APPROVAL_ID_PATTERN
from service.policy.input import PolicyApproval
from store.canonical import canonical_json, sha256_digest
from store.key_codec import LaneKey, TenantResourceLane
from store.record.bounds import JsonInt
from store.scope import ScopeId

logger = logging.getLogger("service.approvals")

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


def first_expired_key(tenant_id: str, workspace_id: str, session_id: str, now: datetime) -> LaneKey:
    """The first index key of the session's approvals that expired by `now`: every key from
    it on names one of those."""
    return LaneKey(
        TenantResourceLane.APPROVAL_INDEX,
        tenant_id,
        workspace_id,
        session_id,
        name=_expiry_name(now) + _NO_ID,
    )


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


def stored_form(approval: Approval) -> tuple[LaneKey, bytes]:
    """Where and how an approval is stored: its key and its canonical JSON."""
    key = approval_key(approval.tenant_id, approval.workspace_id, approval.approval_id)
    return key, canonical_json(approval.model_dump(mode="json"))


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
