"""Tests of `service.observability`: OpenTelemetry tracing across the service and OPA."""
