"""`meta_page`: a bounded, resumable walk of every session's meta key, across tenants.

The idle-expiry sweep finds idle sessions here without reading any record: each
meta key holds only when its session was last written (`updated_at`) or its
tombstone. A page starts after the key the previous one stopped at, and says
where it stopped; at the lane's end it says None, and the next walk starts again.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

from store.backends.contract import LaneView
from store.key_codec import LaneKey, TenantResourceLane
from store.scope import TenantScope
from store.session_data import parsed_meta


@dataclass(frozen=True)
class WrittenSession:
    """A session whose meta key says a record is stored, and when it was last written."""

    scope: TenantScope
    updated_at: str


def meta_page(
    view: LaneView, after: LaneKey | None, limit: int
) -> tuple[list[WrittenSession], LaneKey | None]:
    """The written sessions among the next `limit` meta keys after `after` (None: from the
    lane's start), and the key to start after next (None: the lane's end was reached)."""
    lane = TenantResourceLane.SESSION_META
    start = (
        None
        if after is None
        else LaneKey(lane, after.tenant, after.workspace, after.session, b"\x00")
    )
    found = list(islice(view.scan(lane, start=start), limit))
    written = []
    for key, value in found:
        meta = parsed_meta(value)
        if meta is None or meta.updated_at is None or not key.session:
            continue  # a tombstone, or a key not of its shape: nothing to expire
        scope = TenantScope(
            tenant_id=key.tenant, workspace_id=key.workspace, session_id=key.session
        )
        written.append(WrittenSession(scope, meta.updated_at))
    return written, (found[-1][0] if len(found) == limit else None)
