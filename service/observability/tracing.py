"""OpenTelemetry tracing: off unless the standard `OTEL_*` variables ask for it.

Tracing is on when `OTEL_TRACES_EXPORTER` names an exporter (`otlp`, `console`; a
comma-separated list) or, with it unset, when `OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set; `OTEL_SDK_DISABLED=true` and
`OTEL_TRACES_EXPORTER=none` keep it off. Off, nothing here builds a span: no
tracer provider exists, the Flask app is not instrumented, and each hook below
is one test of a module global. On (`start`), the SDK reads the rest of its
variables itself (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
`OTEL_TRACES_SAMPLER`/`_ARG`, `OTEL_BSP_*`, `OTEL_EXPORTER_OTLP_*` headers,
timeout, compression and certificates); OTLP goes over HTTP with protobuf only.

The spans of one request (docs/operators.md, "Tracing"):

- the request (`opentelemetry-instrumentation-flask`, set up by
  `service.http.request_tracing`; W3C `traceparent` and `tracestate` of the
  caller are its parent), with the decision id on it;
- `sessionstate.policy.decision`, around the query to OPA, whose `traceparent`
  it is (so OPA's own spans join the trace: `opa_tracing`); its trace id is the
  decision's `trace_id`, kept in the decision entry;
- `sessionstate.decision.commit`, the request's wait for the journal to commit
  its entry; the journal commits a batch of many requests' entries (led by one
  of those requests) in one `sessionstate.journal.batch` span of its own trace,
  linked to each entry's commit span.

No span carries raw text: every span passes a scrubbing exporter (`_scrubbed`) on its way out, which
keeps only the attributes named in `_KEPT` (methods, route templates, status
codes, ids, actions, allow and reason codes), drops events (exception messages)
and status descriptions, and names a request span by method and route template,
never by its path.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, MutableMapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from service.config.configuration_error import ConfigurationError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from service.policy.trace import DecisionTrace

SERVICE_NAME = "sessionstate"
EXPORTERS = ("otlp", "console")
PROTOCOL = "http/protobuf"
# Probes and scrapes would be most of the traces: not traced unless the operator sets
# OTEL_PYTHON_FLASK_EXCLUDED_URLS (the instrumentation's own variable) to something else.
EXCLUDED_URLS = r"^https?://[^/]+/(healthz|readyz|metrics)(\?|$)"
DEFAULT_OTLP_ENDPOINT = "http://localhost:4318"

# What a span may carry out: HTTP method, route template, status, and the service's
# own ids and codes. Everything else the instrumentation records (the path with its
# query, host, client address, user agent, captured headers) stays in the process.
_KEPT = frozenset(
    {
        "http.request.method",
        "http.method",
        "http.route",
        "http.response.status_code",
        "http.status_code",
        "url.scheme",
        "http.scheme",
        "network.protocol.version",
        "http.flavor",
        "error.type",
    }
)
_OWN_PREFIX = "sessionstate."

_W3C = TraceContextTextMapPropagator()
_tracer: Tracer | None = None
_provider: TracerProvider | None = None
_OFF: AbstractContextManager[None] = nullcontext()  # what every span hook is while off


@dataclass(frozen=True)
class OpaTracing:
    """Where OPA's `distributed_tracing` sends its spans: OTLP over HTTP to host:port."""

    address: str
    encryption: str  # "off" (http://) or "tls" (https://)
    service_name: str
    batch_timeout_ms: int | None = None  # OTEL_BSP_SCHEDULE_DELAY, when set

    def config(self) -> dict[str, Any]:
        """OPA's `distributed_tracing` section. OPA samples what the service samples: it
        starts no trace of its own (0 %), and follows the sampled flag of `traceparent`."""
        config: dict[str, Any] = {
            "type": "http",
            "address": self.address,
            "encryption": self.encryption,
            "service_name": self.service_name,
            "sample_percentage": 0,
        }
        if self.batch_timeout_ms is not None:
            config["batch_span_processor_options"] = {"batch_timeout_ms": self.batch_timeout_ms}
        return config


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def exporters() -> list[str]:
    """The exporters the environment asks for; empty when tracing is off."""
    if _env("OTEL_SDK_DISABLED").lower() == "true":
        return []
    named = [part.strip().lower() for part in _env("OTEL_TRACES_EXPORTER").split(",")]
    named = [part for part in named if part]
    if not named:
        endpoint = _env("OTEL_EXPORTER_OTLP_ENDPOINT") or _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        return ["otlp"] if endpoint else []
    if named == ["none"]:
        return []
    unknown = [part for part in named if part not in EXPORTERS]
    if unknown:
        raise ConfigurationError(
            "OTEL_TRACES_EXPORTER may name otlp, console or none (one, or a comma-separated list)"
        )
    return named


