"""`create_app`: the Flask application for one `ServiceContext`. Nothing happens at import."""

from __future__ import annotations

import logging
import time

from flask import Flask, Response, g, request
from flask_swagger_ui import get_swaggerui_blueprint
from werkzeug.exceptions import HTTPException

from service.api.reasons import Reason
from service.api.v1 import DOCS, EXCHANGE, JWKS, OPENAPI, REQUEST_ID, WORKER, method_label
from service.context import ServiceContext
from service.decisions.journal import JournalClosed
from service.http import (
    approvals,
    decision_proofs,
    decisions,
    fork,
    ops,
    sessions,
    state,
    token,
    ui,
    versions,
)
from service.http.body import MAX_BODY_BYTES
from service.http.common import CONTEXT_KEY, context, drop_decision, journal_decision
from service.http.problems import REFUSALS, Problem, problem_of
from service.http.request_ids import request_id
from store.backends.contract import StoreOffline

log = logging.getLogger("sessionstate.http")


def create_app(ctx: ServiceContext) -> Flask:
    app = Flask("sessionstate")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions[CONTEXT_KEY] = ctx
    blueprints = (
        state.bp,
        versions.bp,
        fork.bp,
        sessions.bp,
        token.bp,
        approvals.bp,
        decision_proofs.bp,
        decisions.bp,
    )
    for blueprint in (*blueprints, ops.bp, ui.bp):
        app.register_blueprint(blueprint)
    app.register_blueprint(
        get_swaggerui_blueprint(DOCS, OPENAPI, config={"app_name": "sessionstate"})
    )
    app.before_request(_begin)
    app.after_request(_finish)
    # Every answer that is an error is a problem document (`service.http.problems`).
    for refusal in (Problem, HTTPException, *REFUSALS):
        app.register_error_handler(refusal, _refused)
    app.register_error_handler(Exception, _unexpected)
    return app


def _begin() -> None:
    g.request_id = request_id(request.headers.get(REQUEST_ID, ""))
    g.started = time.perf_counter()
    # Over 1 MiB is refused before anything reads, authenticates or parses the body.
    if (request.content_length or 0) > MAX_BODY_BYTES:
        raise Problem(Reason.BODY_TOO_LARGE)


def _finish(response: Response) -> Response:
    try:
        journal_decision(response.status_code)
    except (JournalClosed, StoreOffline) as error:
        # A decision that cannot be kept is not answered: compliance needs every one.
        response = _problem(problem_of(error))
    route = request.url_rule.rule if request.url_rule is not None else "unmatched"
    response.headers[REQUEST_ID] = g.get("request_id", "")
    worker = context().worker_label
    if worker is not None:  # which of `serve --workers N`'s processes answered
        response.headers[WORKER] = worker
    if not _is_public_document(request.path):
        # State, records, approvals and decisions (problems carry decisions too) must not
        # sit in a browser's or a proxy's cache; one rule for every answer keeps it so.
        response.headers["Cache-Control"] = "no-store"
    method = method_label(request.method)  # never verbatim: a method may be 7 KB of anything
    context().metrics.requests.labels(route, method, str(response.status_code)).inc()
    log.info(
        "request",
        extra={
            "request_id": g.get("request_id"),
            "method": method,
            "route": route,
            "status": response.status_code,
            "duration_ms": round(
                (time.perf_counter() - g.get("started", time.perf_counter())) * 1000, 3
            ),
            "actor": g.get("actor_sub"),
            "decision_id": g.get("decision_id"),
            "allow": g.get("decision_allow"),
            "reason": g.get("problem_reason"),
        },
    )
    return response


def _is_public_document(path: str) -> bool:
    """The OpenAPI document, the Swagger UI's static assets and the service's public keys:
    the same for everyone."""
    return path in (OPENAPI, DOCS, JWKS) or path.startswith(DOCS + "/")


def _problem(problem: Problem) -> Response:
    g.problem_reason = problem.reason
    if request.path == EXCHANGE:  # OAuth errors there (RFC 6749 section 5.2)
        return token.token_error(problem)
    return problem.response()


def _refused(error: Exception) -> Response:
    if isinstance(error, JournalClosed | StoreOffline):
        drop_decision()  # nothing was done, and the log cannot take it now
    return _problem(problem_of(error))


def _unexpected(error: Exception) -> Response:
    # The type only: a message or traceback could quote input or stored bytes.
    log.error(
        "unexpected_error",
        extra={"request_id": g.get("request_id"), "error_type": type(error).__name__},
    )
    return _problem(Problem(Reason.INTERNAL_ERROR))
