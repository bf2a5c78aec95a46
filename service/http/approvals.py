"""Approval routes, for operators: grant, list and revoke durable-write approvals."""

from __future__ import annotations

from flask import Blueprint, Response

from service.api.reasons import Reason
from service.api.v1 import APPROVAL, APPROVAL_ID, APPROVALS, DECISION_ID_HEADER, fill, flask_rule
from service.api.wire import ApprovalListResponse, ApprovalResponse
from service.approvals.model import ApprovalGrantInput
from service.approvals.writes import approval_writes, new_approval, revocation_writes
from service.http.body import json_body
from service.http.common import (
    authenticate,
    authorize,
    checked_ids,
    context,
    journal_effect,
    json_response,
)
from service.http.problems import Problem
from service.policy.input import PolicyTarget

bp = Blueprint("approvals", __name__)


@bp.post(flask_rule(APPROVALS))
def grant_approval(tenant_id: str, workspace_id: str) -> Response:
    actor = authenticate()
    checked_ids(tenant_id, workspace_id)
    grant = json_body(ApprovalGrantInput)
    target = PolicyTarget(
        tenant_id=tenant_id, workspace_id=workspace_id, session_id=grant.session_id
    )
    # The policy judges the approval that would be stored (a tenant may bound its lifetime).
    approval = new_approval(
        tenant_id, workspace_id, grant, operator=actor.sub, now=context().clock()
    )
    trace = authorize("approval.grant", actor, target, approval=approval)
    # The approval and the entry that allowed it commit together.
    journal_effect(201, approval_writes(approval), approval_id=approval.approval_id)
    response = json_response(ApprovalResponse(approval=approval, decision=trace), 201)
    response.headers["Location"] = fill(
        APPROVAL,
        tenant_id=tenant_id,
        workspace_id=workspace_id,
        approval_id=approval.approval_id,
    )
    return response


@bp.get(flask_rule(APPROVALS))
def list_approvals(tenant_id: str, workspace_id: str) -> Response:
    actor = authenticate()
    checked_ids(tenant_id, workspace_id)
    target = PolicyTarget(tenant_id=tenant_id, workspace_id=workspace_id)
    trace = authorize("approval.list", actor, target)
    active = context().approvals.active(tenant_id, workspace_id, context().clock())
    return json_response(ApprovalListResponse(approvals=active, decision=trace))


@bp.delete(flask_rule(APPROVAL))
def revoke_approval(tenant_id: str, workspace_id: str, approval_id: str) -> Response:
    """Revoked at once: the next write decision no longer sees it."""
    actor = authenticate()
    checked_ids(tenant_id, workspace_id)
    if APPROVAL_ID.fullmatch(approval_id) is None:
        raise Problem(Reason.INVALID_APPROVAL_ID)
    target = PolicyTarget(tenant_id=tenant_id, workspace_id=workspace_id)
    trace = authorize("approval.revoke", actor, target)
    current = context().approvals.get(tenant_id, workspace_id, approval_id)
    if current is None:
        raise Problem(Reason.APPROVAL_NOT_FOUND, decision=trace)
    # Revoking twice changes nothing: the first `revoked_at` stays.
    journal_effect(204, revocation_writes(current, context().clock()), approval_id=approval_id)
    # 204 has no body: the decision that governed it is named in a header.
    response = Response(status=204, headers={DECISION_ID_HEADER: trace.decision_id})
    del response.headers["Content-Type"]
    return response
