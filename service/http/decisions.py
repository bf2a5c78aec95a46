"""Decision log routes, for compliance reviewers: list, one entry, verify, export, and
which policy revisions decided.

The `audit` policy decides who sees what: an auditor sees its own tenant's
chain, and nothing of another's: its list, verify, export, counts and heads are
its tenant's, and a decision id of another tenant answers exactly as an
unknown one. Reading the log is itself a decision, and is logged.
What the log holds is read through the context's `DecisionLogReader`.
"""

from __future__ import annotations

from contextlib import suppress

from flask import Blueprint, Response

from service.api.reasons import Reason
from service.api.v1 import (
    DECISION,
    DECISION_ID_HEADER,
    DECISIONS,
    DECISIONS_EXPORT,
    DECISIONS_REVISIONS,
    DECISIONS_VERIFY,
    NEXT_CURSOR_HEADER,
    flask_rule,
)
from service.api.wire import (
    DecisionEntryResponse,
    DecisionListResponse,
    DecisionVerifyResponse,
    PolicyRevisionsResponse,
    WitnessedHead,
)
from service.auth.tokens import Actor
from service.decisions import revisions
from service.decisions.query import DecisionQuery, RevisionsQuery, VerifyQuery
from service.decisions.reader import FoundEntry
from service.http.common import authenticate, authorize, context, json_response, query_of
from service.http.problems import Problem
from service.policy.input import PolicyTarget
from service.policy.trace import DecisionTrace
from store.chain.checkpoints import CheckpointSigner
from store.chain.entry import ChainCorrupt
from store.chain.full_walk import FullWalk, last_full_walk, record_full_walk
from store.chain.log_note import LogSigner
from store.chain.signed_head import Verified, resumed_checkpoint
from store.chain.witness_store import newest_cosigned
from store.record.violations import FieldViolation

bp = Blueprint("decisions", __name__)


def chain_status(tenant: str, *, full: bool = False) -> tuple[Verified, FullWalk | None]:
    """The tenant's chain verified, from the head the last verify signed unless `full`; a
    checkpoint of the head that verified (none for a broken chain), remembered for the next.
    And the chain's last whole walk: this one, recorded, when it walked the whole chain."""
    # A chain behind its signed head: 503 now, nothing walked or kept. One whose head does
    # not read: the walk names the problem (the entry of this read cannot be kept).
    with suppress(ChainCorrupt):
        context().journal.head(tenant)
    chain = context().decision_log.chain(tenant)
    secrets, now = context().secrets, context().clock()
    verified = resumed_checkpoint(chain, secrets, now, full=full)
    if verified.resumed_from is None:
        checkpoint = verified.checkpoint
        walk = record_full_walk(chain, verified.result, at=now, by="verify", checkpoint=checkpoint)
        scrub = context().scrub
        if scrub is not None:  # /readyz follows this whole walk at once
            scrub.note(tenant, walk)
        return verified, walk
    # Resumed from a head the data dir's key signed: the key exists.
    return verified, last_full_walk(chain, CheckpointSigner.of(secrets).verifier())


def witnessed_head(tenant: str) -> WitnessedHead | None:
    """The newest note of the tenant's chain a configured witness cosigned, and whether the
    quorum did; None without witnesses."""
    ctx = context()
    witnesses = ctx.witnesses
    if not witnesses:
        return None
    signer = LogSigner.of(ctx.secrets, ctx.settings.log_origin)
    keys = [witness.vkey for witness in witnesses.witnesses]
    newest = newest_cosigned(ctx.lanes, signer, tenant, keys)
    names = [] if newest is None else list(newest.cosigners)
    return WitnessedHead(
        tree_size=None if newest is None else newest.signed.head.size,
        cosigned_by=names,
        quorum=witnesses.quorum,
        met=len(names) >= witnesses.quorum,
    )


def audit_decision(actor: Actor, query_tenant: str | None = None) -> tuple[DecisionTrace, str]:
    """Decide on the tenant an auditor asks about (its own by default)."""
    tenant = query_tenant or actor.tenant_id
    if tenant is None:  # a token without a tenant must name one to be judged on
        missing = FieldViolation(("query", "tenant_id"), "missing")
        raise Problem(Reason.VALIDATION_FAILED, errors=[missing])
    return authorize("decisions.read", actor, PolicyTarget(tenant_id=tenant)), tenant


