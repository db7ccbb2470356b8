"""Prometheus metrics of the range filter proxy.

Purpose
    One :class:`ProxyMetrics` per proxy app, registered in its own
    ``CollectorRegistry`` (so several apps can live in one process, as tests
    do), served at ``/metrics``.

Invariants
    * ``range_filter_proxy_upstream_watches{resource}`` is the number of open
      upstream watch streams of that resource (0 or 1 per resource).
    * Counters only grow; gauges are incremented and decremented in
      ``try``/``finally`` pairs so they never drift.

Concurrency model
    prometheus_client metrics are thread-safe; all updates come from the event loop.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_PREFIX = "range_filter_proxy"


class ProxyMetrics:
    """All metrics of one proxy instance."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.upstream_watches = Gauge(
            f"{_PREFIX}_upstream_watches", "Open upstream watch streams per resource", ["resource"], registry=r
        )
        self.downstream_watches = Gauge(
            f"{_PREFIX}_downstream_watches", "Open downstream watches served from the cache", ["resource"], registry=r
        )
        self.events_received = Counter(
            f"{_PREFIX}_events_received", "Watch events received from the upstream", ["resource"], registry=r
        )
        self.events_delivered = Counter(
            f"{_PREFIX}_events_delivered", "Watch events queued to downstream watchers", ["resource"], registry=r
        )
        self.events_filtered = Counter(
            f"{_PREFIX}_events_filtered",
            "Watch events not sent to a downstream watcher because its filters rejected them",
            ["resource"],
            registry=r,
        )
        self.bytes_out = Counter(
            f"{_PREFIX}_bytes_out", "Bytes of list and watch responses served from the cache", ["resource"], registry=r
        )
        self.delivery_latency = Histogram(
            f"{_PREFIX}_event_delivery_latency_seconds",
            "Time from receiving an event upstream to handing it to a downstream connection",
            ["resource"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self.relists = Counter(f"{_PREFIX}_relists", "Full upstream (re)lists per resource", ["resource"], registry=r)
        self.slow_watchers_cut = Counter(
            f"{_PREFIX}_slow_watchers_cut", "Downstream watchers closed for not reading", ["resource"], registry=r
        )
        self.consistent_read_fallbacks = Counter(
            f"{_PREFIX}_consistent_read_fallbacks",
            "Consistent reads answered from an upstream list because the cache was not fresh in time",
            ["resource"],
            registry=r,
        )
        self.passthrough_requests = Counter(
            f"{_PREFIX}_passthrough_requests", "Requests passed through to the upstream", ["method"], registry=r
        )
