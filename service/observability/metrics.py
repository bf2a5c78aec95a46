"""Prometheus metrics of one app: its own registry, labels that never hold input."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from service.policy.signed_bundle import SignedBundleSource
from service.policy.source import RELOAD_OUTCOMES, PolicySnapshots
from store.backends.contract import Lanes, recovers


class ServiceMetrics:
    """Requests by route and status, decisions by action and outcome, corrupt reads, lost log,
    429s, the decision scrub, the log's checkpoints and witnesses, the store's health."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "sessionstate_http_requests",
            "HTTP requests by route template, method (OTHER for any the service does not "
            "serve) and status.",
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
            "Policy decisions by action and outcome (allow, deny, unavailable, refused, undefined).",
            ["action", "outcome"],
            registry=self.registry,
        )
        self.shadow_decisions = Counter(
            "sessionstate_shadow_decisions",
            "Shadow policy decisions beside the live ones, by action and outcome (agree, "
            "allow_gained, allow_lost, reasons_changed, unavailable, timeout).",
            ["action", "outcome"],
            registry=self.registry,
        )
        self.corrupt_reads = Counter(
            "sessionstate_corrupt_reads",
            "Stored session records that read back as corrupt, by redacted label.",
            ["label"],
            registry=self.registry,
        )
        self.store_log_bytes_dropped = Counter(
            "sessionstate_store_log_bytes_dropped",
            "Bytes LevelDB dropped from the end of its write-ahead log when the store opened.",
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "sessionstate_rate_limited",
            "Requests refused with 429 rate_limited before any policy call, by budget.",
            ["budget"],
            registry=self.registry,
        )
        self.refused_before_app = Counter(
            "sessionstate_http_refused_before_app",
            "Requests answered by the HTTP front before the app ran, by reason "
            "(body_too_large, request_timeout, request_target_too_long, "
            "request_headers_too_large, malformed_request, conflicting_framing, "
            "unknown_method).",
            ["reason"],
            registry=self.registry,
        )
        self.decision_scrub_failures = Counter(
            "sessionstate_decision_scrub_failures",
            "Background whole walks of a tenant's decision chain that found a problem, or "
            "could not read the store (the log event decision_scrub_failed says which).",
            registry=self.registry,
        )
        self.decision_scrub_last_success = Gauge(
            "sessionstate_decision_scrub_last_success_timestamp_seconds",
            "When a scrub round last ended with every chain it walked holding (0: not yet).",
            registry=self.registry,
        )

        self.log_checkpoint_failures = Counter(
            "sessionstate_log_checkpoint_failures",
            "Checkpoint notes the background job did not sign, by reason (chain_unverified: "
            "the chain does not verify; tree_unavailable: its Merkle tree does not hold).",
            ["reason"],
            registry=self.registry,
        )
        self.log_witness_cosignatures = Counter(
            "sessionstate_log_witness_cosignatures",
            "Checkpoint notes a witness cosigned (its cosignature verified and kept), by "
            "witness key name.",
            ["witness"],
            registry=self.registry,
        )
        self.log_witness_refusals = Counter(
            "sessionstate_log_witness_refusals",
            "Checkpoint notes a witness refused (422, 403 or another 4xx, a 409 naming a "
            "size above the note's, or a cosignature that does not verify), by witness key name.",
            ["witness"],
            registry=self.registry,
        )
        self.log_witness_unreachable = Counter(
            "sessionstate_log_witness_unreachable",
            "Submissions to a witness that got no answer (connection, timeout, 5xx), by "
            "witness key name.",
            ["witness"],
            registry=self.registry,
        )

        self.log_timestamps = Counter(
            "sessionstate_log_timestamps",
            "Checkpoint notes the time-stamping authority (SESSIONSTATE_TSA_URL) timestamped: "
            "the reply checked and kept.",
            registry=self.registry,
        )
        self.log_timestamp_failures = Counter(
            "sessionstate_log_timestamp_failures",
            "Timestamp queries that kept nothing, by reason (unreachable: no answer, a timeout "
            "or a 5xx; refused: a 4xx or a status other than granted; invalid: a reply that "
            "does not timestamp the note).",
            ["reason"],
            registry=self.registry,
        )

    def watch_store(self, lanes: Lanes) -> None:
        """Export the store's health, read from it at each scrape."""
        self.registry.register(_StoreHealth(lanes))

    def watch_policy_source(self, source: PolicySnapshots) -> None:
        """Export whether the served policy source compiled, and the reloads by outcome."""
        self.registry.register(_PolicySourceHealth(source))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StoreHealth(Collector):
    """Whether the store accepts writes, and how often it failed and was reopened."""

    def __init__(self, lanes: Lanes) -> None:
        self._lanes = lanes

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        lanes = self._lanes
        # A store without the recovery capability counts neither.
        failures, reopens = (lanes.write_failures, lanes.reopens) if recovers(lanes) else (0, 0)
        yield GaugeMetricFamily(
            "sessionstate_store_writable",
            "1 while the store accepts writes; 0 after a failed write until it is reopened.",
            value=1.0 if lanes.writable else 0.0,
        )
        yield CounterMetricFamily(
            "sessionstate_store_write_failures",
            "Writes that failed (each latched the store read-only until a reopen).",
            value=failures,
        )
        yield CounterMetricFamily(
            "sessionstate_store_reopens",
            "Reopens of the store after a failed write.",
            value=reopens,
        )


class _PolicySourceHealth(Collector):
    """The local sidecar's policy snapshot: was the directory good at the last reload."""

    def __init__(self, source: PolicySnapshots) -> None:
        self._source = source

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily(
            "sessionstate_policy_source_valid",
            "1 while the policy directory compiled, passed the admission checks and its tests "
            "at the last reload (or start); 0 after a reload refused it, while the last good "
            "policies still decide.",
            value=1.0 if self._source.valid else 0.0,
        )
        reloads = CounterMetricFamily(
            "sessionstate_policy_reloads",
            "Policy reloads by outcome (loaded, unchanged, invalid).",
            labels=["outcome"],
        )
        for outcome in RELOAD_OUTCOMES:
            reloads.add_metric([outcome], self._source.reloads(outcome))
        yield reloads
        if isinstance(self._source, SignedBundleSource):
            # While the latest offer stands refused, sessionstate_policy_source_valid is 0.
            yield CounterMetricFamily(
                "sessionstate_policy_bundle_rejected",
                "Signed policy bundles OPA refused (at start or at a reload).",
                value=self._source.rejections,
            )
            yield CounterMetricFamily(
                "sessionstate_policy_bundle_rollback",
                "Signed policy bundles refused at a reload as older than the highest serial "
                "activated on the deployment (or without one); never offered to OPA.",
                value=self._source.rollbacks,
            )
