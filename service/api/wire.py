"""Response envelopes of the HTTP contract, one model each (the OpenAPI document uses them)."""

from __future__ import annotations

import base64
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.approvals.model import Approval
from service.decisions.log import DecisionLogEntry
from service.decisions.revisions import RevisionReport
from service.policy.trace import DecisionTrace
from service.replay import SessionReplayPreview
from store.chain.checkpoints import Checkpoint, RetentionAnchor
from store.chain.full_walk import FullWalk
from store.chain.log_proofs import ConsistencyProof, InclusionProof
from store.chain.loss import RecordedLoss
from store.record.reports import SessionStateReadReport, SessionStateWriteReport
from store.record.state_record import Lineage, SessionStateRecord
from store.version_lane import VersionSummary


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SessionStateResponse(_Envelope):
    """`POST .../state/preview`, `PUT .../state`, `POST .../state/rewind` and `POST .../fork`
    (the target's record)."""

    record: SessionStateRecord
    write_report: SessionStateWriteReport
    decision: DecisionTrace
    version: int | None = Field(
        default=None,
        description="the version the written record is (1 for a session's first record); "
        "null for a preview",
    )
    expires_at: str | None = Field(
        default=None,
        description="RFC 3339: when the written record expires if not written again (its "
        "write + the idle TTL); null: it does not expire, and for a preview",
    )


class SessionStateReadResponse(_Envelope):
    """`GET .../state` and `GET .../state/versions/{version}`."""

    read_report: SessionStateReadReport
    decision: DecisionTrace
    version: int = Field(
        ge=1,
        description="the version read: the current one for `GET .../state` (a record "
        "written before versions were kept is version 1)",
    )
    expires_at: str | None = Field(
        default=None,
        description="`GET .../state`: RFC 3339, when the idle record expires (its last write "
        "+ the idle TTL); null: it does not expire, and for a version read",
    )


class SessionVersionsResponse(_Envelope):
    """`GET .../state/versions`: a page of the session's versions, newest first."""

    versions: list[VersionSummary]
    next_cursor: str | None = Field(description="the next page's `cursor`; null on the last page")
    decision: DecisionTrace


class ReplayPreviewResponse(_Envelope):
    """`POST .../replay-preview`."""

    preview: SessionReplayPreview
    decision: DecisionTrace


class SessionSummary(_Envelope):
    """One session of a workspace's list: its stored record's version and digest, no content."""

    session_id: str
    version: int = Field(
        ge=1,
        description="the stored record's version: its newest (a record written before "
        "versions were kept is version 1)",
    )
    state_digest: str | None = Field(
        description="the stored record's state digest (its ETag); null when the record does "
        "not read (`GET .../state` reports it as corrupt)"
    )
    updated_at: str | None = Field(
        description="RFC 3339: when the record was last written; null for a record last "
        "written before the service kept it"
    )
    expires_at: str | None = Field(
        description="RFC 3339: when the idle record expires (`updated_at` + the idle TTL); "
        "null: it does not"
    )
    lineage: Lineage | None = Field(
        description="where the record was forked from (`POST .../fork`); null for a record "
        "never forked, or one that does not read"
    )


class SessionListResponse(_Envelope):
    """`GET .../workspaces/{workspace_id}/sessions`: a page of the workspace's sessions, in
    session-id order."""

    sessions: list[SessionSummary]
    next_cursor: str | None = Field(description="the `cursor` of the next page; null on the last")
    decision: DecisionTrace


class WorkspaceErasureResponse(_Envelope):
    """`DELETE .../workspaces/{workspace_id}/sessions`: what the workspace's erasure did, each
    session erased with its own receipt on the tenant's chain."""

    sessions_erased: int = Field(ge=0, description="sessions erased by this request")
    sessions_refused: int = Field(
        ge=0, description="sessions the policy refused to erase (each refusal is an entry)"
    )
    sessions_changed: int = Field(
        ge=0,
        description="sessions written while they were being erased, so not erased: repeat "
        "the request to erase them",
    )
    complete: bool = Field(
        description="true when no session of the workspace was left stored by this request"
    )
    decision: DecisionTrace


