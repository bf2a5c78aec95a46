"""Token routes: `POST /v1/token` (OAuth 2.0 Token Exchange) and the service's JWKS.

Every request to the token endpoint is decided by `sessionstate.token` through
`authorize`, with the anonymous actor when the subject token did not verify,
so rate limits, the denial budget and the decision log treat it as any other
request: an anonymous one's budgets are its client address's, and its decision
names no tenant (it goes on the `~no-tenant` chain, whatever `resource` says). Its errors are OAuth errors (RFC 6749 section 5.2) that are problem
documents too (`TokenErrorDocument`): `token_error` renders every problem of
this path, whatever raised it.
"""

from __future__ import annotations

from http import HTTPStatus

from flask import Blueprint, Response, g, request

from service.api.reasons import Reason
from service.api.v1 import EXCHANGE, JWKS
from service.auth.token_exchange import (
    UNVERIFIABLE,
    TokenExchangeResponse,
    oauth_error,
    read_exchange,
)
from service.http.common import authorize, context, json_response
from service.http.problems import Problem, document_response

bp = Blueprint("token", __name__)
JWKS_MAX_AGE_SECONDS = 300


@bp.post(EXCHANGE)
def exchange_token() -> Response:
    """A session token for the session `resource` names, if the policy allows."""
    ctx = context()
    now = int(ctx.clock().timestamp())
    asked = read_exchange(
        request.mimetype, request.form, ctx.verifier.verify, ctx.public_origin, now=now
    )
    if asked.verified:
        g.actor_sub = asked.actor.sub
    trace = authorize(
        "token.exchange",
        asked.actor,
        asked.target,
        exchange=asked.facts,
        authenticated=asked.verified,
    )
    if asked.session is None or asked.subject_expires_at is None:
        raise Problem(Reason.INTERNAL_ERROR)  # the policy allowed what it never may: no token
    issued = ctx.session_tokens.issue(
        asked.actor,
        asked.session,
        token_id=trace.decision_id,
        now=now,
        not_after=asked.subject_expires_at,
    )
    response = json_response(
        TokenExchangeResponse(
            access_token=issued.access_token, expires_in=issued.expires_in, decision=trace
        )
    )
    response.headers["Pragma"] = "no-cache"  # RFC 6749 section 5.1, beside no-store
    return response


@bp.get(JWKS)
def jwks() -> Response:
    """The public keys of the session tokens the service issues (RFC 7517)."""
    response = json_response(context().session_tokens.key_set())
    response.headers["Cache-Control"] = f"public, max-age={JWKS_MAX_AGE_SECONDS}"
    return response


def token_error(problem: Problem) -> Response:
    """A problem of the token endpoint as an OAuth error: `400` for what the policy refused
    (`503` when the subject token could not be verified for want of keys), the problem's
    own status otherwise; the problem's members, its decision included, beside `error`."""
    status = problem.status
    headers = {name: value for name, value in problem.headers.items() if name != "WWW-Authenticate"}
    if problem.decision is not None and status == HTTPStatus.FORBIDDEN:
        status = HTTPStatus.BAD_REQUEST
        if problem.reason == UNVERIFIABLE:
            status = HTTPStatus.SERVICE_UNAVAILABLE
            # The subject token's keys could not be had: the wait of any route's answer then.
            headers["Retry-After"] = str(Reason.TOKEN_KEYS_UNAVAILABLE.retry_after)
    document = {
        **problem.document(),
        "status": status,
        "title": HTTPStatus(status).phrase,
        "error": oauth_error(problem.reason, status),
        "error_description": problem.detail(),
    }
    response = document_response(document, status, "application/json", headers)
    response.headers["Pragma"] = "no-cache"
    return response
