"""`JournalledApprovals`: approvals granted and revoked as the service's routes do it.

Each grant and each revocation goes through the decision journal, with the
entry of a decision that allowed it, in the same batch (`service.approvals.writes`
builds what changes). The approvals are read back through the same
`ApprovalStore` that the service reads them with.
"""

from __future__ import annotations

from datetime import datetime
from itertools import count

from service.approvals.lookup import ApprovalStore
from service.approvals.model import Approval, ApprovalGrantInput
from service.approvals.writes import Changes, approval_writes, new_approval, revocation_writes
from service.decisions.journal import DecisionJournal
from store.backends.contract import Lanes
from tests.support.factories import decision_entry_body


class JournalledApprovals(ApprovalStore):
    """The service's reads of approvals (over `lanes`), and its one way to change them
    (through `journal`)."""

    def __init__(self, lanes: Lanes, journal: DecisionJournal) -> None:
        super().__init__(lanes)
        self._journal = journal
        self._decisions = count(1)

    def grant(
        self,
        tenant_id: str,
        workspace_id: str,
        grant: ApprovalGrantInput,
        operator: str,
        now: datetime,
    ) -> Approval:
        """Grant and return a new approval, issued at `now` (whole seconds)."""
        approval = new_approval(tenant_id, workspace_id, grant, operator, now)
        self._commit(tenant_id, 201, approval_writes(approval), approval.approval_id)
        return approval

    def revoke(
        self, tenant_id: str, workspace_id: str, approval_id: str, now: datetime
    ) -> Approval | None:
        """Revoke at `now`, as the route does; the approval as stored then. None when absent
        (the route answers 404 and changes nothing)."""
        current = self.get(tenant_id, workspace_id, approval_id)
        if current is None:
            return None
        self._commit(tenant_id, 204, revocation_writes(current, now), approval_id)
        return self.get(tenant_id, workspace_id, approval_id)

    def _commit(self, tenant_id: str, status: int, changes: Changes, approval_id: str) -> None:
        body = decision_entry_body(f"approval-{next(self._decisions)}", tenant_id)
        self._journal.record_effect(body, status=status, puts=changes, approval_id=approval_id)
