"""The Python client of sessionstate, for model services, operators and auditors.

`SessionStateClient` (sync, httpx) and `AsyncSessionStateClient` (asyncio)
call every endpoint of the v1 contract and return its wire models
(`sessionstate_client.models`); `ModelServiceSession` and
`AsyncModelServiceSession` are the design note's five steps of a model
service on top of them (`for_service`: a bot's session, its token exchanged
from one service token by `SessionTokens`). Errors are the exceptions below, one per status and
reason, each with `status`, `reason` and, once the policy was asked, the
`decision`. Depends on httpx and pydantic only.
"""

from sessionstate_client._calls import DecisionFilters, GrantBody, StateBody
from sessionstate_client.aio import AsyncSessionStateClient, AsyncTokenSource
from sessionstate_client.client import SessionStateClient, TokenSource
from sessionstate_client.digests import DigestKey, estimate_tokens
from sessionstate_client.errors import (
    AuthenticationFailed,
    Conflict,
    CorruptState,
    DecisionLogBehindSignedHead,
    DecisionLogUnavailable,
    ErasureIncomplete,
    InvalidRequest,
    NotFound,
    PolicyDecisionUndefined,
    PolicyDenied,
    PolicyEngineRefused,
    PolicyEngineUnavailable,
    PreconditionFailed,
    RateLimited,
    ServiceUnavailable,
    SessionStateError,
    StoreOutcomeUnknown,
    StoreUnavailable,
    TokenKeysUnavailable,
    UnexpectedResponse,
)
from sessionstate_client.models import (
    ApprovalGrantInput,
    SessionStateInput,
    SessionTurnInput,
    TenantScope,
)
from sessionstate_client.retries import RetryPolicy
from sessionstate_client.session import (
    AsyncModelServiceSession,
    CommitResult,
    ModelServiceSession,
    RuntimeRequest,
)
from sessionstate_client.session_tokens import AsyncSessionTokens, SessionTokens

__all__ = [
    "ApprovalGrantInput",
    "AsyncModelServiceSession",
    "AsyncSessionStateClient",
    "AsyncSessionTokens",
    "AsyncTokenSource",
    "AuthenticationFailed",
    "CommitResult",
    "Conflict",
    "CorruptState",
    "DecisionFilters",
    "DecisionLogBehindSignedHead",
    "DecisionLogUnavailable",
    "DigestKey",
    "ErasureIncomplete",
    "GrantBody",
    "InvalidRequest",
    "ModelServiceSession",
    "NotFound",
    "PolicyDecisionUndefined",
    "PolicyDenied",
    "PolicyEngineRefused",
    "PolicyEngineUnavailable",
    "PreconditionFailed",
    "RateLimited",
    "RetryPolicy",
    "RuntimeRequest",
    "ServiceUnavailable",
    "SessionStateClient",
    "SessionStateError",
    "SessionStateInput",
    "SessionTokens",
    "SessionTurnInput",
    "StateBody",
    "StoreOutcomeUnknown",
    "StoreUnavailable",
    "TenantScope",
    "TokenKeysUnavailable",
    "TokenSource",
    "UnexpectedResponse",
    "estimate_tokens",
]
