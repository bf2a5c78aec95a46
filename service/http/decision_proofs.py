"""The decision log's Merkle proofs, for reviewers: the checkpoint note, its verifier key, and
inclusion and consistency proofs, in the formats Go's `sumdb/note`, `formats/log` and
`transparency-dev/merkle` read.

Decided like the other reviewer reads (`decisions.read` on the tenant, logged). A
note is signed only through the verify's own walk (`chain_status`, the one rule of
`store.chain.signed_head`): a broken chain gets a problem, never a note. Proof sizes
are bounded by the latest note's (`store.chain.log_proofs`), which is signed first
when the chain grew since. The note's RFC 3161 timestamp, where `SESSIONSTATE_TSA_URL`
has the background job ask for one, is served as the authority answered it, for
`openssl ts -verify`. The text answers, the timestamp and the proofs (only the members
Go's tools read) name their decision in `Sessionstate-Decision-Id`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from flask import Blueprint, Response

from service.api.reasons import Reason
from service.api.v1 import (
    DECISION_ID_HEADER,
    DECISION_INCLUSION,
    DECISIONS_CHECKPOINT,
    DECISIONS_CHECKPOINT_TIMESTAMP,
    DECISIONS_CONSISTENCY,
    DECISIONS_LOG_KEY,
    WITNESSED_HEADER,
    flask_rule,
)
from service.api.wire import ConsistencyProofResponse, InclusionProofResponse
from service.decisions.query import (
    CheckpointNoteQuery,
    CheckpointQuery,
    ConsistencyQuery,
    InclusionQuery,
)
from service.http.common import authenticate, context, query_of
from service.http.decisions import audit_decision, chain_status, decision_entry
from service.http.problems import Problem
from service.policy.trace import DecisionTrace
from store.chain.keys import entry_key
from store.chain.log_note import LogSigner, SignedTreeHead, TreeUnavailable, note_of
from store.chain.log_proofs import ProofOutOfRange, ProofPruned, consistency, inclusion
from store.chain.note import VerifierKey
from store.chain.signed_head import ChainUnverified
from store.chain.timestamp_store import newest_timestamped, timestamp_of
from store.chain.witness_store import CosignedNote, cosigned, served_note

bp = Blueprint("decision_proofs", __name__)
TEXT = "text/plain; charset=utf-8"
TIMESTAMP_REPLY = "application/timestamp-reply"


def log_signer() -> LogSigner:
    return LogSigner.of(context().secrets, context().settings.log_origin)


@contextmanager
def refusals(trace: DecisionTrace) -> Iterator[None]:
    """Each refusal of the tree's code as its problem, with the request's decision."""
    try:
        yield
    except ChainUnverified:
        raise Problem(Reason.CHAIN_UNVERIFIED, decision=trace) from None
    except TreeUnavailable:
        raise Problem(Reason.DECISION_LOG_TREE_UNAVAILABLE, decision=trace) from None
    except ProofOutOfRange:
        raise Problem(Reason.PROOF_OUT_OF_RANGE, decision=trace) from None
    except ProofPruned:
        raise Problem(Reason.PROOF_PRUNED, decision=trace) from None


def latest_note(tenant: str) -> SignedTreeHead:
    """The tenant's note of the head its chain verifies to now (signed if it grew)."""
    verified, _ = chain_status(tenant)
    return note_of(context().decision_log.chain(tenant), verified, log_signer())


def _text(
    body: bytes | str, trace: DecisionTrace, headers: dict[str, str] | None = None
) -> Response:
    sent = {DECISION_ID_HEADER: trace.decision_id, **(headers or {})}
    return Response(body, content_type=TEXT, headers=sent)


def _proof(
    body: InclusionProofResponse | ConsistencyProofResponse, trace: DecisionTrace
) -> Response:
    headers = {DECISION_ID_HEADER: trace.decision_id}
    return Response(body.model_dump_json(), mimetype="application/json", headers=headers)


@bp.get(DECISIONS_CHECKPOINT)
def checkpoint_note() -> Response:
    """The tenant's checkpoint note (C2SP tlog-checkpoint, signed note), the latest signed
    when the chain grew (as before). Without witnesses: that note. With witnesses
    (`SESSIONSTATE_LOG_WITNESSES`): the newest kept note that the quorum of their
    cosignatures verify on, those lines appended as further signature lines; while no
    note has the quorum, the latest with the cosignatures it has so far; either way
    `Sessionstate-Witnessed: <cosignatures served>/<quorum>`, and the background job is
    woken to submit a note just signed. With a TSA (`SESSIONSTATE_TSA_URL`): the newest
    such note that a kept timestamp covers (while none is, as above), so that
    `/checkpoint/timestamp` serves its timestamp; the job is woken to timestamp a note
    just signed. `?tree_size=N`: the kept note of that size (1 to the latest's; 404
    `checkpoint_note_not_found` when none is kept)."""
    query = query_of(CheckpointNoteQuery)
    trace, tenant = audit_decision(authenticate(), query.tenant_id)
    served = _checkpoint(tenant, query, trace)
    witnesses = context().witnesses
    if not witnesses:
        return _text(served.signed.note, trace)
    witnessed = f"{len(served.cosigners)}/{witnesses.quorum}"
    return _text(served.note, trace, {WITNESSED_HEADER: witnessed})


