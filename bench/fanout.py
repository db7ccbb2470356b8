"""Fan-out: N range watchers through the proxy vs N full watches on the upstream with client-side filtering.

Purpose
    For each N, open N watchers on the pods of one namespace and create
    ``events`` pods through the local API server:

    * ``proxy``: watcher *i* watches through the range filter proxy with a
      ``shardSelector`` for the *i*-th of N equal slices of the hash space
      (each pod reaches exactly one watcher);
    * ``direct``: every watcher watches the API server itself (the
      kube-state-metrics approach) and drops, client-side, the pods outside
      its slice.

    Measured per run: upstream watches open on the API server
    (``local_apiserver_watches{resource="pods"}`` while the watchers are open,
    minus the watches this configuration does not own), the bytes the API
    server sent (counted by the :class:`~bench.common.CountingRelay` the
    proxy, or the direct watchers, reach it through), the events every
    watcher received and kept, and CPU seconds of the proxy and the API
    server (``/proc/<pid>/stat``) while the events flowed.

Invariants
    * Proxy mode: the watchers' slices partition the space, so the events
      received sum to exactly ``events``; direct mode: every watcher receives
      all ``events`` and keeps about ``events / N``.
    * Every watcher, request and wait is bounded in time; watchers are
      cancelled and the API server's watch count returns to its baseline
      before the next run starts.

Concurrency model
    One asyncio loop per run (the caller's thread): N watcher tasks, a
    producer creating pods with bounded concurrency, a poller for metrics.
    The relay runs on its own thread (see :mod:`bench.common`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from bench.common import BenchCluster, make_pod, metric_value, proc_cpu_seconds
from hashing import MAX_HASH, UID_PATH, HashRange, hash_key, range_to_selector

log = logging.getLogger(__name__)

NAMESPACE = "bench-fanout"
PHASE_TIMEOUT = 120.0
CREATE_CONCURRENCY = 4
CREATE_ATTEMPTS = 3


def equal_ranges(n: int) -> list[HashRange]:
    """N contiguous ranges of (almost) equal size covering ``[0, MAX_HASH]``."""
    step = (MAX_HASH + 1) // n
    return [HashRange(i * step, MAX_HASH if i == n - 1 else (i + 1) * step - 1) for i in range(n)]


@dataclass
class WatcherStats:
    """What one watcher saw."""

    rng: HashRange
    bytes: int = 0
    events: int = 0
    kept: int = 0
    bookmarks: int = 0


async def _watch(client: httpx.AsyncClient, url: str, params: dict[str, str], stats: WatcherStats) -> None:
    """Stream a watch, decode every event (as a controller's informer would) and keep those in range."""
    buf = b""
    async with client.stream("GET", url, params=params) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"watch {url}: HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
        async for chunk in resp.aiter_bytes():
            stats.bytes += len(chunk)
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if not line:
                    continue
                ev = orjson.loads(line)
                if ev.get("type") == "BOOKMARK":
                    stats.bookmarks += 1
                    continue
                stats.events += 1
                uid = ev["object"]["metadata"].get("uid", "")
                if stats.rng.contains(hash_key(uid)):
                    stats.kept += 1


async def _current_rv(client: httpx.AsyncClient, api: str) -> str:
    resp = await client.get(f"{api}/api/v1/namespaces/{NAMESPACE}/pods", params={"limit": "1"})
    resp.raise_for_status()
    return str(resp.json()["metadata"]["resourceVersion"])


async def _gauge(client: httpx.AsyncClient, url: str, name: str) -> float:
    resp = await client.get(url)
    resp.raise_for_status()
    return metric_value(resp.text, name, resource="pods")


async def _wait_gauge(client: httpx.AsyncClient, url: str, name: str, want: float, what: str) -> None:
    deadline = time.monotonic() + 30.0
    while True:
        value = await _gauge(client, url, name)
        if value == want:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {name} is {value}, want {want}")
        await asyncio.sleep(0.02)


async def _create_pods(client: httpx.AsyncClient, api: str, names: list[str]) -> None:
    sem = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def one(name: str) -> None:
        async with sem:
            for attempt in range(CREATE_ATTEMPTS):
                try:
                    resp = await client.post(
                        f"{api}/api/v1/namespaces/{NAMESPACE}/pods",
                        content=orjson.dumps(make_pod(name, NAMESPACE)),
                        headers={"Content-Type": "application/json"},
                    )
                except httpx.TransportError:
                    # A pooled keep-alive connection the server closed at the same moment: retry.
                    # A create that did reach the server answers 409 the second time, which is fine.
                    if attempt == CREATE_ATTEMPTS - 1:
                        raise
                    await asyncio.sleep(0.05)
                    continue
                if resp.status_code in (201, 409):
                    return
                raise RuntimeError(f"create pod {name}: HTTP {resp.status_code}: {resp.text[:200]}")

    await asyncio.gather(*(one(n) for n in names))


async def _run(cluster: BenchCluster, mode: str, n: int, events: int, tag: str) -> dict[str, Any]:
    assert cluster.apiserver is not None and cluster.proxy is not None and cluster.relay is not None
    api = cluster.apiserver.url
    api_metrics = f"{api}/metrics"
    proxy_metrics = f"{cluster.proxy.url}/metrics"
    relay = cluster.relay
    relay_idx = cluster.proxy_relay if mode == "proxy" else cluster.direct_relay
    base = cluster.proxy.url if mode == "proxy" else relay.url(relay_idx)
    ranges = equal_ranges(n)
    stats = [WatcherStats(r) for r in ranges]
    timeout = httpx.Timeout(10.0, read=PHASE_TIMEOUT)
    limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        baseline = await _gauge(client, api_metrics, "local_apiserver_watches")
        rv = await _current_rv(client, api)
        tasks: list[asyncio.Task[None]] = []
        for s in stats:
            params = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": str(int(PHASE_TIMEOUT))}
            if mode == "proxy":
                params["shardSelector"] = range_to_selector(s.rng, UID_PATH)
            url = f"{base}/api/v1/namespaces/{NAMESPACE}/pods"
            tasks.append(asyncio.create_task(_watch(client, url, params, s), name=f"watcher-{mode}-{n}"))
        try:
            if mode == "proxy":
                await _wait_gauge(client, proxy_metrics, "range_filter_proxy_downstream_watches", n, "proxy watchers")
            else:
                await _wait_gauge(client, api_metrics, "local_apiserver_watches", baseline + n, "direct watchers")
            during = await _gauge(client, api_metrics, "local_apiserver_watches")
            proxy_upstream = await _gauge(client, proxy_metrics, "range_filter_proxy_upstream_watches")
            bytes0 = relay.down[relay_idx]
            proxy_cpu0 = proc_cpu_seconds(cluster.proxy_pid)
            api_cpu0 = proc_cpu_seconds(cluster.apiserver.pid)
            t0 = time.monotonic()
            names = [f"{tag}-{mode}-{n}-{i}" for i in range(events)]
            await _create_pods(client, api, names)
            created = time.monotonic()

            def done() -> bool:
                if mode == "proxy":
                    return sum(s.events for s in stats) >= events
                return all(s.events >= events for s in stats)

            deadline = time.monotonic() + PHASE_TIMEOUT
            while not done():
                failed = [t for t in tasks if t.done()]
                if failed:
                    exc = failed[0].exception() if not failed[0].cancelled() else None
                    raise RuntimeError(f"{mode} watcher ended early: {exc!r}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{mode} N={n}: events not delivered: {[s.events for s in stats]}")
                await asyncio.sleep(0.01)
            elapsed = time.monotonic() - t0
            upstream_bytes = relay.down[relay_idx] - bytes0
            proxy_cpu = proc_cpu_seconds(cluster.proxy_pid) - proxy_cpu0
            api_cpu = proc_cpu_seconds(cluster.apiserver.pid) - api_cpu0
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await t
        if mode == "direct":
            await _wait_gauge(client, api_metrics, "local_apiserver_watches", baseline, "direct watches closed")
    # The API server's gauge counts the idle proxy's own watch too; attribute watches to the configuration.
    upstream_watches = int(proxy_upstream) if mode == "proxy" else int(during - baseline)
    return {
        "mode": mode,
        "watchers": n,
        "events": events,
        "upstreamWatches": upstream_watches,
        "apiserverWatchesGauge": int(during),
        "upstreamBytes": upstream_bytes,
        "upstreamBytesPerEvent": round(upstream_bytes / events, 1),
        "downstreamBytes": sum(s.bytes for s in stats),
        "eventsReceived": [s.events for s in stats],
        "eventsKept": [s.kept for s in stats],
        "eventsReceivedTotal": sum(s.events for s in stats),
        "eventsKeptTotal": sum(s.kept for s in stats),
        "proxyCpuSeconds": round(proxy_cpu, 3) if mode == "proxy" else None,
        "apiserverCpuSeconds": round(api_cpu, 3),
        "createSeconds": round(created - t0, 3),
        "seconds": round(elapsed, 3),
    }


def run(cluster: BenchCluster, watcher_counts: list[int], events: int) -> list[dict[str, Any]]:
    """Run proxy and direct fan-out for every N; return one row per (mode, N)."""
    assert cluster.apiserver is not None
    resp = httpx.post(
        f"{cluster.apiserver.url}/api/v1/namespaces",
        json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        timeout=10,
    )
    if resp.status_code not in (201, 409):
        raise RuntimeError(f"create namespace: HTTP {resp.status_code}: {resp.text[:200]}")
    rows: list[dict[str, Any]] = []
    tag = f"p{int(time.time()) % 100000}"
    for n in watcher_counts:
        for mode in ("proxy", "direct"):
            row = asyncio.run(_run(cluster, mode, n, events, tag))
            log.info(
                "fanout %s N=%d: upstream watches %d, %d upstream bytes, proxy cpu %s s",
                mode,
                n,
                row["upstreamWatches"],
                row["upstreamBytes"],
                row["proxyCpuSeconds"],
            )
            rows.append(row)
    return rows
