"""The contract's constants the client needs: paths, header names, id patterns, actions.

Written here again (the client may not import the service); `tests/client/test_client_contract.py`
holds each of them to the service's own `service.api.v1`.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import quote

# --- paths (OpenAPI templates) -------------------------------------------------------------
SESSION = "/v1/tenants/{tenant_id}/workspaces/{workspace_id}/sessions/{session_id}"
WORKSPACE = "/v1/tenants/{tenant_id}/workspaces/{workspace_id}"
STATE = SESSION + "/state"
STATE_PREVIEW = SESSION + "/state/preview"
REPLAY_PREVIEW = SESSION + "/replay-preview"
STATE_VERSIONS = SESSION + "/state/versions"
STATE_VERSION = STATE_VERSIONS + "/{version}"
STATE_REWIND = SESSION + "/state/rewind"
FORK = SESSION + "/fork"
APPROVALS = WORKSPACE + "/approvals"
SESSIONS = WORKSPACE + "/sessions"
APPROVAL = APPROVALS + "/{approval_id}"
DECISIONS = "/v1/decisions"
DECISIONS_VERIFY = DECISIONS + "/verify"
DECISIONS_EXPORT = DECISIONS + "/export"
DECISIONS_REVISIONS = DECISIONS + "/policy-revisions"
DECISION = DECISIONS + "/{decision_id}"
EXCHANGE = "/v1/token"  # OAuth 2.0 Token Exchange (RFC 8693)
JWKS = "/.well-known/jwks.json"
HEALTHZ = "/healthz"
READYZ = "/readyz"
METRICS = "/metrics"
OPENAPI = "/openapi.json"

# --- headers -------------------------------------------------------------------------------
DECISION_ID_HEADER = "Sessionstate-Decision-Id"
IF_MATCH = "If-Match"
IF_NONE_MATCH = "If-None-Match"
RETRY_AFTER = "Retry-After"
REQUEST_ID = "X-Request-Id"

# --- ids and actions -----------------------------------------------------------------------
SCOPE_ID_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$"
_SCOPE_ID = re.compile(SCOPE_ID_PATTERN)

PolicyAction = Literal[
    "preview",
    "write",
    "read",
    "replay",
    "approval.grant",
    "approval.revoke",
    "approval.list",
    "decisions.read",
    "token.exchange",
    "policy.approve",
    "list",
    "erase",
    "history",
    "rewind",
    "fork",
]
"""What a decision is about (the decision log's `action` filter)."""

TurnRole = Literal["user", "assistant", "tool", "system"]
"""Who said a turn."""


def is_scope_id(value: object) -> bool:
    """True when value is a tenant, workspace or session id exactly as given."""
    return isinstance(value, str) and _SCOPE_ID.fullmatch(value) is not None


def fill(path: str, **values: str) -> str:
    """A path template with its parameters filled in, each quoted as one path segment."""
    return path.format(**{name: quote(value, safe="") for name, value in values.items()})
