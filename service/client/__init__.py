"""The Python client, re-exported: it lives in its own distribution, `sessionstate-client`.

`clients/python/` builds it (import name `sessionstate_client`, httpx and
pydantic only, nothing of the service); this name stays so that code written
against `service.client` keeps working. New code imports `sessionstate_client`.
See docs/model-service.md, "The Python client".
"""

from sessionstate_client import (
    AsyncModelServiceSession,
    AsyncSessionStateClient,
    AuthenticationFailed,
    CommitResult,
    CorruptState,
    DecisionFilters,
    DecisionLogUnavailable,
    InvalidRequest,
    ModelServiceSession,
    NotFound,
    PolicyDenied,
    PolicyEngineRefused,
    PolicyEngineUnavailable,
    PreconditionFailed,
    RateLimited,
    RetryPolicy,
    RuntimeRequest,
    ServiceUnavailable,
    SessionStateClient,
    SessionStateError,
    StateBody,
    StoreUnavailable,
    TokenKeysUnavailable,
    TokenSource,
    UnexpectedResponse,
)

__all__ = [
    "AsyncModelServiceSession",
    "AsyncSessionStateClient",
    "AuthenticationFailed",
    "CommitResult",
    "CorruptState",
    "DecisionFilters",
    "DecisionLogUnavailable",
    "InvalidRequest",
    "ModelServiceSession",
    "NotFound",
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
    "StateBody",
    "StoreUnavailable",
    "TokenKeysUnavailable",
    "TokenSource",
    "UnexpectedResponse",
]
