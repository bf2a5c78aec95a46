"""`Reason`: every `reason` code the service itself answers with, its HTTP status and its text.

One enumeration for the server's problem documents, the reason table of
docs/model-service.md (a test holds them together) and the client's typed
errors. The codes a policy returns on a denial are Rego's own (`403`, with the
detail of `POLICY_DENIED`); the store's record checks are `store.record.blockers.Blocker`.

Nothing here knows HTTP beyond the numbers: the domain raises its own
exceptions, and `service.http.problems` turns them into problem documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum


class Reason(StrEnum):
    """A reason code, with the status it is answered with and the fixed detail it carries."""

    status: int
    detail: str
    retry_after: int | None

    def __new__(cls, code: str, status: int, detail: str, retry_after: int | None = None) -> Reason:
        member = str.__new__(cls, code)
        member._value_ = code
        member.status = status
        member.detail = detail
        member.retry_after = retry_after  # seconds, when the contract fixes the wait
        return member

    # --- the request itself (400, 408, 413, 414, 415, 422, 431) ---------------------------
    MALFORMED_REQUEST = (
        "malformed_request",
        400,
        "The request could not be read as HTTP (framing, headers or body).",
    )
    CONFLICTING_FRAMING = (
        "conflicting_framing",
        400,
        "The request carries both `Content-Length` and `Transfer-Encoding`: its framing is "
        "ambiguous, so it is refused and the connection closed.",
    )
    UNKNOWN_METHOD = (
        "unknown_method",
        400,
        "The request's method is none the service serves (GET, HEAD, POST, PUT, DELETE, "
        "OPTIONS); the connection is closed.",
    )
    MALFORMED_JSON = (
        "malformed_json",
        400,
        "The request body is not a single well-formed JSON document.",
    )
    INVALID_SCOPE_ID = (
        "invalid_scope_id",
        400,
        "A tenant, workspace or session id in the path (or a fork's `to_session_id`) is not "
        "a valid scope id.",
    )
    INVALID_APPROVAL_ID = (
        "invalid_approval_id",
        400,
        "The approval id in the path is not a valid approval id.",
    )
    INVALID_PRECONDITION = (
        "invalid_precondition",
        400,
        "`If-Match` must be a quoted state digest, and `If-None-Match` only `*`.",
    )
    INVALID_VERSION = (
        "invalid_version",
        400,
        "The version in the path is not a version number (a whole number from 1 to "
        "9007199254740991).",
    )
    REQUEST_TIMEOUT = (
        "request_timeout",
        408,
        "The request body did not arrive within the server's deadline.",
    )
    BODY_TOO_LARGE = ("body_too_large", 413, "The request body is over 1 MiB.")
    REQUEST_TARGET_TOO_LONG = (
        "request_target_too_long",
        414,
        "The request's path and query are over 8 KiB.",
    )
    UNSUPPORTED_MEDIA_TYPE = (
        "unsupported_media_type",
        415,
        "The request body must be `application/json`.",
    )
    VALIDATION_FAILED = (
        "validation_failed",
        422,
        "The request body breaks the rules listed in `errors`.",
    )
    PROOF_OUT_OF_RANGE = (
        "proof_out_of_range",
        422,
        "A proof's tree sizes must be within what the latest checkpoint note signed: "
        "`tree_size` from the entry's seq to that note's size, `1 <= first <= second <=` it.",
    )
    REQUEST_HEADERS_TOO_LARGE = (
        "request_headers_too_large",
        431,
        "The request's headers are over 16 KiB together.",
    )

    # --- authentication (401) -------------------------------------------------------------
    TOKEN_MISSING = (
        "token_missing",
        401,
        "The request needs an `Authorization: Bearer <token>` header.",
    )
    TOKEN_INVALID = (
        "token_invalid",
        401,
        "The bearer token is malformed, wrongly signed or of an unaccepted algorithm.",
    )
    TOKEN_EXPIRED = ("token_expired", 401, "The bearer token has expired.")
    TOKEN_CLAIMS_INVALID = (
        "token_claims_invalid",
        401,
        "The bearer token lacks `sub`, `roles` or `exp`, has a claim out of "
        "bounds or of the wrong type (dates must be numbers), is not yet valid, "
        "or has an invalid scope claim.",
    )
    TOKEN_LIFETIME_TOO_LONG = (
        "token_lifetime_too_long",
        401,
        "The bearer token lives longer than this service accepts; "
        "ask for one with a shorter lifetime.",
    )
    TOKEN_KEYS_UNAVAILABLE = (
        "token_keys_unavailable",
        503,
        "The identity provider's keys (SESSIONSTATE_JWT_JWKS_URL) could not be had (no "
        "key set in time, an answer that is no key set, or a fetch under way), so the "
        "bearer token could not be verified; retry later.",
        5,
    )

    # --- refusals (403, 429) --------------------------------------------------------------
    POLICY_DENIED = (
        "policy_denied",
        403,
        "The policy denied the request; see `decision.reasons`.",
    )
    CROSS_SITE_REQUEST_REJECTED = (
        "cross_site_request_rejected",
        403,
        "A sign-in or sign-out posted from another site is refused.",
    )
    RATE_LIMITED = (
        "rate_limited",
        429,
        "Too many requests, or too many denied requests, from this actor; nothing "
        "was done. Try again after `Retry-After` seconds.",
    )

    # --- what is or is not there (404, 405, 409, 412) -------------------------------------
    SESSION_STATE_NOT_FOUND = (
        "session_state_not_found",
        404,
        "No session state is stored for this scope.",
    )
    SESSION_STATE_ERASED = (
        "session_state_erased",
        404,
        "The session's state was erased; `erased_at` and `erasure_decision_id` name when, "
        "and the decision whose entry is the erasure's receipt. A new write starts it again.",
    )
    APPROVAL_NOT_FOUND = ("approval_not_found", 404, "No such approval in this workspace.")
    DECISION_NOT_FOUND = (
        "decision_not_found",
        404,
        "No decision with this id is in the decision log.",
    )
    CHECKPOINT_NOTE_NOT_FOUND = (
        "checkpoint_note_not_found",
        404,
        "No checkpoint note of this tree size is kept: notes are signed at the sizes the "
        "chain had when a checkpoint was asked for or the background job ran "
        "(`SESSIONSTATE_LOG_CHECKPOINT_SECONDS`).",
    )
    CHECKPOINT_TIMESTAMP_NOT_FOUND = (
        "checkpoint_timestamp_not_found",
        404,
        "No RFC 3161 timestamp is kept for this checkpoint note: the background job asks "
        "the time-stamping authority (`SESSIONSTATE_TSA_URL`) for one for each chain's "
        "newest note every `SESSIONSTATE_LOG_CHECKPOINT_SECONDS`, and none is asked for "
        "when it is unset.",
    )
    NOT_FOUND = ("not_found", 404, "No such resource.")
    METHOD_NOT_ALLOWED = (
        "method_not_allowed",
        405,
        "The resource does not support this method.",
    )
    CHAIN_UNVERIFIED = (
        "chain_unverified",
        409,
        "The decision log does not verify, so nothing is signed for it; "
        "`GET /v1/decisions/verify` names the first problem.",
    )
    DECISION_LOG_TREE_UNAVAILABLE = (
        "decision_log_tree_unavailable",
        409,
        "This tenant's decision log has no Merkle tree that holds (retention pruned entries "
        "before `sessionstate db upgrade` built one, or the tree is damaged), so no checkpoint "
        "note or proof is served for it; its hash chain and `GET /v1/decisions/verify` work "
        "as before.",
    )
    PROOF_PRUNED = (
        "proof_pruned",
        410,
        "Retention deleted the tree nodes this proof needs: a consistency proof must start at "
        "a tree size no smaller than the first kept entry's seq - 1.",
    )
    PRECONDITION_FAILED = (
        "precondition_failed",
        412,
        "The stored state is not the version the request was based on.",
    )

    # --- versions and rewind (404, 409, 428) ----------------------------------------------
    SESSION_STATE_VERSION_NOT_FOUND = (
        "session_state_version_not_found",
        404,
        "The session keeps no version of this number (never written, or older than the "
        "versions kept).",
    )
    SESSION_STATE_VERSION_CORRUPT = (
        "session_state_version_corrupt",
        409,
        "The version does not read as a good record (its read answers a corrupt read "
        "report), so it cannot be restored; nothing was written.",
    )
    PRECONDITION_REQUIRED = (
        "precondition_required",
        428,
        "A rewind needs `If-Match` with the current record's ETag (its state digest, quoted).",
    )

    # --- fork (409) -----------------------------------------------------------------------
    SESSION_STATE_EXISTS = (
        "session_state_exists",
        409,
        "The fork's target session holds a record already; a fork only creates one. "
        "Nothing was written.",
    )

    # --- the service cannot do it now (500, 503) ------------------------------------------
    INTERNAL_ERROR = (
        "internal_error",
        500,
        "The service failed; nothing was written. The request id names it in the logs.",
    )
    POLICY_ENGINE_UNAVAILABLE = (
        "policy_engine_unavailable",
        503,
        "The policy engine did not answer in time; nothing was done.",
        1,
    )
    # Not an outage that passes: an operator must fix the token. A wait over the
    # client's longest (30 s) ends its retries at once.
    POLICY_ENGINE_REFUSED = (
        "policy_engine_refused",
        503,
        "The policy engine refused the service's credentials; nothing was "
        "done. An operator must fix the service's OPA token.",
        60,
    )
    # Not an outage that passes either: the policies in force must be fixed.
    POLICY_DECISION_UNDEFINED = (
        "policy_decision_undefined",
        503,
        "The policies in force give no decision for this request (its decision is undefined, "
        "or not of the decision schema); nothing was done. An operator must fix the policies.",
        60,
    )
    DECISION_LOG_UNAVAILABLE = (
        "decision_log_unavailable",
        503,
        "The decision could not be kept in the decision log; nothing was done.",
    )
    # Not an outage that passes either: retrying ends at once (as POLICY_ENGINE_REFUSED).
    DECISION_LOG_BEHIND_SIGNED_HEAD = (
        "decision_log_behind_signed_head",
        503,
        "This tenant's decision log no longer reaches the head the service signed for it, "
        "so it takes no decision (it would re-use seqs that head covered); nothing was done. "
        "An operator must record the loss (`sessionstate decisions record-loss`).",
        60,
    )
    STORE_UNAVAILABLE = (
        "store_unavailable",
        503,
        "The store cannot be reached or cannot write now; nothing was stored. Retry later.",
        5,
    )
    # The erasure committed, but a read older than it kept its bytes in the store's files.
    ERASURE_INCOMPLETE = (
        "erasure_incomplete",
        503,
        "The session was erased (its receipt is the decision in `Sessionstate-Decision-Id`), "
        "but a read that began before it kept the erased bytes in the store's files; repeat "
        "the erase to remove them.",
        5,
    )
    # Not "nothing was done": repeating a call that is not safe to repeat may do it twice.
    STORE_OUTCOME_UNKNOWN = (
        "store_outcome_unknown",
        503,
        "The store's commit was cut off: the request may or may not have been stored (wholly, "
        "with its decision, or not at all). Look it up before repeating it: its decision id is "
        "in `Sessionstate-Decision-Id`.",
        5,
    )


# `validation_failed` of a query string (every error under `query`) says so, not "body".
QUERY_VALIDATION_DETAIL = "The query string breaks the rules listed in `errors`."


# A denial's one `reason`: the most fundamental refusal leads. Access first (who may
# ask at all), then scope (which tenant, which session), then everything else, in the
# order the policy lists it. Codes not named here (store gates, validation blockers)
# share the last rank.
# A token exchange (`sessionstate.token`) leads with what made the request unjudgeable:
# keys that could not be fetched (a 503 to retry), a malformed request, a subject token
# that did not verify, a resource that names no session.
REASON_PRECEDENCE: tuple[tuple[str, ...], ...] = (
    ("token_exchange_subject_token_unverifiable",),
    ("token_exchange_request_malformed",),
    (
        "token_exchange_parameter_missing",
        "token_exchange_grant_type_unsupported",
        "token_exchange_subject_token_type_unsupported",
        "token_exchange_actor_token_unsupported",
    ),
    ("token_exchange_subject_token_invalid", "token_exchange_subject_token_expired"),
    ("token_exchange_resource_missing", "token_exchange_resource_malformed"),
    ("role_not_permitted", "action_not_supported", "token_exchange_subject_scope_unsupported"),
    (
        "session_state_cross_tenant_write_rejected",
        "cross_tenant_scope_rejected",
        "session_replay_cross_tenant_rejected",
    ),
    (
        "session_state_cross_session_write_rejected",
        "cross_workspace_scope_rejected",
        "cross_session_scope_rejected",
        "session_replay_cross_session_rejected",
    ),
)
_RANK = {code: rank for rank, codes in enumerate(REASON_PRECEDENCE) for code in codes}


def primary_reason(reasons: Sequence[str]) -> str:
    """The one `reason` of a denial: by `REASON_PRECEDENCE`, then the first code in order."""
    if not reasons:
        return Reason.POLICY_DENIED.value
    return min(reasons, key=lambda code: (_RANK.get(code, len(REASON_PRECEDENCE)), code))
