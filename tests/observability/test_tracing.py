"""OpenTelemetry end to end: the served process exports to a local OTLP/HTTP receiver.

The receiver is a tiny HTTP server that takes POST /v1/traces (protobuf, decoded with
opentelemetry-proto), as a collector would. One request's spans (the request, the policy
decision, the commit wait) and OPA's own span share the trace id its decision entry and
its answer record; the journal's batch span links to the request's commit span; a
client's `traceparent` is the trace used. Without OTEL configuration nothing is exported
and no entry has a trace id.
"""

from __future__ import annotations

import gzip
import json
import os
import secrets
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from service.auth.tokens import mint_token
from service.observability import tracing
from service.policy.trace import DecisionEngine, DecisionTrace
from service.policy.transport import KeepAliveTransport, OpaClientTransport
from tests.support.hash_recipe import hashes_as_the_recipe_says
from tests.support.live import JWT_SECRET
from tests.support.served import Served, start

STATE = "/v1/tenants/tenant-a/workspaces/ws-1/sessions/chat-1/state"


@dataclass
class Span:
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    links: list[tuple[str, str, dict[str, Any]]]


@dataclass
class Receiver:
    url: str
    spans: list[Span] = field(default_factory=list)
    posts: int = 0
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def of_trace(self, trace_id: str) -> list[Span]:
        return [span for span in self.spans if span.trace_id == trace_id]

    def wait_for_service(self, service: str, count: int) -> None:
        """Until `count` spans of `service` arrived (OPA exports on its schedule only)."""
        with self.arrived:
            self.arrived.wait_for(
                lambda: sum(span.service == service for span in self.spans) >= count, 60
            )


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver(url="")
    guard = found.arrived

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            request = ExportTraceServiceRequest.FromString(body)
            with guard:
                found.posts += 1
                for resource_spans in request.resource_spans:
                    service = _attributes(resource_spans.resource.attributes).get("service.name")
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            found.spans.append(
                                Span(
                                    service=str(service),
                                    trace_id=span.trace_id.hex(),
                                    span_id=span.span_id.hex(),
                                    parent_id=span.parent_span_id.hex(),
                                    name=span.name,
                                    kind=span.kind,
                                    attributes=_attributes(span.attributes),
                                    links=[
                                        (
                                            link.trace_id.hex(),
                                            link.span_id.hex(),
                                            _attributes(link.attributes),
                                        )
                                        for link in span.links
                                    ],
                                )
                            )
                found.arrived.notify_all()
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    found.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield found
    server.shutdown()
    server.server_close()


def token(role: str) -> str:
    session = role == "model-service"
    return mint_token(
        JWT_SECRET.encode(),
        sub="tracer",
        roles=[role],
        tenant="tenant-a",
        workspace="ws-1" if session else None,
        session="chat-1" if session else None,
        ttl_seconds=600,
    )


