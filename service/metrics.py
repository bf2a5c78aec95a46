"""Prometheus metrics of one app: its own registry, labels that never hold input."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest


class ServiceMetrics:
    """Requests by route and status, decisions by action and outcome, corrupt reads, 429s."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "sessionstate_http_requests",
            "HTTP requests by route template, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.decision_latency = Histogram(
            "sessionstate_decision_latency_seconds",
            "Policy decision round trip to OPA.",
            ["action"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=self.registry,
        )
        self.decisions = Counter(
            "sessionstate_decisions",
            "Policy decisions by action and outcome (allow, deny, unavailable).",
            ["action", "outcome"],
            registry=self.registry,
        )
        self.corrupt_reads = Counter(
            "sessionstate_corrupt_reads",
            "Stored session records that read back as corrupt, by redacted label.",
            ["label"],
            registry=self.registry,
        )

        self.rate_limited = Counter(
            "sessionstate_rate_limited",
            "Requests refused with 429 rate_limited before any policy call, by budget.",
            ["budget"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
