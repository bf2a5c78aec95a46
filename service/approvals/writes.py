"""The one write path of approvals: what granting or revoking one changes.

Nothing here writes. A route builds the approval (`new_approval`) or its
revocation, asks the policy, and hands the keys they change (`approval_writes`,
`revocation_writes`) to the decision journal, which commits them in the same
batch as the entry of the decision that allowed them (`journal_effect`). So no
approval changes without its entry, and an approval and its index key change
together.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta

from service.approvals.model import Approval, ApprovalGrantInput, index_key, stored_form
from store.key_codec import LaneKey

Changes = list[tuple[LaneKey, bytes | None]]
"""Keys to commit in one batch with their new values (None deletes the key)."""


def new_approval(
    tenant_id: str,
    workspace_id: str,
    grant: ApprovalGrantInput,
    operator: str,
    now: datetime,
) -> Approval:
    """A new approval issued at `now` (whole seconds), not yet stored: it is stored with
    the entry of the decision that allowed it."""
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


def approval_writes(approval: Approval) -> Changes:
    """What storing an approval changes: the approval, and its index key, kept while it is
    not revoked and deleted (None) once it is."""
    indexed: bytes | None = None if approval.revoked_at is not None else b""
    return [stored_form(approval), (index_key(approval), indexed)]


def revocation(approval: Approval, now: datetime) -> Approval | None:
    """The approval revoked at `now`, not yet stored; None when it already was revoked
    (revoking twice keeps the first `revoked_at`)."""
    if approval.revoked_at is not None:
        return None
    return Approval.model_validate({**approval.model_dump(), "revoked_at": now})


def revocation_writes(approval: Approval, now: datetime) -> Changes:
    """What revoking an approval at `now` changes: nothing when it already was revoked."""
    revoked = revocation(approval, now)
    return [] if revoked is None else approval_writes(revoked)
