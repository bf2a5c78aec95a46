"""The v1 contract's constants, written once: paths, id patterns, header names, decisions.

The routes (`service.http`) and the OpenAPI document (`service.api.openapi`)
read them from here; the client (`clients/python`, which may not import the
service) keeps copies that tests/client/test_client_contract.py holds to these.
Paths are OpenAPI templates (`{tenant_id}`); `flask_rule` spells one for Flask and `fill` for a request.
Tests hold the rest to them: every `/v1` route is an OpenAPI operation and back,
`policies/system/authz/authz.rego` serves exactly `DECISION_PACKAGES`' packages,
and the client asks for no path that is not here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import quote

from service.policy.input import PolicyAction
from store.scope import SCOPE_ID_PATTERN
from store.version_lane import MAX_VERSION

# --- paths -------------------------------------------------------------------------------
SESSION = "/v1/tenants/{tenant_id}/workspaces/{workspace_id}/sessions/{session_id}"
WORKSPACE = "/v1/tenants/{tenant_id}/workspaces/{workspace_id}"
STATE = SESSION + "/state"
STATE_PREVIEW = SESSION + "/state/preview"
REPLAY_PREVIEW = SESSION + "/replay-preview"
STATE_VERSIONS = SESSION + "/state/versions"  # a session's versions, newest first
STATE_VERSION = STATE_VERSIONS + "/{version}"
STATE_REWIND = SESSION + "/state/rewind"
FORK = SESSION + "/fork"  # a version of the session written as a new session's first record
APPROVALS = WORKSPACE + "/approvals"
SESSIONS = WORKSPACE + "/sessions"  # the workspace's sessions: listed, or all erased
APPROVAL = APPROVALS + "/{approval_id}"
DECISIONS = "/v1/decisions"
DECISIONS_VERIFY = DECISIONS + "/verify"
DECISIONS_EXPORT = DECISIONS + "/export"
DECISIONS_REVISIONS = DECISIONS + "/policy-revisions"
DECISIONS_CHECKPOINT = DECISIONS + "/checkpoint"  # the tenant's latest checkpoint note
DECISIONS_CHECKPOINT_TIMESTAMP = DECISIONS_CHECKPOINT + "/timestamp"  # its RFC 3161 reply
DECISIONS_CONSISTENCY = DECISIONS + "/consistency"
DECISIONS_LOG_KEY = DECISIONS + "/log-key"  # the checkpoint notes' verifier key
DECISION = DECISIONS + "/{decision_id}"
DECISION_INCLUSION = DECISION + "/inclusion"
EXCHANGE = "/v1/token"  # OAuth 2.0 Token Exchange (RFC 8693): session tokens
JWKS = "/.well-known/jwks.json"  # the public keys of the tokens the service issues
HEALTHZ = "/healthz"
READYZ = "/readyz"
METRICS = "/metrics"
OPENAPI = "/openapi.json"
DOCS = "/docs"

# --- methods -----------------------------------------------------------------------------
# Every method some route serves (Flask answers HEAD and OPTIONS for each rule). The HTTP
# front refuses any other with 400 unknown_method before a route runs; logs and metrics
# name a method by `method_label`, never verbatim.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"})


def method_label(method: str) -> str:
    """The method as logs and metric labels name it: one of `METHODS`, else `OTHER`."""
    return method if method in METHODS else "OTHER"


# --- ids in paths ------------------------------------------------------------------------
APPROVAL_ID_PATTERN = r"^appr_[0-9a-f]{24}$"
DECISION_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,64}$"
VERSION_PATTERN = r"^[1-9][0-9]{0,15}$"  # a version number (the route also bounds it: MAX_VERSION)
APPROVAL_ID = re.compile(APPROVAL_ID_PATTERN)
VERSION = re.compile(VERSION_PATTERN)
DECISION_ID = re.compile(DECISION_ID_PATTERN)
PATH_PATTERNS = {
    "tenant_id": SCOPE_ID_PATTERN,
    "workspace_id": SCOPE_ID_PATTERN,
    "session_id": SCOPE_ID_PATTERN,
    "approval_id": APPROVAL_ID_PATTERN,
    "decision_id": DECISION_ID_PATTERN,
    "version": VERSION_PATTERN,
}
# Each path parameter's JSON Schema: its pattern, or for a version the number it spells
# (1 to `MAX_VERSION`; the route refuses leading zeros as its pattern does).
PATH_SCHEMAS: Mapping[str, Mapping[str, object]] = {
    **{name: {"type": "string", "pattern": pattern} for name, pattern in PATH_PATTERNS.items()},
    "version": {"type": "integer", "minimum": 1, "maximum": MAX_VERSION},
}

# --- headers -----------------------------------------------------------------------------
DECISION_ID_HEADER = "Sessionstate-Decision-Id"  # names the decision of an answer without a body
NEXT_CURSOR_HEADER = "Sessionstate-Next-Cursor"  # an export page's next cursor
# A served checkpoint note's witness cosignatures: `<cosignatures it carries>/<quorum>`.
WITNESSED_HEADER = "Sessionstate-Witnessed"
ETAG = "ETag"  # the stored record's state digest, quoted
IF_MATCH = "If-Match"  # replace only this version (a quoted state digest)
IF_NONE_MATCH = "If-None-Match"  # `*`: create only
LOCATION = "Location"  # where a created resource is read
RETRY_AFTER = "Retry-After"
REQUEST_ID = "X-Request-Id"
WORKER = "X-Sessionstate-Worker"  # serve --workers N: which worker process answered (slot:pid)

# --- decisions ---------------------------------------------------------------------------
# Which Rego package decides each action (`data.sessionstate.<package>.decision`).
DECISION_PACKAGES: Mapping[PolicyAction, str] = {
    "preview": "write",
    "write": "write",
    "read": "read",
    "replay": "replay",
    "approval.grant": "approval",
    "approval.revoke": "approval",
    "approval.list": "approval",
    "decisions.read": "audit",
    "token.exchange": "token",
    "policy.approve": "approval",
    "list": "list",
    "erase": "erase",
    "history": "history",
    "rewind": "rewind",
    "fork": "fork",
}

_PARAMETER = re.compile(r"\{([a-z_]+)\}")


def flask_rule(path: str) -> str:
    """A path template as Flask routes it: `{tenant_id}` becomes `<tenant_id>`."""
    return _PARAMETER.sub(r"<\1>", path)


def parameters(path: str) -> list[str]:
    """The names a path template takes, in order."""
    return _PARAMETER.findall(path)


def fill(path: str, **values: str) -> str:
    """A path template with its parameters filled in, each quoted as one path segment."""
    return path.format(**{name: quote(value, safe="") for name, value in values.items()})


def quoted_etag(state_digest: str) -> str:
    return f'"{state_digest}"'
