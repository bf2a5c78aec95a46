"""Operations routes, for anyone: liveness, readiness, metrics, the API description."""

from __future__ import annotations

import json

from flask import Blueprint, Response

from service.api.openapi import openapi_document
from service.api.wire import Health, Readiness, StoreReadiness, WorkersReadiness
from service.decisions.witnessing import REFUSED_WARNING
from service.http.common import context, json_response
from service.runtime.worker_beats import WORKER_UNAVAILABLE
from store.backends.contract import ProbeWrite

bp = Blueprint("ops", __name__)


@bp.get("/healthz")
def healthz() -> Response:
    return json_response(Health())


@bp.get("/readyz")
def readyz() -> Response:
    """Ready when OPA answers with a loaded policy revision and the store is open, answers and
    (PostgreSQL) commits a probe write within its bound, COMMIT included, and the primary's
    COMMITs do not wait for a synchronous standby that is not connected.

    A policy directory that did not compile at the last reload, or a signed
    bundle OPA refused at the last reload, is a warning, not a failure: the service still decides, with the last good snapshot, and taking
    every instance out of rotation over an edit nobody activated would turn a
    refused change into an outage. So is a decision chain the scrub found broken: the
    entries are what they are on every instance, and a reviewer must look. So is a
    tenant's decision log found behind the head the service signed for it: that
    tenant's requests answer 503 until its loss is recorded, the others' are served,
    and taking the instance out of rotation would stop them too (every instance shares
    the store, so every one would fail alike: an outage for all tenants that no other
    instance and no failover mends; docs/operators.md weighs it). So is a witness that
    refused a chain's newest checkpoint note (`log_witness_refused`): the log may have been
    rewritten, which a reviewer must look at, and no other instance would serve better.

    With `serve --workers N` the answer covers every worker, whichever gives it: the policy
    health is the parent's (`service.policy.health`), and a worker that is not serving, or
    whose store is closed or read-only, makes it `worker_unavailable`
    (`service.runtime.worker_beats`).
    """
    ctx = context()
    probe = ctx.gate.client.probe()
    if ctx.gate.observe is not None:  # OPA of the operator's: its answer says what is live
        ctx.gate.observe(probe)
    decided = not probe.engine_unavailable
    revision = probe.policy_revision if decided else None
    store_open = not ctx.lanes.closed
    store_reachable = store_open and ctx.store_reachable()
    store_writable = ctx.lanes.writable
    # PostgreSQL: COMMITs that would wait for a synchronous standby that is not there (read
    # from the primary's views, so also while latched by such a COMMIT cut off).
    standby_missing = ctx.store_sync_standby_missing() if store_reachable else None
    # PostgreSQL: a bounded probe write, COMMIT included, so a store that answers but takes no
    # writes (a table locked from elsewhere, a read-only server, a COMMIT that waits) is not
    # ready. Not while latched (its writes are refused anyway, and the reason says so), nor
    # when a synchronous standby is known to be missing (its COMMIT would only wait).
    probed = (
        ctx.store_takes_writes()
        if store_reachable and store_writable and not standby_missing
        else None
    )
    takes_writes = (
        False if standby_missing else None if probed is None else probed is ProbeWrite.COMMITTED
    )
    failing = {
        "opa_unreachable": not decided
        and not probe.engine_refused
        and not probe.decision_undefined,
        "opa_refused_token": probe.engine_refused,
        "policy_decision_undefined": probe.decision_undefined,
        "policy_not_loaded": decided and revision in (None, "unknown"),
        "store_closed": not store_open,
        "store_unreachable": store_open and not store_reachable,
        "store_unwritable": store_reachable and not store_writable,
        "store_write_probe_failed": probed is ProbeWrite.REFUSED,
        "store_commit_unconfirmed": probed is ProbeWrite.COMMIT_UNCONFIRMED,
        "store_sync_standby_missing": standby_missing is True,
    }
    reasons = [reason for reason, failed in failing.items() if failed]
    workers = None
    if ctx.workers is not None:  # a worker of several: the others' beats, with its own probes
        workers = WorkersReadiness(count=ctx.workers.count, up=ctx.workers.up())
        if workers.up < workers.count:
            reasons.append(WORKER_UNAVAILABLE)
    policy = ctx.policy_health()  # a worker of several: its parent's, whichever answers
    source_valid = policy.source_valid
    warnings = list(policy.warnings)
    if ctx.scrub is not None and ctx.scrub.failing:
        warnings.append("decision_scrub_failed")  # a chain's last whole walk did not hold
    checkpoints = ctx.log_checkpoints
    if checkpoints is not None and checkpoints.witnessing and checkpoints.witnessing.refusing:
        warnings.append(REFUSED_WARNING)  # a witness refused a chain's newest note
    behind = ctx.journal.chains_behind_signed_head()
    if behind:  # those tenants' requests fail; the others' are served
        warnings.append("decision_log_behind_signed_head")
    ready = not reasons
    body = Readiness(
        ready=ready,
        reasons=reasons,
        warnings=warnings,
        opa_reachable=decided or probe.engine_refused,
        policy_revision=revision,
        policy_source_valid=source_valid,
        store_open=store_open,
        store_writable=store_writable,
        chains_behind_signed_head=behind,
        workers=workers,
        store=StoreReadiness.model_validate(  # kind: a backend's name, which the wire lists
            {
                "kind": ctx.store.kind,
                "target": ctx.store.target,
                "reachable": store_reachable,
                "takes_writes": takes_writes,
            }
        ),
    )
    return json_response(body, 200 if ready else 503)


@bp.get("/metrics")
def metrics() -> Response:
    return Response(context().metrics.render(), mimetype="text/plain; version=0.0.4")


@bp.get("/openapi.json")
def openapi() -> Response:
    return Response(json.dumps(openapi_document()), mimetype="application/json")
