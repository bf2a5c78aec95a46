"""The request span: opentelemetry-instrumentation-flask on the app, when tracing is on.

The HTTP room's part of `service.observability.tracing`: the request span continues a caller's W3C
`traceparent`, and carries the decision that governed the request and the problem's
reason code (kept in `flask.g` by `service.app`), never a path or other request text.
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, g
from opentelemetry import trace

from service.observability import tracing


def instrument(app: Flask) -> None:
    """Instrument the app with the service's tracer provider; nothing while tracing is off."""
    provider = tracing.provider()
    if provider is None:
        return
    from opentelemetry.instrumentation.flask import FlaskInstrumentor

    excluded = None if "OTEL_PYTHON_FLASK_EXCLUDED_URLS" in os.environ else tracing.EXCLUDED_URLS
    FlaskInstrumentor().instrument_app(  # type: ignore[no-untyped-call]
        app,
        tracer_provider=provider,
        excluded_urls=excluded,
        response_hook=_note_request,
        enable_commenter=False,
    )


def _note_request(span: trace.Span, status: str, headers: Any) -> None:
    """The request span's own attributes, as the answer starts."""
    if span is None or not span.is_recording():
        return
    attributes = {
        "sessionstate.request_id": g.get("request_id"),
        "sessionstate.decision_id": g.get("decision_id"),
        "sessionstate.allow": g.get("decision_allow"),
        "sessionstate.reason": g.get("problem_reason"),
    }
    span.set_attributes({key: value for key, value in attributes.items() if value is not None})
