"""OAuth 2.0 Token Exchange (RFC 8693): the wire shapes, and what a request holds.

`read_exchange` turns the form of `POST /v1/token` into what the policy judges
(`PolicyExchange`: one word per parameter, never its value), the actor (the
subject token's, verified as any request's bearer token is, else the anonymous
one), when the subject token expires, and the session the `resource` names, if
it names one. Nothing here refuses: `sessionstate.token` decides every request,
so that every exchange, allowed or not, is a decision on the log. The OAuth
error an answer names is chosen from the decision's reason (`oauth_error`).

A `resource` is a session's path, or its URL under the service's public origin
(`SESSIONSTATE_PUBLIC_URL`, read by `public_origin`), never under whatever the
request's `Host` header claims; without that setting only the path is accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol
from urllib.parse import urlsplit

import jwt
from pydantic import BaseModel, ConfigDict, Field

from service.api.reasons import Reason
from service.api.wire import ProblemDocument
from service.auth.tokens import Actor, AuthenticationFailed
from service.policy.input import PolicyExchange, PolicyTarget
from service.policy.trace import DecisionTrace
from store.scope import TenantScope, is_scope_id

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TOKEN_TYPE: Literal["urn:ietf:params:oauth:token-type:jwt"] = (
    "urn:ietf:params:oauth:token-type:jwt"  # noqa: S105 - a token type's name
)
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"  # noqa: S105 - likewise
FORM = "application/x-www-form-urlencoded"
MAX_RESOURCE_CHARS = 2048
# Who asks when the subject token did not verify: no roles, no scope. Its rate limits
# are its client address's (service.rate_limits), its decisions name no tenant.
ANONYMOUS = Actor(sub="anonymous", roles=())
NO_TARGET = PolicyTarget(tenant_id=None, workspace_id=None, session_id=None)
SubjectToken = Literal["valid", "missing", "invalid", "expired", "unverifiable"]

_SESSION_PATH = re.compile(r"/v1/tenants/([^/]*)/workspaces/([^/]*)/sessions/([^/]*)")
_PARAMETERS = (
    "grant_type",
    "subject_token",
    "subject_token_type",
    "resource",
    "actor_token",
    "actor_token_type",
)

OAuthError = Literal[
    "invalid_request",
    "invalid_target",
    "unauthorized_client",
    "unsupported_grant_type",
    "slow_down",
    "temporarily_unavailable",
    "server_error",
]
# The OAuth error (RFC 6749 section 5.2, RFC 8693 section 2.2.2, RFC 8707) of the reason
# a refused exchange is answered with; any other 400 is `invalid_request`.
OAUTH_ERRORS: dict[str, OAuthError] = {
    "token_exchange_grant_type_unsupported": "unsupported_grant_type",
    "token_exchange_resource_malformed": "invalid_target",
    "cross_tenant_scope_rejected": "invalid_target",
    "cross_workspace_scope_rejected": "invalid_target",
    "cross_session_scope_rejected": "invalid_target",
    "role_not_permitted": "unauthorized_client",
    "token_exchange_subject_scope_unsupported": "unauthorized_client",
    "token_exchange_tenant_disabled": "unauthorized_client",
    "token_exchange_subject_token_unverifiable": "temporarily_unavailable",
    Reason.RATE_LIMITED.value: "slow_down",
    Reason.INTERNAL_ERROR.value: "server_error",
}
# A policy's refusal that is no fault of the request: the identity provider's keys.
UNVERIFIABLE = "token_exchange_subject_token_unverifiable"


class TokenExchangeRequest(BaseModel):
    """`POST /v1/token`, form-encoded (`application/x-www-form-urlencoded`). Each parameter
    at most once; `actor_token` is refused, and RFC 8693's other optional parameters are
    ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    grant_type: Literal["urn:ietf:params:oauth:grant-type:token-exchange"]
    subject_token: str = Field(
        min_length=1,
        max_length=8192,
        description="the caller's own token (a model-service token of a tenant and "
        "workspace), verified as a bearer token is",
    )
    subject_token_type: Literal[
        "urn:ietf:params:oauth:token-type:jwt", "urn:ietf:params:oauth:token-type:access_token"
    ]
    resource: str = Field(
        min_length=1,
        max_length=MAX_RESOURCE_CHARS,
        description="the session: `/v1/tenants/{t}/workspaces/{w}/sessions/{s}`, or its "
        "absolute URL under the service's `SESSIONSTATE_PUBLIC_URL` (when set); ids are "
        "scope ids, as sent",
    )


