"""The Python client of sessionstate, for model services, operators and auditors.

`SessionStateClient` calls every endpoint of the v1 contract and returns the
wire models; `ModelServiceSession` is the design note's five steps of a local
model service on top of it. Errors are the exceptions below, one per status
and reason. See docs/model-service.md, "The Python client".
"""

from service.client.api import DecisionFilters, SessionStateClient, StateBody, TokenSource
from service.client.errors import (
    AuthenticationFailed,
    CorruptState,
    DecisionLogUnavailable,
    InvalidRequest,
    NotFound,
    PolicyDenied,
    PolicyEngineRefused,
    PolicyEngineUnavailable,
    PreconditionFailed,
    RateLimited,
    ServiceUnavailable,
    SessionStateError,
    StoreUnavailable,
    TokenKeysUnavailable,
    UnexpectedResponse,
)
from service.client.retries import RetryPolicy
from service.client.session import CommitResult, ModelServiceSession, RuntimeRequest

__all__ = [
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