def read_state(served: Served, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """GET state of a session with nothing stored: 404 with the decision that allowed the read."""
    answer = requests.get(
        served.url + STATE,
        headers={"Authorization": "Bearer " + token("model-service")} | (headers or {}),
        timeout=10,
    )
    assert answer.status_code == 404
    decision: dict[str, Any] = answer.json()["decision"]
    return decision


def entry_of(served: Served, decision_id: str) -> dict[str, Any]:
    answer = requests.get(
        f"{served.url}/v1/decisions/{decision_id}",
        headers={"Authorization": "Bearer " + token("auditor")},
        timeout=10,
    )
    assert answer.status_code == 200
    assert answer.json()["hash_ok"] is True
    entry: dict[str, Any] = answer.json()["entry"]
    # with a trace id or without, as stored: the recipe of docs/compliance.md holds
    assert hashes_as_the_recipe_says(entry)
    return entry


def stop(served: Served) -> None:
    """SIGTERM: the service stops gracefully and exports what it has not yet (so does OPA)."""
    os.killpg(served.process.pid, signal.SIGTERM)
    assert served.process.wait(timeout=30) == 0


def test_one_requests_spans_share_the_trace_id_its_decision_entry_records(
    opa_bin: str, tmp_path: Path, receiver: Receiver
) -> None:
    served = start(
        opa_bin,
        tmp_path / "var",
        tmp_path,
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_SERVICE_NAME": "sessionstate-test",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        },
    )
    try:
        config = json.loads((served.data_dir / "opa" / "opa-config.json").read_text())
        assert config["distributed_tracing"] == {
            "type": "http",
            "address": receiver.url.removeprefix("http://"),
            "encryption": "off",
            "service_name": "sessionstate-test-opa",
            "sample_percentage": 0,
            "batch_span_processor_options": {"batch_timeout_ms": 100},
        }
        # A request of its own trace, and one in a trace the client started.
        own = read_state(served)
        client_trace, client_span = secrets.token_hex(16), secrets.token_hex(8)
        joined = read_state(served, {"traceparent": f"00-{client_trace}-{client_span}-01"})
        own_entry = entry_of(served, own["decision_id"])
        joined_entry = entry_of(served, joined["decision_id"])
        # OPA does not export at its stop: wait for its spans of the four queries first.
        receiver.wait_for_service("sessionstate-test-opa", 4)
    finally:
        stop(served)

    assert joined["trace_id"] == client_trace
    assert joined_entry["decision"]["trace_id"] == client_trace
    assert own["trace_id"] == own_entry["decision"]["trace_id"] != client_trace

    for decision, entry in ((own, own_entry), (joined, joined_entry)):
        spans = receiver.of_trace(entry["decision"]["trace_id"])
        by_name = {span.name: span for span in spans if span.service == "sessionstate-test"}
        request = by_name[
            "GET /v1/tenants/<tenant_id>/workspaces/<workspace_id>/sessions/<session_id>/state"
        ]
        policy = by_name["sessionstate.policy.decision"]
        commit = by_name["sessionstate.decision.commit"]
        assert request.kind == 2  # SPAN_KIND_SERVER
        assert policy.parent_id == commit.parent_id == request.span_id
        for span in (request, policy, commit):
            assert span.attributes["sessionstate.decision_id"] == decision["decision_id"]
        assert (
            request.attributes[
                "http.response.status_code"
                if "http.response.status_code" in request.attributes
                else "http.status_code"
            ]
            == 404
        )
        assert request.attributes["sessionstate.reason"] == "session_state_not_found"
        assert policy.attributes["sessionstate.action"] == "read"
        assert policy.attributes["sessionstate.allow"] is True
        assert commit.attributes["sessionstate.outcome.status"] == 404
        assert commit.attributes["sessionstate.seq"] == entry["seq"]
        # OPA's own span of the query joins the trace, under the policy decision's span.
        opa = [span for span in spans if span.service == "sessionstate-test-opa"]
        assert opa and any(span.parent_id == policy.span_id for span in opa)
        # The journal's batch: a trace of its own, linked to the request's commit span.
        batches = [
            span
            for span in receiver.spans
            if span.name == "sessionstate.journal.batch"
            and any(link[:2] == (commit.trace_id, commit.span_id) for link in span.links)
        ]
        assert len(batches) == 1
        assert batches[0].trace_id != commit.trace_id
        assert batches[0].parent_id == ""
        (link,) = [link for link in batches[0].links if link[1] == commit.span_id]
        assert link[2] == {"sessionstate.decision_id": decision["decision_id"]}

    assert request_spans_carry_no_raw_text(receiver.spans)


def request_spans_carry_no_raw_text(spans: list[Span]) -> bool:
    """Nothing of a path's ids, the host or the client: route templates, codes and ids."""
    for span in spans:
        if span.service != "sessionstate-test":
            continue
        for key, value in span.attributes.items():
            assert key.startswith("sessionstate.") or key in tracing._KEPT, key
            assert "tenant-a" not in str(value) and "127.0.0.1" not in str(value)
        assert "chat-1" not in span.name
    return True


def test_without_otel_configuration_nothing_is_exported_and_entries_have_no_trace_id(
    opa_bin: str, tmp_path: Path, receiver: Receiver
) -> None:
    # An endpoint is named, but the exporter is `none`: tracing is off.
    served = start(
        opa_bin,
        tmp_path / "var",
        tmp_path,
        {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_TRACES_EXPORTER": "none"},
    )
    try:
        config = json.loads((served.data_dir / "opa" / "opa-config.json").read_text())
        assert "distributed_tracing" not in config
        traceparent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
        decision = read_state(served, {"traceparent": traceparent})
        entry = entry_of(served, decision["decision_id"])
    finally:
        stop(served)
    assert "trace_id" not in decision
    assert "trace_id" not in entry["decision"]
    assert receiver.posts == 0


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, []),
        ({"OTEL_SERVICE_NAME": "x"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, ["otlp", "console"]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, []),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, []),
    ],
)
def test_tracing_is_on_only_when_the_environment_asks(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: list[str]
) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert tracing.check() == expected


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_TRACES_EXPORTER": "zipkin"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4318"},
    ],
)
def test_settings_the_service_cannot_follow_are_configuration_errors(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    from service.config.configuration_error import ConfigurationError

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as raised:
        tracing.check()
    assert "c:43" not in str(raised.value)  # names the variable, never its value


def test_opa_gets_the_collector_of_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://collector.example:4318/v1/traces"
    )
    opa = tracing.opa_tracing()
    assert opa is not None
    assert (opa.address, opa.encryption) == ("collector.example:4318", "tls")