class TokenExchangeResponse(BaseModel):
    """`POST /v1/token`: a session-scoped token (RFC 8693 section 2.2.1), and its decision."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    access_token: str = Field(
        description="an ES256 JWT for the session, signed with a key of `/.well-known/jwks.json`"
    )
    issued_token_type: Literal["urn:ietf:params:oauth:token-type:jwt"] = JWT_TOKEN_TYPE
    token_type: Literal["Bearer"] = "Bearer"  # noqa: S105 - the scheme's name
    expires_in: int = Field(
        ge=1, description="seconds the token lives: never beyond the subject token's `exp`"
    )
    decision: DecisionTrace


class TokenErrorDocument(ProblemDocument):
    """A refused `POST /v1/token`: an OAuth error (RFC 6749 section 5.2) that is also a
    problem document, with the decision when the policy was asked."""

    error: OAuthError
    error_description: str = Field(description="fixed text per reason: the problem's detail")


@dataclass(frozen=True)
class ExchangeRequest:
    """What a token request holds, as the policy is asked about it."""

    facts: PolicyExchange
    actor: Actor
    verified: bool
    session: TenantScope | None  # the resource's session, when it names one
    subject_expires_at: int | None  # the verified subject token's `exp`, whole seconds

    @property
    def target(self) -> PolicyTarget:
        """The session; else the caller's own scope. An unverified caller's request names
        no tenant whatever its resource says, so its refusal goes on no tenant's chain."""
        if not self.verified:
            return NO_TARGET
        if self.session is not None:
            return PolicyTarget(
                tenant_id=self.session.tenant_id,
                workspace_id=self.session.workspace_id,
                session_id=self.session.session_id,
            )
        return PolicyTarget(
            tenant_id=self.actor.tenant_id,
            workspace_id=self.actor.workspace_id,
            session_id=self.actor.session_id,
        )


class FormFields(Protocol):
    """A parsed form body: every value each name was given (werkzeug's MultiDict is one)."""

    def getlist(self, key: str) -> list[str]: ...


def public_origin(url: str) -> str:
    """`SESSIONSTATE_PUBLIC_URL` as the origin a resource's URL must start with exactly:
    `http(s)://host[:port]`, lowercased, without a trailing `/` or the scheme's default
    port (a resource's URL is compared the same way).

    Raises ValueError (a fixed message, never the value) for anything else: a path, a
    query, a fragment, credentials, no host, a port that is no port.
    """
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        raise ValueError("is not a URL") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError("must be http(s)://host[:port]")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must name no user or password")
    if parts.path not in ("", "/") or parts.query or parts.fragment or "?" in url or "#" in url:
        raise ValueError("must have no path, query or fragment: only scheme, host and port")
    return _origin(parts.scheme, parts.hostname, port)


def _origin(scheme: str, hostname: str, port: int | None) -> str:
    """An origin as compared: scheme and host lowercased (RFC 3986 says they are
    case-insensitive), the scheme's default port left out."""
    host = hostname if ":" not in hostname else f"[{hostname}]"
    default = {"https": 443, "http": 80}.get(scheme.lower())
    shown = "" if port is None or port == default else f":{port}"
    return f"{scheme.lower()}://{host.lower()}{shown}"