def _otlp_endpoint() -> str:
    """The OTLP/HTTP traces URL the exporter posts to (the SDK's own reading of the variables)."""
    traces = _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if traces:
        return traces
    base = _env("OTEL_EXPORTER_OTLP_ENDPOINT") or DEFAULT_OTLP_ENDPOINT
    return base.rstrip("/") + "/v1/traces"


def check() -> list[str]:
    """The exporters asked for, after checking the variables the service itself reads."""
    named = exporters()
    if "otlp" in named:
        protocol = (
            _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or _env("OTEL_EXPORTER_OTLP_PROTOCOL")
        ) or PROTOCOL
        if protocol != PROTOCOL:
            raise ConfigurationError(
                "OTEL_EXPORTER_OTLP_PROTOCOL (or _TRACES_PROTOCOL) must be http/protobuf: "
                "the service exports OTLP over HTTP (a collector's port 4318)"
            )
        parts = urlsplit(_otlp_endpoint())
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ConfigurationError(
                "OTEL_EXPORTER_OTLP_ENDPOINT (or _TRACES_ENDPOINT) must be an http(s):// URL"
            )
    return named


def opa_tracing() -> OpaTracing | None:
    """What the OPA sidecar's `distributed_tracing` gets: the OTLP collector the service
    exports to, when it exports OTLP; None otherwise."""
    if "otlp" not in check():
        return None
    parts = urlsplit(_otlp_endpoint())
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    return OpaTracing(
        address=f"{parts.hostname}:{port}",
        encryption="tls" if secure else "off",
        service_name=f"{_service_name()}-opa",
        batch_timeout_ms=_schedule_delay_ms(),
    )


def _schedule_delay_ms() -> int | None:
    """OTEL_BSP_SCHEDULE_DELAY (how long spans wait to be exported), for OPA too; None when
    unset or not a positive integer (the SDK, too, then keeps its default of 5000 ms)."""
    value = _env("OTEL_BSP_SCHEDULE_DELAY")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _service_name() -> str:
    return _env("OTEL_SERVICE_NAME") or SERVICE_NAME


def start() -> bool:
    """Set up the tracer provider and exporters the environment asks for; False when it asks
    for none (then nothing is set up and every hook stays a no-op). Once per process."""
    global _tracer, _provider
    named = check()
    if not named or _provider is not None:
        return _provider is not None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
    )

    # Attributes given here win over the environment's: name the service only when
    # neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES does.
    named_by_env = _env("OTEL_SERVICE_NAME") or "service.name=" in _env("OTEL_RESOURCE_ATTRIBUTES")
    resource = Resource.create({} if named_by_env else {"service.name": SERVICE_NAME})
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
    for name in named:
        exporter: SpanExporter = OTLPSpanExporter() if name == "otlp" else ConsoleSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(_scrubbed(exporter)))
    trace.set_tracer_provider(provider)
    _provider = provider
    _tracer = provider.get_tracer("sessionstate")
    return True


def shutdown() -> None:
    """Export what is pending and stop (the service stopping)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def provider() -> TracerProvider | None:
    """The tracer provider while tracing is on (`service.http.request_tracing` instruments Flask)."""
    return _provider


def decision_span(action: str) -> AbstractContextManager[trace.Span | None]:
    """The span of one policy decision (the query to OPA sends its `traceparent`)."""
    if _tracer is None:
        return _OFF
    return _tracer.start_as_current_span(
        "sessionstate.policy.decision",
        kind=SpanKind.CLIENT,
        attributes={"sessionstate.action": action},
    )


def trace_id(span: trace.Span | None) -> str | None:
    """The trace id a decision records: its span's, when that span is sampled (exported)."""
    if span is None:
        return None
    context = span.get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return None
    return trace.format_trace_id(context.trace_id)