def test_a_decision_without_a_trace_id_serializes_as_before() -> None:
    trace = DecisionTrace(
        decision_id="d-1",
        action="read",
        policy="sessionstate/read",
        allow=True,
        reasons=[],
        policy_revision="r",
        input_digest="sha256:x",
        evaluated_at="2026-01-01T00:00:00.000Z",
        engine=DecisionEngine(version="1"),
        latency_ms=1.0,
    )
    assert "trace_id" not in trace.model_dump(mode="json")
    assert "trace_id" not in json.loads(trace.model_dump_json())
    traced = trace.model_copy(update={"trace_id": "ab" * 16})
    assert traced.model_dump(mode="json")["trace_id"] == "ab" * 16
    with pytest.raises(ValueError):
        DecisionTrace.model_validate({**trace.model_dump(), "trace_id": "not a trace id"})


def test_spans_leave_with_kept_attributes_only() -> None:
    context = SpanContext(int("ab" * 16, 16), int("cd" * 8, 16), False, TraceFlags(1))
    raw = ReadableSpan(
        name="GET /v1/tenants/secret-tenant/anything",
        context=context,
        attributes={
            "http.method": "GET",
            "http.target": "/v1/tenants/secret-tenant/anything?q=raw",
            "http.user_agent": "raw",
            "net.peer.ip": "10.1.2.3",
            "http.request.header.authorization": ("Bearer x",),
            "http.status_code": 404,
            "sessionstate.decision_id": "d-1",
        },
        kind=SpanKind.SERVER,
        status=Status(StatusCode.ERROR, "an exception's message"),
    )
    scrubbed = tracing._scrub(raw)
    assert scrubbed.name == "GET"
    assert dict(scrubbed.attributes or {}) == {
        "http.method": "GET",
        "http.status_code": 404,
        "sessionstate.decision_id": "d-1",
    }
    assert scrubbed.status.status_code is StatusCode.ERROR
    assert scrubbed.status.description is None
    assert scrubbed.events == ()


@pytest.mark.parametrize("transport", [KeepAliveTransport, OpaClientTransport])
def test_both_transports_send_the_decision_spans_traceparent(
    monkeypatch: pytest.MonkeyPatch, transport: type[KeepAliveTransport | OpaClientTransport]
) -> None:
    seen: list[str | None] = []

    class Opa(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            seen.append(self.headers.get("traceparent"))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Opa)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = transport(f"http://127.0.0.1:{server.server_address[1]}", None, 5.0)
    try:
        assert client.query("read", {}, b"{}") == {}  # tracing off: no traceparent
        monkeypatch.setattr(tracing, "_tracer", TracerProvider().get_tracer("test"))
        with tracing.decision_span("read") as span:
            assert client.query("read", {}, b"{}") == {}
            assert span is not None
            context = span.get_span_context()
    finally:
        client.close()
        server.shutdown()
        server.server_close()
    assert seen == [
        None,
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}",
    ]