def read_exchange(
    mimetype: str,
    form: FormFields,
    verify: Callable[[str], Actor],
    origin: str | None,
    *,
    now: int,
) -> ExchangeRequest:
    """The facts, actor and session of a token request (`verify` takes an Authorization
    header's value). `origin` is the service's public origin (`public_origin`), None when
    none is configured: then only a resource's path is accepted. A subject token that
    verifies but ends within the second (`now`, the issuing clock's) counts as expired:
    nothing can be issued that ends with it."""
    is_form = mimetype == FORM
    well_formed = is_form
    values: dict[str, str | None] = {}
    for name in _PARAMETERS:
        given = form.getlist(name) if is_form else []
        if len(given) > 1:  # RFC 6749 section 3.2: a parameter at most once
            well_formed = False
        values[name] = given[0] if len(given) == 1 and given[0] != "" else None
    actor, subject, expires_at = _subject(values["subject_token"], verify, now)
    session = _session(values["resource"], origin)
    facts = PolicyExchange(
        form="valid" if well_formed else "malformed",
        grant_type=_grant_type(values["grant_type"]),
        subject_token_type=_token_type(values["subject_token_type"]),
        subject_token=subject,
        actor_token="absent"
        if values["actor_token"] is None and values["actor_token_type"] is None
        else "present",
        resource="missing"
        if values["resource"] is None
        else "malformed"
        if session is None
        else "valid",
    )
    return ExchangeRequest(facts, actor, subject == "valid", session, expires_at)


def oauth_error(reason: str, status: int) -> OAuthError:
    """The OAuth error of an answer with this reason and status."""
    if reason in OAUTH_ERRORS:
        return OAUTH_ERRORS[reason]
    if status == 503:
        return "temporarily_unavailable"
    if status >= 500:
        return "server_error"
    return "invalid_request"


def _grant_type(value: str | None) -> Literal["token_exchange", "missing", "unsupported"]:
    if value is None:
        return "missing"
    return "token_exchange" if value == GRANT_TYPE else "unsupported"


def _token_type(value: str | None) -> Literal["jwt", "access_token", "missing", "unsupported"]:
    if value is None:
        return "missing"
    return {JWT_TOKEN_TYPE: "jwt", ACCESS_TOKEN_TYPE: "access_token"}.get(  # type: ignore[return-value]
        value, "unsupported"
    )


def _subject(
    token: str | None, verify: Callable[[str], Actor], now: int
) -> tuple[Actor, SubjectToken, int | None]:
    """The subject's actor, what its token is, and (verified) its `exp` in whole seconds."""
    if token is None:
        return ANONYMOUS, "missing", None
    try:
        actor = verify(f"Bearer {token}")
    except AuthenticationFailed as failed:
        if failed.reason is Reason.TOKEN_EXPIRED:
            return ANONYMOUS, "expired", None
        if failed.reason is Reason.TOKEN_KEYS_UNAVAILABLE:
            return ANONYMOUS, "unverifiable", None
        return ANONYMOUS, "invalid", None
    # Verified just now, so `exp` is a finite JSON number within the maximum lifetime.
    expires_at = math.floor(jwt.decode(token, options={"verify_signature": False})["exp"])
    if expires_at <= now:
        return ANONYMOUS, "expired", None
    return actor, "valid", expires_at


def _session(resource: str | None, origin: str | None) -> TenantScope | None:
    """The session a resource names exactly: its path, or its URL under `origin`.

    Nothing is decoded or normalised: a segment that is not a scope id as sent
    (percent-escapes included) makes the resource malformed, and so does a URL when
    no origin is configured, or one whose scheme, host and port are not `origin`'s (in
    any case, the default port written or not), or that names credentials.
    """
    if resource is None or len(resource) > MAX_RESOURCE_CHARS:
        return None
    path = resource
    if not resource.startswith("/"):
        if origin is None:
            return None
        try:
            parts = urlsplit(resource)
            port = parts.port
        except ValueError:
            return None
        if not parts.hostname or parts.username is not None or parts.password is not None:
            return None
        named = _origin(parts.scheme, parts.hostname, port)
        if named != origin or parts.query or parts.fragment or "#" in resource:
            return None
        path = parts.path
    if "?" in path or "#" in path:
        return None
    match = _SESSION_PATH.fullmatch(path)
    if match is None or not all(is_scope_id(part) for part in match.groups()):
        return None
    tenant, workspace, session = match.groups()
    return TenantScope(tenant_id=tenant, workspace_id=workspace, session_id=session)
