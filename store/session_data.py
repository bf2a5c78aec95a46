"""Where a session's data lives, and what is kept of a session once it is erased.

`SESSION_DATA_LANES` names every lane that holds a session's data under its
tenant, workspace and session: an erasure deletes every key of the session in
each of them (`session_data_keys`), in the batch that keeps its receipt. A lane
that comes to hold a session's data joins erasure by being named there.

Beside them, each session has one small key in `session_meta` that holds no
content: while a record is stored, when it was last written (`updated_at`);
once the session is erased, its tombstone (`Erasure`: when, by which decision,
why), which a read answers with. The next write replaces the tombstone.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from store.backends.contract import LaneView
from store.canonical import canonical_json
from store.key_codec import LaneKey, TenantResourceLane
from store.scope import TenantScope

SESSION_DATA_LANES: tuple[TenantResourceLane, ...] = (
    TenantResourceLane.SESSION_STATE,
    TenantResourceLane.SESSION_VERSION,
)
"""Every lane holding a session's data, keyed by tenant, workspace and session."""

ErasureReason = Literal["requested", "expired"]
"""requested: a caller asked for it; expired: the idle-expiry sweep found it idle."""


class _Stored(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


class Erasure(_Stored):
    """A session's tombstone: that it was erased, when, by which decision, and why."""

    erased_at: str = Field(description="RFC 3339: when the erasure and its receipt committed")
    erasure_decision_id: str = Field(description="the decision whose entry is the receipt")
    erasure_reason: ErasureReason = Field(
        description="requested: a caller asked for it; expired: idle longer than its TTL"
    )


class SessionMeta(_Stored):
    """The session's meta key: `updated_at` while a record is stored, `erasure` once erased."""

    updated_at: str | None = None
    erasure: Erasure | None = None


def meta_key(scope: TenantScope) -> LaneKey:
    return LaneKey(
        TenantResourceLane.SESSION_META, scope.tenant_id, scope.workspace_id, scope.session_id
    )


def written_meta(updated_at: str) -> bytes:
    """The meta key's value after a write at `updated_at` (it replaces any tombstone)."""
    return canonical_json(SessionMeta(updated_at=updated_at).model_dump(exclude_none=True))


def erased_meta(erasure: Erasure) -> bytes:
    """The meta key's value once the session is erased: its tombstone, no content."""
    return canonical_json(SessionMeta(erasure=erasure).model_dump(exclude_none=True))


def parsed_meta(stored: bytes | None) -> SessionMeta | None:
    """The meta key's value read back; None when absent or not of its shape."""
    if stored is None:
        return None
    try:
        return SessionMeta.model_validate_json(stored)
    except ValidationError:
        return None


def read_meta(view: LaneView, scope: TenantScope) -> SessionMeta | None:
    return parsed_meta(view.get(meta_key(scope)))


def session_data_keys(view: LaneView, scope: TenantScope) -> list[LaneKey]:
    """Every key of the session in `SESSION_DATA_LANES`: what its erasure deletes."""
    return [
        key
        for lane in SESSION_DATA_LANES
        for key, _ in view.scan(lane, scope.tenant_id, scope.workspace_id, scope.session_id)
    ]
