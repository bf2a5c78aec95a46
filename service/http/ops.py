"""Operations routes, for anyone: liveness, readiness, metrics, the API description."""

from __future__ import annotations

import json

from flask import Blueprint, Response

from service.http.common import context, json_response
from service.openapi import openapi_document
from service.policy.input import PolicyActor, PolicyDeployment, PolicyInput, PolicyTarget
from service.wire import Health, Readiness

bp = Blueprint("ops", __name__)

# A fixed, harmless question whose answer proves OPA decides with a loaded policy.
_PROBE = PolicyInput(
    action="decisions.read",
    now=0,
    actor=PolicyActor(sub="sessionstate-readiness-probe", roles=[]),
    target=PolicyTarget(tenant_id="readiness-probe"),
    deployment=PolicyDeployment(durable_writes_enabled=False),
)


@bp.get("/healthz")
def healthz() -> Response:
    return json_response(Health())


@bp.get("/readyz")
def readyz() -> Response:
    """Ready when OPA answers with a loaded policy revision and the store is open."""
    ctx = context()
    probe = ctx.gate.client.decide(_PROBE)
    reachable = not probe.engine_unavailable
    revision = probe.policy_revision if reachable else None
    store_open = not ctx.lanes.closed
    store_writable = ctx.lanes.writable
    failing = {
        "opa_unreachable": not reachable,
        "policy_not_loaded": reachable and revision in (None, "unknown"),
        "store_closed": not store_open,
        "store_unwritable": store_open and not store_writable,
    }
    reasons = [reason for reason, failed in failing.items() if failed]
    ready = not reasons
    body = Readiness(
        ready=ready,
        reasons=reasons,
        opa_reachable=reachable,
        policy_revision=revision,
        store_open=store_open,
        store_writable=store_writable,
    )
    return json_response(body, 200 if ready else 503)


@bp.get("/metrics")
def metrics() -> Response:
    return Response(context().metrics.render(), mimetype="text/plain; version=0.0.4")


@bp.get("/openapi.json")
def openapi() -> Response:
    return Response(json.dumps(openapi_document()), mimetype="application/json")
