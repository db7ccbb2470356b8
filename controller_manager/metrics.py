"""Prometheus metrics of a controller-manager process and its small HTTP endpoint.

Purpose
    One :class:`Metrics` per process (its own ``CollectorRegistry``, so tests
    can run several managers in one interpreter) and :class:`StatusServer`
    serving ``/metrics``, ``/healthz`` and ``/readyz``.

Invariants
    ``rangeshard_instance_state{controller,instance,state}`` is 1 for the
    instance's current state and 0 for the others.

Concurrency model
    prometheus_client metrics are thread-safe; the HTTP server runs on one
    named daemon thread (``status-server``) with a thread per request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rangeshard.core.loops import start_thread

log = logging.getLogger(__name__)

STATES = ("init", "locked", "wait", "active", "fenced")


class Metrics:
    """The metric families of one manager process."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        counter, gauge = self._counter, self._gauge
        self.state = gauge("rangeshard_instance_state", "1 for the current handover state", "controller instance state")
        self.transitions = counter("rangeshard_state_transitions_total", "Handover state changes", "controller state")
        self.reconciles = counter("rangeshard_reconciles_total", "Reconciles by result", "controller result")
        self.reconcile_errors = counter(
            "rangeshard_reconcile_errors_total",
            "Failed reconciles by reason: timeout (the deadline or an API call timed out), conflict (409),"
            " api (another API error), exception (any other error; traceback at DEBUG)",
            "controller reason",
        )
        self.reconcile_seconds_total = counter(
            "rangeshard_reconcile_seconds_total", "Wall time spent reconciling (every reconcile, whatever its result)"
        )
        self.reconcile_cpu_seconds_total = counter(
            "rangeshard_reconcile_cpu_seconds_total",
            "CPU time of the worker threads while reconciling (time.thread_time)",
        )
        self.cost = gauge(
            "rangeshard_reconcile_cost_seconds",
            "Measured reconcile cost of the keys in this instance's range, decayed over costWindowSeconds "
            "(what rebalance --by cost balances)",
        )
        self.reconcile_seconds = Histogram(
            "rangeshard_reconcile_duration_seconds",
            "Reconcile duration",
            ["controller"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.skipped = counter("rangeshard_keys_skipped_total", "Keys not reconciled (out of range, paused, fenced)")
        self.fenced_writes = counter(
            "rangeshard_fenced_writes_total",
            "Writes the proxy refused because this instance no longer owned the key (the key was dropped)",
            "controller reason",
        )
        self.handover = counter(
            "rangeshard_handover_events_total",
            "Handover paths taken: fences, rejoins, unlocks, self_unlocks, drain_waits, epochs",
            "controller event",
        )
        self.in_flight = gauge(
            "rangeshard_reconciles_in_flight",
            "Keys being reconciled now (claimed by a worker; a handover's giver drains these first)",
        )
        self.queue_depth = gauge("rangeshard_workqueue_depth", "Queued keys")
        self.workload = gauge("rangeshard_workload_objects", "Main objects in range")
        self._health_families()

    # Label names are given as one space-separated string.
    def _counter(self, name: str, doc: str, labels: str = "controller") -> Counter:
        return Counter(name, doc, labels.split(), registry=self.registry)

    def _gauge(self, name: str, doc: str, labels: str = "controller") -> Gauge:
        return Gauge(name, doc, labels.split(), registry=self.registry)

    def _health_families(self) -> None:
        """The families of the external child, the watchdog and the informers' caches."""
        counter, gauge = self._counter, self._gauge
        self.external_restarts = counter(
            "rangeshard_external_child_restarts_total",
            "Restarts of an external controller the manager runs (`command`): it exited, or was killed after "
            "failing its liveness probe (WARNING in the log says which)",
            "type",
        )
        self.external_up = gauge(
            "rangeshard_external_child_up",
            "1 while the external controller the manager runs (`command`) is running, 0 while it restarts",
            "type",
        )
        self.external_probes = counter(
            "rangeshard_external_liveness_probes_total",
            "Liveness probes of an external controller the manager runs, by result (successful, failed)",
            "type result",
        )
        self.stuck = gauge(
            "rangeshard_controller_stuck",
            "1 while the watchdog finds a built-in controller stuck (reconciles outliving their timeout, or an "
            "informer's open watch silent): the manager is not ready, and exits after watchdog.exitAfterSeconds",
        )
        self.informer_objects = gauge(
            "rangeshard_informer_cache_objects",
            "Objects in an informer's store (its resource's objects in this instance's range), read at scrape time",
            "controller informer",
        )

    def set_state(self, controller: str, instance: str, state: str) -> None:
        for s in STATES:
            self.state.labels(controller, instance, s).set(1 if s == state else 0)
        self.transitions.labels(controller, state).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class StatusServer:
    """``/metrics``, ``/healthz`` (process alive) and ``/readyz`` (every controller processing)."""

    def __init__(
        self,
        metrics: Metrics,
        ready: Callable[[], bool],
        host: str = "127.0.0.1",
        port: int = 0,
        detail: Callable[[], list[str]] | None = None,
    ) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, outer.metrics.render(), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    self._send(200, b"ok", "text/plain")
                elif path == "/readyz":
                    ok = outer.ready()
                    why = [] if ok or outer.detail is None else outer.detail()
                    text = "ok" if ok else "not ready" + (": " + "; ".join(why) if why else "")
                    self._send(200 if ok else 503, text.encode(), "text/plain")
                else:
                    self._send(404, b"not found", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("status server: " + format, *args)  # noqa: G003

        self.metrics = metrics
        self.ready = ready
        self.detail = detail
        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.host = host

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        start_thread("status-server", self.server.serve_forever, what="status server")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