class ApprovalResponse(_Envelope):
    approval: Approval
    decision: DecisionTrace


class ApprovalListResponse(_Envelope):
    approvals: list[Approval]
    decision: DecisionTrace


class DecisionListResponse(_Envelope):
    """`GET /v1/decisions`: a page of the auditor's tenant's entries, each as stored."""

    decisions: list[DecisionLogEntry]
    next_cursor: str | None
    decision: DecisionTrace


class PolicyRevisionsResponse(_Envelope):
    """`GET /v1/decisions/policy-revisions`: which policy revisions were live on the
    deployment and when, and what each decided (or failed to) for the tenant."""

    tenant_id: str
    complete: bool = Field(
        description="false on a store whose older decisions are not summarised yet "
        "(`sessionstate db upgrade` summarises them)"
    )
    revisions: list[RevisionReport] = Field(
        description="by the earliest of their first live moment and first decision, oldest first"
    )
    decision: DecisionTrace


class DecisionEntryResponse(_Envelope):
    """`GET /v1/decisions/{decision_id}`: one entry as stored, and whether it holds there."""

    entry: DecisionLogEntry
    hash_ok: bool = Field(
        description="true when the entry's hash is its content's digest and its prev_hash is "
        "the previous entry's hash (or the retention anchor's, or genesis, for the first); "
        "the rest of the chain is not read: verify walks it"
    )
    decision: DecisionTrace


HASH_B64_PATTERN = r"^[A-Za-z0-9+/]{43}=$"  # 32 bytes, standard base64
ProofHash = Annotated[str, Field(pattern=HASH_B64_PATTERN)]


class InclusionProofResponse(_Envelope):
    """`GET /v1/decisions/{decision_id}/inclusion`: the entry's RFC 9162 audit path in a tree
    its checkpoint notes signed. Only these four members (what Go's tools read); the governing
    decision's id is in `Sessionstate-Decision-Id`."""

    leaf_index: int = Field(ge=0, description="the entry's leaf: its seq - 1")
    tree_size: int = Field(ge=1, description="the tree the path leads to the root of")
    leaf_hash: ProofHash = Field(
        description="base64 SHA-256 of 0x00 and the entry's stored (RFC 8785) bytes"
    )
    hashes: list[ProofHash] = Field(description="base64, from the leaf's sibling up")

    @classmethod
    def of(cls, proof: InclusionProof) -> InclusionProofResponse:
        return cls(
            leaf_index=proof.leaf_index,
            tree_size=proof.tree_size,
            leaf_hash=_b64(proof.leaf_hash),
            hashes=[_b64(hash_) for hash_ in proof.hashes],
        )


class ConsistencyProofResponse(_Envelope):
    """`GET /v1/decisions/consistency`: the RFC 9162 proof that the tree of `second` leaves
    extends the tree of `first`; the governing decision's id is in `Sessionstate-Decision-Id`."""

    first: int = Field(ge=1)
    second: int = Field(ge=1)
    hashes: list[ProofHash] = Field(description="base64, in RFC 9162 order")

    @classmethod
    def of(cls, proof: ConsistencyProof) -> ConsistencyProofResponse:
        hashes = [_b64(hash_) for hash_ in proof.hashes]
        return cls(first=proof.first, second=proof.second, hashes=hashes)


def _b64(hash_: bytes) -> str:
    return base64.b64encode(hash_).decode("ascii")


class WitnessedHead(_Envelope):
    """Whether the newest checkpoint note a witness cosigned meets the quorum."""

    tree_size: int | None = Field(
        description="the size of the newest note some configured witness's kept cosignature "
        "verifies on; null: no witness cosigned a note of this chain yet"
    )
    cosigned_by: list[str] = Field(
        description="the key names of the witnesses whose cosignature of that note verifies"
    )
    quorum: int = Field(ge=1, description="SESSIONSTATE_LOG_WITNESS_QUORUM (default: all)")
    met: bool = Field(description="at least `quorum` witnesses cosigned that note")