def note_decision(span: trace.Span | None, decision: DecisionTrace) -> None:
    if span is None or not span.is_recording():
        return
    span.set_attributes(
        {
            "sessionstate.decision_id": decision.decision_id,
            "sessionstate.allow": decision.allow,
            "sessionstate.reasons": list(decision.reasons),
            "sessionstate.policy_revision": decision.policy_revision,
        }
    )
    if decision.engine_unavailable:
        span.set_status(Status(StatusCode.ERROR))


def inject(headers: MutableMapping[str, str]) -> None:
    """W3C `traceparent` (and `tracestate`) of the current span into an outgoing request."""
    if _tracer is not None:
        _W3C.inject(headers)


def commit_span(decision_id: str) -> AbstractContextManager[trace.Span | None]:
    """A request's wait for the journal to commit its entry: a child of the request's span,
    and what the batch that commits it links to. None outside a traced request."""
    if _tracer is None or not trace.get_current_span().get_span_context().is_valid:
        return _OFF
    return _tracer.start_as_current_span(
        "sessionstate.decision.commit",
        attributes={"sessionstate.decision_id": decision_id},
    )


def link_of(span: trace.Span | None) -> SpanContext | None:
    return None if span is None else span.get_span_context()


def note_commit(span: trace.Span | None, entry: dict[str, Any] | None, failed: bool) -> None:
    if span is None or not span.is_recording():
        return
    if failed or entry is None:
        span.set_status(Status(StatusCode.ERROR))
        return
    outcome = entry.get("outcome") or {}
    span.set_attributes(
        {
            "sessionstate.outcome.status": int(outcome.get("status", 0)),
            "sessionstate.outcome.applied": bool(outcome.get("applied")),
            "sessionstate.seq": int(entry.get("seq", 0)),
        }
    )


def batch_span(
    size: int, links: Iterable[tuple[SpanContext | None, str]]
) -> AbstractContextManager[trace.Span | None]:
    """One group commit of the journal (by the request leading it): a trace of its own, linked
    to the commit span of each entry it holds (`links` is read only when tracing is on)."""
    if _tracer is None:
        return _OFF
    linked = [
        Link(context, {"sessionstate.decision_id": decision_id})
        for context, decision_id in links
        if context is not None
    ]
    return _tracer.start_as_current_span(
        "sessionstate.journal.batch",
        context=trace.set_span_in_context(trace.INVALID_SPAN),  # a root: not any request's
        links=linked,
        attributes={"sessionstate.batch.entries": size},
    )


def note_batch(span: trace.Span | None, errors: Iterable[BaseException | None]) -> None:
    """The batch's outcome: how many of its entries failed (errors read only when traced)."""
    if span is None or not span.is_recording():
        return
    failed = sum(error is not None for error in errors)
    span.set_attribute("sessionstate.batch.failed", failed)
    if failed:
        span.set_status(Status(StatusCode.ERROR))


def _scrubbed(exporter: SpanExporter) -> SpanExporter:
    from opentelemetry.sdk.trace.export import SpanExporter

    class Scrubbed(SpanExporter):
        """Spans leave with the kept attributes only (see the module's docstring)."""

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return exporter.export([_scrub(span) for span in spans])

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return exporter.force_flush(timeout_millis)

    return Scrubbed()


def _scrub(span: ReadableSpan) -> ReadableSpan:
    from opentelemetry.sdk.trace import ReadableSpan

    attributes = {
        key: value
        for key, value in (span.attributes or {}).items()
        if key in _KEPT or key.startswith(_OWN_PREFIX)
    }
    name = span.name
    if span.kind is SpanKind.SERVER:  # the instrumentation names an unmatched path by itself
        method = attributes.get("http.request.method") or attributes.get("http.method") or "HTTP"
        route = attributes.get("http.route")
        name = f"{method} {route}" if route else str(method)
    return ReadableSpan(
        name=name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes,
        events=(),
        links=span.links,
        kind=span.kind,
        status=Status(span.status.status_code),
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )
