"""Prometheus metrics of the range filter proxy.

Purpose
    One :class:`ProxyMetrics` per proxy app, registered in its own
    ``CollectorRegistry`` (so several apps can live in one process, as tests
    do), served at ``/metrics``.

    The per-event metrics (events received, delivered, filtered, bytes out
    and the delivery-latency histogram) are updated thousands of times a
    second on the hot path, where ``prometheus_client``'s locked
    ``labels(...).inc()``/``observe()`` cost about a tenth of the proxy's CPU.
    They live in plain :class:`ResourceStats` objects (one per resource) and
    are turned into metric families only when ``/metrics`` is scraped, by a
    custom collector. The rare ones (watch gauges, relists, cut watchers,
    fallbacks, pass-through) are ordinary ``prometheus_client`` metrics.

Invariants
    * ``range_filter_proxy_upstream_watches{resource}`` is the number of open
      upstream watch streams of that resource (0 or 1 per resource).
    * Counters only grow; gauges are incremented and decremented in
      ``try``/``finally`` pairs so they never drift.
    * The exposed names and label sets are those of ordinary counters and a
      histogram (``..._total``, ``..._bucket{le}``, ``..._sum``, ``..._count``).

Concurrency model
    :class:`ResourceStats` is updated and read (scrapes are served by the app)
    on the proxy's single event loop, so plain integers need no lock.
    ``prometheus_client`` metrics are thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import accumulate

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

_PREFIX = "range_filter_proxy"

#: Buckets of the event loop's lag (seconds): a healthy loop stays in the first ones.
LOOP_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Upper bounds (seconds) of the delivery-latency histogram buckets (+Inf is implied).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ResourceStats:
    """Hot-path counters of one resource: plain integers, exported at scrape time."""

    __slots__ = (
        "bytes_out",
        "direct_writes",
        "events_delivered",
        "events_filtered",
        "events_received",
        "history_bytes",
        "history_events",
        "latency_buckets",
        "latency_sum",
        "queued_writes",
        "select_examined",
    )

    def __init__(self) -> None:
        self.events_received = 0
        self.events_delivered = 0
        self.events_filtered = 0
        self.bytes_out = 0
        #: Live chunks written by the end-of-turn flush straight to the connection / by the watch's task.
        self.direct_writes = 0
        self.queued_writes = 0
        #: Non-cumulative counts per bucket of :data:`LATENCY_BUCKETS`, plus one for +Inf.
        self.latency_buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        #: Cached objects looked at by selects (lists, watches' initial state): with a
        #: ``shardSelector`` only those of the hash buckets it overlaps, without one all.
        self.select_examined = 0
        #: The event history now: events and the bytes they are counted at (``--history-max-bytes``).
        self.history_events = 0
        self.history_bytes = 0


class _StatsCollector(Collector):
    """Exports every :class:`ResourceStats` of a :class:`ProxyMetrics` as counters and a histogram."""

    def __init__(self, stats: dict[str, ResourceStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        counters = (
            ("events_received", "Watch events received from the upstream"),
            ("events_delivered", "Watch events queued to downstream watchers"),
            ("events_filtered", "Watch events not sent to a downstream watcher because its filters rejected them"),
            ("bytes_out", "Bytes of list and watch responses served from the cache"),
            (
                "select_examined",
                "Cached objects looked at to answer lists and initial watch states (with a shardSelector,"
                " only those of the hash buckets its ranges overlap)",
            ),
        )
        items = sorted(self._stats.items())
        for attr, doc in counters:
            family = CounterMetricFamily(f"{_PREFIX}_{attr}", doc, labels=["resource"])
            for resource, s in items:
                family.add_metric([resource], getattr(s, attr))
            yield family
        for attr, doc in (
            ("history_events", "Events in the watch cache's history (what resumed watches replay)"),
            ("history_bytes", "Bytes the history's events are counted at (bounded by --history-max-bytes)"),
        ):
            gauge = GaugeMetricFamily(f"{_PREFIX}_{attr}", doc, labels=["resource"])
            for resource, s in items:
                gauge.add_metric([resource], getattr(s, attr))
            yield gauge
        writes = CounterMetricFamily(
            f"{_PREFIX}_watch_writes",
            "Chunks of live watch events written downstream, by path: direct (from the end-of-turn flush"
            " straight to the connection) or task (by the watch's task, e.g. while the connection drains)",
            labels=["resource", "path"],
        )
        for resource, s in items:
            writes.add_metric([resource, "direct"], s.direct_writes)
            writes.add_metric([resource, "task"], s.queued_writes)
        yield writes
        hist = HistogramMetricFamily(
            f"{_PREFIX}_event_delivery_latency_seconds",
            "Time from receiving an event upstream to handing it to a downstream connection",
            labels=["resource"],
        )
        bounds = (*(repr(b) for b in LATENCY_BUCKETS), "+Inf")
        for resource, s in items:
            cumulative = list(zip(bounds, accumulate(s.latency_buckets), strict=True))
            hist.add_metric([resource], cumulative, s.latency_sum)
        yield hist


class ProxyMetrics:
    """All metrics of one proxy instance."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._stats: dict[str, ResourceStats] = {}
        self.registry.register(_StatsCollector(self._stats))

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(f"{_PREFIX}_{name}", doc, labels, registry=self.registry)

        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(f"{_PREFIX}_{name}", doc, labels, registry=self.registry)

        self.upstream_watches = gauge("upstream_watches", "Open upstream watch streams per resource", "resource")
        self.downstream_watches = gauge(
            "downstream_watches", "Open downstream watches served from the cache", "resource"
        )
        self.relists = counter("relists", "Full upstream (re)lists per resource", "resource")
        self.slow_watchers_cut = counter("slow_watchers_cut", "Downstream watchers closed for not reading", "resource")
        self.consistent_read_fallbacks = counter(
            "consistent_read_fallbacks",
            "Consistent reads answered from an upstream list because the cache was not fresh in time",
            "resource",
        )
        self.passthrough_requests = counter("passthrough_requests", "Requests passed through to the upstream", "method")
        self.fenced_writes = counter(
            "fenced_writes", "Writes with an owner token refused with 409 (write fencing), by reason", "reason"
        )
        self.fencing_checks = counter("fencing_checks", "Writes with an owner token checked by write fencing")
        self.client_disconnects = counter(
            "client_disconnects",
            "Requests whose client went away before its body was read (an expected event, logged at DEBUG)",
        )
        self.upstream_shard_selector_supported = gauge(
            "upstream_shard_selector_supported",
            "1 when the upstream answered a probe list with a shardSelector with metadata.shardInfo"
            " (a native KEP-5866 server), 0 when it did not or was not probed yet",
        )
        self.upstream_connections_busy = gauge(
            "upstream_connections_busy",
            "Pooled upstream connections serving a request (or an answer still being relayed); with nothing"
            " in flight it falls back to 0",
        )
        self.upstream_requests_waiting = gauge(
            "upstream_requests_waiting", "Upstream requests waiting for a pooled connection (the pool is full)"
        )
        self.loop_lag = Histogram(
            f"{_PREFIX}_event_loop_lag_seconds",
            "How late the proxy's event loop woke a probe sleeping 0.25 s (a blocked or CPU-starved process:"
            " every request, watch event and fencing decision waits turns of this loop)",
            buckets=LOOP_LAG_BUCKETS,
            registry=self.registry,
        )
        self.root_moves = counter(
            "root_moves",
            "Cached objects whose root (by: root) moved with an intermediate object, sent as DELETED/ADDED",
            "resource",
        )
        self.root_late_events = counter(
            "root_late_events",
            "Upstream events of a root-placed resource that arrived after a move forced past their"
            " resourceVersion (filed at the cache's resourceVersion)",
            "resource",
        )
        self.fencing_reads = counter(
            "fencing_registry_reads",
            "Linearizable registry reads of write fencing (one per batch of concurrent writes)",
        )

    def stats(self, resource: str) -> ResourceStats:
        """The hot-path counters of ``resource`` (created on first use)."""
        s = self._stats.get(resource)
        if s is None:
            s = self._stats[resource] = ResourceStats()
        return s
