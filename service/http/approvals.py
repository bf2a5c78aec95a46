"""Approval routes, for operators: grant, list and revoke durable-write approvals."""

from __future__ import annotations

import re

from flask import Blueprint, Response

from service.approvals import ApprovalGrantInput, ApprovalStore, revocation, stored_form
from service.http.body import json_body
from service.http.common import (
    authenticate,
    checked_ids,
    context,
    decide,
    journal_effect,
    json_response,
)
from service.http.problems import Problem
from service.policy.gate import PolicyGate
from service.policy.input import PolicyTarget
from service.wire import ApprovalListResponse, ApprovalResponse

bp = Blueprint("approvals", __name__)
WORKSPACE = "/v1/tenants/<tenant_id>/workspaces/<workspace_id>/approvals"
APPROVAL_ID = re.compile(r"^appr_[0-9a-f]{24}$")
DECISION_ID_HEADER = "Sessionstate-Decision-Id"


@bp.post(WORKSPACE)
def grant_approval(tenant_id: str, workspace_id: str) -> Response:
    actor = authenticate()
    checked_ids(tenant_id, workspace_id)
    grant = json_body(ApprovalGrantInput)
    target = PolicyTarget(
        tenant_id=tenant_id, workspace_id=workspace_id, session_id=grant.session_id
    )
    trace = decide("approval.grant", actor, target)
    PolicyGate.enforce(trace)
    approval = ApprovalStore.new_approval(
        tenant_id, workspace_id, grant, operator=actor.sub, now=context().clock()
    )
    # The approval and the entry that allowed it commit together.
    journal_effect(201, [stored_form(approval)], approval_id=approval.approval_id)
    response = json_response(ApprovalResponse(approval=approval, decision=trace), 201)
    response.headers["Location"] = (
        f"/v1/tenants/{tenant_id}/workspaces/{workspace_id}/approvals/{approval.approval_id}"
    )
    return response


@bp.get(WORKSPACE)
def list_approvals(tenant_id: str, workspace_id: str) -> Response:
    actor = authenticate()
    checked_ids(tenant_id, workspace_id)
    trace = decide(
        "approval.list", actor, PolicyTarget(tenant_id=tenant_id, workspace_id=workspace_id)
    )
    PolicyGate.enforce(trace)
    active = context().approvals.active(tenant_id, workspace_id, context().clock())
    return json_response(ApprovalListResponse(approvals=active, decision=trace))


@bp.delete(WORKSPACE + "/<approval_id>")
def revoke_approval(tenant_id: str, workspace_id: str, approval_id: str) -> Response:
    """Revoked at once: the next write decision no longer sees it."""
    actor = authenticate()
    checked_ids(tenant_id, workspace_id)
    if APPROVAL_ID.fullmatch(approval_id) is None:
        raise Problem(400, "invalid_approval_id")
    trace = decide(
        "approval.revoke", actor, PolicyTarget(tenant_id=tenant_id, workspace_id=workspace_id)
    )
    PolicyGate.enforce(trace)
    current = context().approvals.get(tenant_id, workspace_id, approval_id)
    if current is None:
        raise Problem(404, "approval_not_found", decision=trace)
    revoked = revocation(current, context().clock())
    changes = [] if revoked is None else [stored_form(revoked)]
    journal_effect(204, changes, approval_id=approval_id)
    # 204 has no body: the decision that governed it is named in a header.
    response = Response(status=204, headers={DECISION_ID_HEADER: trace.decision_id})
    del response.headers["Content-Type"]
    return response
