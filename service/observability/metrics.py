"""Prometheus metrics of one app: its own registry, labels that never hold input.

The workers of `serve --workers N` are one service to Prometheus: their parent names a
directory in PROMETHEUS_MULTIPROC_DIR (`service.runtime.workers`), prometheus-client's
multiprocess mode keeps every worker's counters, histograms and gauges in files there, and
whichever worker answers a scrape renders them all, added up (`MultiProcessCollector`). A
worker that died keeps its counts in the sum, so no counter goes backwards when one is
started again. What the store's health reads from a worker's own store is copied into those
files (`sync`) at each of its heartbeats and before it answers a scrape. A single process
renders its own registry, as it always did.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from service.policy.health import PolicyHealth
from service.policy.source import RELOAD_OUTCOMES
from store.backends.contract import Lanes, recovers

MULTIPROC_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


class ServiceMetrics:
    """Requests by route and status, decisions by action and outcome, corrupt reads, lost log,
    429s, the decision scrub, the log's checkpoints and witnesses, the store's health."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # A worker of several: what every worker counted, from PROMETHEUS_MULTIPROC_DIR.
        shared = os.environ.get(MULTIPROC_DIR_VARIABLE)
        self.multiprocess = bool(shared)
        if shared:
            self._exposed = CollectorRegistry()
            MultiProcessCollector(self._exposed, shared)  # type: ignore[no-untyped-call]
        else:
            self._exposed = self.registry
        self._synced: list[Callable[[], None]] = []
        self._sync_lock = threading.Lock()
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
            multiprocess_mode="max",  # of every worker's scrub, the latest success
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
        """Export the store's health, read from it at each scrape (a worker of several: at
        each `sync`, into the files every worker's scrape adds up)."""
        if not self.multiprocess:
            self._exposed.register(_StoreHealth(lanes))
            return
        self._synced.append(_SharedStoreHealth(lanes, self.registry).sync)

    def watch_policy(self, health: Callable[[], PolicyHealth]) -> None:
        """Export whether the served policy source compiled, and the reloads by outcome."""
        self._exposed.register(_PolicySourceHealth(health))

    def sync(self) -> None:
        """Copy what is read from this worker's own objects into the shared files."""
        with self._sync_lock:
            for synced in self._synced:
                synced()

    def render(self) -> bytes:
        self.sync()
        return generate_latest(self._exposed)


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


class _SharedStoreHealth:
    """`_StoreHealth` for a worker of several: its store's health in the shared files. The
    gauge is the lowest of the live workers' (0 while any worker's store is latched read-only);
    the counters add up every worker's, the dead ones' too."""

    def __init__(self, lanes: Lanes, registry: CollectorRegistry) -> None:
        self._lanes = lanes
        self._writable = Gauge(
            "sessionstate_store_writable",
            "1 while the store accepts writes; 0 after a failed write until it is reopened.",
            registry=registry,
            multiprocess_mode="livemin",
        )
        self._failures = Counter(
            "sessionstate_store_write_failures",
            "Writes that failed (each latched the store read-only until a reopen).",
            registry=registry,
        )
        self._reopens = Counter(
            "sessionstate_store_reopens",
            "Reopens of the store after a failed write.",
            registry=registry,
        )
        self._counted = (0, 0)

    def sync(self) -> None:
        lanes = self._lanes
        failures, reopens = (lanes.write_failures, lanes.reopens) if recovers(lanes) else (0, 0)
        self._writable.set(1.0 if lanes.writable else 0.0)
        counted_failures, counted_reopens = self._counted
        self._failures.inc(max(0, failures - counted_failures))
        self._reopens.inc(max(0, reopens - counted_reopens))
        self._counted = (max(failures, counted_failures), max(reopens, counted_reopens))


class _PolicySourceHealth(Collector):
    """The local sidecar's policy source: was it good at the last reload (nothing with an
    external OPA). A worker of several reads its parent's (`service.policy.health`)."""

    def __init__(self, health: Callable[[], PolicyHealth]) -> None:
        self._health = health

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        health = self._health()
        if health.source_valid is None or health.reloads is None:
            return
        yield GaugeMetricFamily(
            "sessionstate_policy_source_valid",
            "1 while the policy directory compiled, passed the admission checks and its tests "
            "at the last reload (or start); 0 after a reload refused it, while the last good "
            "policies still decide.",
            value=1.0 if health.source_valid else 0.0,
        )
        reloads = CounterMetricFamily(
            "sessionstate_policy_reloads",
            "Policy reloads by outcome (loaded, unchanged, invalid).",
            labels=["outcome"],
        )
        for outcome in RELOAD_OUTCOMES:
            reloads.add_metric([outcome], health.reloads.get(outcome, 0))
        yield reloads
        if health.bundle is not None:
            # While the latest offer stands refused, sessionstate_policy_source_valid is 0.
            yield CounterMetricFamily(
                "sessionstate_policy_bundle_rejected",
                "Signed policy bundles OPA refused (at start or at a reload).",
                value=health.bundle.rejected,
            )
            yield CounterMetricFamily(
                "sessionstate_policy_bundle_rollback",
                "Signed policy bundles refused at a reload as older than the highest serial "
                "activated on the deployment (or without one); never offered to OPA.",
                value=health.bundle.rollback,
            )