class DecisionVerifyResponse(_Envelope):
    """`GET /v1/decisions/verify`: the chain's state, and a signed checkpoint of its head."""

    ok: bool
    entries: int
    head_hash: str
    first_invalid_seq: int | None
    problem: str | None = Field(
        description="what broke at first_invalid_seq, from a fixed vocabulary"
    )
    checkpoint: Checkpoint | None = Field(
        description="a signed checkpoint of the verified head (none when the chain is broken); "
        "keep it outside the service: a later verify against it catches a truncated tail"
    )
    checkpoint_public_key: str = Field(
        description="PEM of the Ed25519 key checkpoints are signed with; pin it once, keep it apart"
    )
    resumed_from: Checkpoint | None = Field(
        default=None,
        description="the signed head an earlier verify left, which this walk resumed from: the "
        "entry at its seq was checked against its hash, and every entry after it was walked; "
        "null: the whole chain was walked (full=true, or no usable head was remembered)",
    )
    walked_from_seq: int | None = Field(
        description="the first entry this verify read: the first after the retention anchor "
        "for a whole walk, resumed_from's seq for a resumed one; null: it read none (the "
        "chain holds no entry)"
    )
    walked_to_seq: int | None = Field(
        description="the last entry this verify read (the head, or where the problem is); "
        "equal to walked_from_seq when a resumed verify found nothing new; null: it read none"
    )
    last_full_walk: FullWalk | None = Field(
        description="the last walk of the whole chain the service did (this one, when it "
        "walked the whole chain; else an earlier full verify or the background scrub): what "
        "vouches for the entries before walked_from_seq; null: none yet"
    )
    anchor: RetentionAnchor | None = Field(
        default=None,
        description="the signed retention anchor the chain starts from, its signature checked "
        "with the checkpoint key: `origin` `retention` (signed as retention pruned up to it) "
        "or `db_upgrade` (an older release's unsigned anchor, signed by `sessionstate db "
        "upgrade` after the chain from it verified: it vouches that the rest was intact then, "
        "not that retention removed what went before); null: nothing was pruned, or the "
        "anchor did not verify (`anchor_unsigned`, `anchor_signature_invalid`)",
    )
    recorded_losses: list[RecordedLoss] = Field(
        default_factory=list,
        description="the recorded losses this walk went over (`sessionstate decisions "
        "record-loss`): seqs a signed head covered that are gone, which the chain accepts "
        "only because an entry of its own says so; a walk from the whole chain "
        "(full=true) lists every one",
    )
    witnessed: WitnessedHead | None = Field(
        default=None,
        description="the newest checkpoint note the witnesses (SESSIONSTATE_LOG_WITNESSES) "
        "cosigned, and whether it meets the quorum; compare its tree_size with `entries`: "
        "a witness cosigns only heads consistent with every one it cosigned before; null: "
        "no witness is configured",
    )
    decision: DecisionTrace


class FieldError(_Envelope):
    loc: list[str | int] = Field(
        description="path to the field: the model's own field names and list indexes; "
        'a member the model does not know is "(unknown member)", an unknown query '
        'parameter "(unknown parameter)", never the name that was sent'
    )
    rule: str = Field(description="the rule broken, e.g. int_type, extra_forbidden")


class ProblemDocument(_Envelope):
    """RFC 9457 problem details, with `reason` and, after a decision, `decision`."""

    type: str
    title: str
    status: int
    detail: str
    reason: str
    errors: list[FieldError] | None = None
    decision: DecisionTrace | None = None
    write_report: SessionStateWriteReport | None = None
    erased_at: str | None = Field(
        default=None, description="`session_state_erased`: RFC 3339, when it was erased"
    )
    erasure_decision_id: str | None = Field(
        default=None,
        description="`session_state_erased`: the decision whose entry is the erasure's receipt",
    )
    erasure_reason: str | None = Field(
        default=None,
        description="`session_state_erased`: why (`requested`; `expired`: idle expiry)",
    )


class Health(_Envelope):
    status: Literal["ok"] = "ok"


