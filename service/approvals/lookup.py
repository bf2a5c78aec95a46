"""`ApprovalStore`: the approvals in force for a write, and an approval by its id.

The lookup a write makes reads its session's index keys and its workspace's,
latest expiry first, up to the keys of approvals expired by then (a bound of
the scan, so those are never read): the approvals of other sessions, revoked
ones and expired ones are not read. Each key only points: the approval itself
is read and checked (in force, same session and expiry) before it counts.

A store written before the index existed keeps its approvals without index
keys. Until `sessionstate db upgrade` indexes them (`index_approvals`, which
then marks the index complete), lookups scan the workspace's approvals as
before. A store with no approval at all is marked complete when the service
opens it.
"""

from __future__ import annotations

import logging
from datetime import datetime

from service.approvals.model import (
    INDEX_COMPLETE,
    Approval,
    approval_key,
    first_expired_key,
    index_key,
    indexed_as,
    is_approval_id,
    parse_stored,
)
from store.backends.contract import Lanes
from store.key_codec import LaneKey, TenantResourceLane
from store.scope import TenantScope, is_scope_id

logger = logging.getLogger("service.approvals")


class ApprovalStore:
    """The stored approvals as the service reads them, over a lane store (`Lanes`). Nothing
    here writes: approvals change only with the decision that allowed it
    (`service.approvals.writes`)."""

    def __init__(self, lanes: Lanes) -> None:
        self._lanes = lanes
        self._index_complete = False

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
        expired = first_expired_key(tenant_id, workspace_id, session_id, now)
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
