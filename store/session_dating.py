"""`date_undated_sessions`: records stored before sessions had a meta key get one.

Idle expiry finds idle sessions by their meta key's `updated_at` (`store.meta_scan`),
which every write since this release sets. A record written by an older release has
no meta key, so the sweep would never see it. `sessionstate db upgrade` dates each
such record as written at the upgrade: its idle time starts then, and a write since
(which sets its own `updated_at`) is never overwritten, because each batch expects
the meta keys it adds to be still absent.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

from store.backends.contract import ExpectationFailed, Lanes
from store.key_codec import LaneKey, TenantResourceLane
from store.scope import TenantScope
from store.session_data import meta_key, written_meta

BATCH = 256  # meta keys added in one store batch


def date_undated_sessions(lanes: Lanes, now: str) -> int | None:
    """Give every stored record without a meta key one written at `now` (RFC 3339); how
    many were dated (None: none needed it)."""
    dated = 0
    undated = _undated(lanes)
    while chunk := list(islice(undated, BATCH)):
        dated += _dated(lanes, chunk, now)
    return dated or None


def _undated(lanes: Lanes) -> Iterator[LaneKey]:
    """The meta keys of stored records that have none."""
    for key, _ in lanes.scan(TenantResourceLane.SESSION_STATE):
        scope = TenantScope(
            tenant_id=key.tenant, workspace_id=key.workspace, session_id=key.session
        )
        meta = meta_key(scope)
        if lanes.get(meta) is None:
            yield meta


def _dated(lanes: Lanes, keys: list[LaneKey], now: str) -> int:
    """Add the chunk's meta keys in one batch; when a write dated one meanwhile, each
    of the rest on its own. How many were added."""
    try:
        _commit(lanes, keys, now)
        return len(keys)
    except ExpectationFailed:
        added = 0
        for key in keys:
            try:
                _commit(lanes, [key], now)
                added += 1
            except ExpectationFailed:
                continue  # written since: its own updated_at stands
        return added


def _commit(lanes: Lanes, keys: list[LaneKey], now: str) -> None:
    with lanes.batch(sync=True) as batch:
        for key in keys:
            batch.expect(key, None)
            batch.put(key, written_meta(now))