class StoreReadiness(_Envelope):
    kind: Literal["leveldb", "postgresql"] = Field(
        description="leveldb: the embedded store in the data dir; postgresql: SESSIONSTATE_STORE"
    )
    target: str = Field(
        description="LevelDB: its directory; PostgreSQL: host:port/db (never user or password)"
    )
    reachable: bool = Field(description="the store answered now (PostgreSQL: a SELECT 1)")
    takes_writes: bool | None = Field(
        default=None,
        description="PostgreSQL: a probe write committed now, within its bound (it takes the "
        "lock every commit takes on the lanes table, then writes the probe row, and its COMMIT "
        "must answer within the bound too); false with the reason store_write_probe_failed, "
        "store_commit_unconfirmed or store_sync_standby_missing. null on LevelDB, when the "
        "store is not reachable, and while it is latched (store_unwritable)",
    )


class WorkersReadiness(_Envelope):
    count: int = Field(ge=2, description="the worker processes of `serve --workers N`")
    up: int = Field(
        ge=0,
        description="those serving with their store open and writable (their latest beat, "
        "or the answering worker's own probes); fewer than count makes the reason "
        "worker_unavailable",
    )


class Readiness(_Envelope):
    ready: bool
    opa_reachable: bool = Field(description="OPA answered, with a decision or a refusal")
    policy_revision: str | None = Field(description="content hash of the loaded policy set")
    policy_source_valid: bool | None = Field(
        default=None,
        description="false when the last policy reload found a policy directory that does not "
        "compile or does not pass its tests, or a signed bundle OPA refused (the last good "
        "policies still decide); null with an external OPA",
    )
    store_open: bool
    store_writable: bool = Field(
        description="false after a failed write (a full disk, say) until the store is reopened"
    )
    store: StoreReadiness
    chains_behind_signed_head: int = Field(
        default=0,
        ge=0,
        description="tenants' decision logs found behind the head the service signed for them "
        "since it started (read when a decision first goes on one): their requests answer 503 "
        "decision_log_behind_signed_head until the loss is recorded (docs/operators.md)",
    )
    reasons: list[str] = Field(
        description="why it is not ready: opa_unreachable, opa_refused_token, "
        "policy_decision_undefined (OPA answered the readiness probe without a decision), "
        "policy_not_loaded, store_closed, store_unreachable, store_unwritable, "
        "store_write_probe_failed, store_commit_unconfirmed (PostgreSQL: the probe write's "
        "COMMIT did not answer within its bound, as while it waits for a synchronous standby), "
        "store_sync_standby_missing (PostgreSQL: the primary's synchronous_standby_names asks "
        "for more synchronous standbys than are connected, so every COMMIT waits), "
        "worker_unavailable (serve --workers N: a worker is not serving, or its store is closed "
        "or read-only); empty when ready"
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="what is wrong without stopping it from serving: policy_source_invalid, "
        "policy_decision_undefined (with policy_source_invalid: the last reload was refused "
        "because a decision package is undefined or does not answer the decision schema), "
        "policy_bundle_rejected (with policy_source_invalid: OPA refused the signed bundle "
        "offered at the last reload), policy_bundle_rollback (with policy_source_invalid: the "
        "signed bundle of the last reload is older than the highest serial activated on the "
        "deployment, or has none, and was not offered to OPA), policy_tests_failed (with policy_source_invalid: the "
        "policy directory's tests failed, or covered it below SESSIONSTATE_POLICY_COVERAGE_MIN, "
        "at the last reload), policy_tests_skipped (the served policies' tests do not pass: an "
        "operator's `policy reload --skip-tests` served them), decision_scrub_failed (the last whole walk of a "
        "tenant's decision chain found a problem: the decision_scrub_failed log event names "
        "the chain, the problem and the seq), decision_log_behind_signed_head (see "
        "chains_behind_signed_head), policy_health_unavailable (a worker of several could "
        "not read the policy health its parent publishes)",
    )
    workers: WorkersReadiness | None = Field(
        default=None,
        description="serve --workers N: how many workers serve; the same answer whichever "
        "worker gives it. null for a single process",
    )