def decision_entry(actor: Actor, decision_id: str) -> tuple[DecisionTrace, FoundEntry]:
    """One entry of the actor's own tenant's chain, and whether it holds there; decided on
    that tenant before the id is looked up, so another tenant's id and an unknown one get
    the same 404."""
    tenant = actor.tenant_id
    if tenant is None:
        raise Problem(Reason.DECISION_NOT_FOUND)
    trace = authorize("decisions.read", actor, PolicyTarget(tenant_id=tenant))
    found = context().decision_log.get(tenant, decision_id)
    if found is None:
        raise Problem(Reason.DECISION_NOT_FOUND, decision=trace)
    return trace, found


@bp.get(DECISIONS)
def list_decisions() -> Response:
    actor = authenticate()
    query = query_of(DecisionQuery)
    trace, tenant = audit_decision(actor, query.tenant_id)
    page = context().decision_log.page(tenant, query)
    body = DecisionListResponse(
        decisions=page.entries, next_cursor=page.next_cursor, decision=trace
    )
    return json_response(body)


@bp.get(DECISIONS_VERIFY)
def verify_decisions() -> Response:
    """Verify the tenant's chain (from the last verified head, or `?full=true` all of it);
    when it holds, hand out a signed checkpoint of that head, naming the tenant."""
    actor = authenticate()
    full = query_of(VerifyQuery).full == "true"
    trace, tenant = audit_decision(actor)
    # A checkpoint vouches for a head that verified; a broken chain gets none.
    verified, last_walk = chain_status(tenant, full=full)
    result = verified.result
    signer = CheckpointSigner.of(context().secrets)
    return json_response(
        DecisionVerifyResponse(
            ok=result.ok,
            entries=result.entries,
            head_hash=result.head_hash,
            first_invalid_seq=result.first_invalid_seq,
            problem=result.problem,
            checkpoint=verified.checkpoint,
            checkpoint_public_key=signer.public_key_pem.decode("ascii"),
            resumed_from=verified.resumed_from,
            walked_from_seq=result.walked_from_seq,
            walked_to_seq=result.walked_to_seq,
            last_full_walk=last_walk,
            anchor=result.anchor,
            recorded_losses=list(result.recorded_losses),
            witnessed=witnessed_head(tenant),
            decision=trace,
        )
    )


@bp.get(DECISIONS_EXPORT)
def export_decisions() -> Response:
    """NDJSON, one OPA-style decision log event a line, with our entry beside it."""
    actor = authenticate()
    query = query_of(DecisionQuery)
    trace, tenant = audit_decision(actor, query.tenant_id)
    headers = {DECISION_ID_HEADER: trace.decision_id}
    if "limit" in query.model_fields_set:  # one page; without a limit, everything after the cursor
        lines, next_cursor = context().decision_log.export_page(tenant, query)
        if next_cursor is not None:
            headers[NEXT_CURSOR_HEADER] = next_cursor
    else:
        lines = list(context().decision_log.export(tenant, query))
    return Response("".join(lines), mimetype="application/x-ndjson", headers=headers)


@bp.get(DECISIONS_REVISIONS)
def policy_revisions() -> Response:
    """Which policy revisions decided for the tenant, first and last decision, counts by
    action: a few summary keys, kept by the journal, never a walk of the log."""
    actor = authenticate()
    trace, tenant = audit_decision(actor, query_of(RevisionsQuery).tenant_id)
    lanes = context().lanes
    body = PolicyRevisionsResponse(
        tenant_id=tenant,
        complete=revisions.complete(lanes),
        revisions=revisions.revisions(lanes, tenant),
        decision=trace,
    )
    return json_response(body)


@bp.get(flask_rule(DECISION))
def get_decision(decision_id: str) -> Response:
    trace, found = decision_entry(authenticate(), decision_id)
    return json_response(
        DecisionEntryResponse(entry=found.entry, hash_ok=found.hash_ok, decision=trace)
    )
