"""Keeping the approvals' index: pruning the keys of expired approvals, marking a new
store's index complete, and building the index of a store written before it existed
(`sessionstate db upgrade`).

The approvals themselves are never deleted here: expired ones stay stored as
history, only their index keys go. Each tenant's keys are written in batches of
their own, as on a store sharded by tenant.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from service.approvals.model import INDEX_COMPLETE, index_key, indexed_as, parse_stored
from service.runtime.periodic import PeriodicPrune
from store.backends.contract import Lanes
from store.key_codec import LaneKey, TenantResourceLane

logger = logging.getLogger("service.approvals")

PRUNE_INTERVAL = 3600.0  # seconds between prunes of expired approvals' index keys
_BATCH_KEYS = 1000


def mark_index_complete_if_empty(lanes: Lanes) -> bool:
    """A store holding no approval at all has nothing to index: mark its index complete.
    True when the index is complete (already, or now)."""
    if lanes.get(INDEX_COMPLETE) is not None:
        return True
    if next(iter(lanes.scan(TenantResourceLane.APPROVAL_PACKET)), None) is not None:
        return False
    lanes.put(INDEX_COMPLETE, b"", sync=True)
    return True


def index_approvals(lanes: Lanes, now: datetime) -> int:
    """Index every stored approval that may still apply, then mark the index complete
    (`sessionstate db upgrade`; safe to run again). How many index keys were written."""
    written = 0
    pending: dict[str, list[LaneKey]] = {}
    for key, value in lanes.scan(TenantResourceLane.APPROVAL_PACKET):
        approval = parse_stored(key, value)
        if approval is None or approval.revoked_at is not None or approval.expires_at <= now:
            continue
        batch = pending.setdefault(approval.tenant_id, [])
        batch.append(index_key(approval))
        if len(batch) >= _BATCH_KEYS:
            written += _write_keys(lanes, pending.pop(approval.tenant_id))
    for keys in pending.values():
        written += _write_keys(lanes, keys)
    lanes.put(INDEX_COMPLETE, b"", sync=True)
    return written


def prune_expired_index(lanes: Lanes, now: datetime) -> int:
    """Delete the index keys of approvals expired at `now` (the approvals stay, as history);
    how many went. Each tenant's keys go in batches of their own."""
    pruned = 0
    pending: dict[str, list[LaneKey]] = {}
    for key, _ in lanes.scan(TenantResourceLane.APPROVAL_INDEX):
        indexed = indexed_as(key)
        if indexed is None or indexed[0] > now:
            continue
        batch = pending.setdefault(key.tenant, [])
        batch.append(key)
        if len(batch) >= _BATCH_KEYS:
            pruned += _delete_keys(lanes, pending.pop(key.tenant))
    for keys in pending.values():
        pruned += _delete_keys(lanes, keys)
    return pruned


def _write_keys(lanes: Lanes, keys: list[LaneKey]) -> int:
    with lanes.batch(sync=True) as batch:
        for key in keys:
            batch.put(key, b"")
    return len(keys)


def _delete_keys(lanes: Lanes, keys: list[LaneKey]) -> int:
    with lanes.batch(sync=True) as batch:
        for key in keys:
            batch.delete(key)
    return len(keys)


class ExpiredApprovalPruner(PeriodicPrune):
    """Prunes expired approvals' index keys: once at start, then every `interval` seconds."""

    def __init__(
        self, lanes: Lanes, *, clock: Callable[[], datetime], interval: float = PRUNE_INTERVAL
    ) -> None:
        super().__init__(
            lambda: prune_expired_index(lanes, clock()),
            interval=interval,
            name="approval-index-prune",
            log=logger,
            event="approval_index",
        )