@bp.get(DECISIONS_CHECKPOINT_TIMESTAMP)
def checkpoint_timestamp() -> Response:
    """The RFC 3161 `TimeStampResp` (DER, `application/timestamp-reply`) kept for the
    checkpoint note `GET /v1/decisions/checkpoint` serves now (with a TSA configured, the
    newest note timestamped, and cosigned by the witnesses' quorum where witnesses are),
    or with `?tree_size=N` for the kept note of that size; 404
    `checkpoint_timestamp_not_found` when no reply covering that note is kept."""
    query = query_of(CheckpointNoteQuery)
    trace, tenant = audit_decision(authenticate(), query.tenant_id)
    served = _checkpoint(tenant, query, trace)
    reply = timestamp_of(context().lanes, tenant, served.signed)
    if reply is None:
        raise Problem(Reason.CHECKPOINT_TIMESTAMP_NOT_FOUND, decision=trace)
    headers = {DECISION_ID_HEADER: trace.decision_id}
    return Response(reply, content_type=TIMESTAMP_REPLY, headers=headers)


def _checkpoint(tenant: str, query: CheckpointNoteQuery, trace: DecisionTrace) -> CosignedNote:
    """The note the checkpoint routes serve: the kept note of `tree_size`, else the newest
    timestamped (with a TSA) or cosigned by the quorum (with witnesses), else the latest;
    the background job woken for a note just signed (not on this request)."""
    ctx = context()
    with refusals(trace):
        newest = latest_note(tenant)
        signer, witnesses = log_signer(), ctx.witnesses
        keys = [witness.vkey for witness in witnesses.witnesses]
        if query.tree_size is not None:
            return _kept(tenant, query.tree_size, newest.head.size, keys, trace)
        if ctx.log_checkpoints is not None and (witnesses or ctx.timestamp_authority):
            ctx.log_checkpoints.wake()
        if ctx.timestamp_authority is not None:
            found = newest_timestamped(ctx.lanes, signer, tenant, keys, witnesses.quorum)
            if found is not None:
                return found
        return served_note(ctx.lanes, signer, tenant, newest, keys, witnesses.quorum)


def _kept(
    tenant: str, size: int, latest: int, keys: list[VerifierKey], trace: DecisionTrace
) -> CosignedNote:
    if size > latest:
        raise ProofOutOfRange("the tree size must be at most the latest note's")
    found = cosigned(context().lanes, log_signer(), tenant, size, keys)
    if found is None:
        raise Problem(Reason.CHECKPOINT_NOTE_NOT_FOUND, decision=trace)
    return found


@bp.get(DECISIONS_LOG_KEY)
def log_key() -> Response:
    """The notes' verifier key, `<name>+<hex id>+<base64 key>`, and a newline."""
    trace, _ = audit_decision(authenticate(), query_of(CheckpointQuery).tenant_id)
    return _text(f"{log_signer().verifier_key}\n", trace)


@bp.get(flask_rule(DECISION_INCLUSION))
def inclusion_proof(decision_id: str) -> Response:
    """One entry's audit path in the tree of `tree_size` (default: the latest note's)."""
    actor = authenticate()
    query = query_of(InclusionQuery)
    trace, found = decision_entry(actor, decision_id)
    tenant = actor.tenant_id or ""  # decision_entry found it on the actor's tenant's chain
    chain = context().decision_log.chain(tenant)
    stored = context().lanes.get(entry_key(found.entry.seq, tenant))
    if stored is None:  # pruned since it was read
        raise Problem(Reason.DECISION_NOT_FOUND, decision=trace)
    with refusals(trace):
        latest = latest_note(tenant).head.size
        size = latest if query.tree_size is None else query.tree_size
        proof = inclusion(chain, found.entry.seq, stored, size, latest)
    body = InclusionProofResponse.of(proof)
    return _proof(body, trace)


@bp.get(DECISIONS_CONSISTENCY)
def consistency_proof() -> Response:
    """That the tree of `second` leaves extends the tree of `first`."""
    actor = authenticate()
    query = query_of(ConsistencyQuery)
    trace, tenant = audit_decision(actor, query.tenant_id)
    with refusals(trace):
        latest = latest_note(tenant).head.size
        chain = context().decision_log.chain(tenant)
        proof = consistency(chain, query.first, query.second, latest)
    return _proof(ConsistencyProofResponse.of(proof), trace)
