"""Proxy throughput and latency: how many ~1 KiB upstream events/s the proxy absorbs with 16 range watchers.

Purpose
    Three measurements of the same event stream (``MODIFIED`` pods of ~1.2 KiB,
    16 watchers each holding 1/16 of the hash space, so every event goes to
    exactly one watcher):

    * ``bareLoop``: a loop that only decodes and re-encodes each line with
      orjson, the CPython limit of anything that parses and re-serialises;
    * ``inProcess``: the proxy's cache path without sockets: decode, build the
      cached object (hashes, serialisation), append to history and dispatch to
      16 in-memory watchers (``WatchCache.apply``);
    * ``http``: the real proxy app under uvicorn in a child process, fed by
      :class:`bench.feed.FeedUpstream` through its ``Upstream`` interface (the
      local API server cannot produce more than ~100 events/s), with 16 real
      HTTP watch clients in this process. The feed ramps the offered rate;
      each step reports the achieved rate, the client-observed delivery
      latency (feed send time to client receipt, wall clock, same host) and
      the proxy's CPU use. The *sustained* rate is the highest step that kept
      up (achieved >= 95 % of offered, all events delivered within 5 s, p99
      latency < 0.5 s, no watcher cut off).

Invariants
    * Every loop is bounded by an event count and a deadline; the child proxy
      is stopped (SIGTERM, then SIGKILL) in ``finally``.
    * Clients extract only the send timestamp from each line (a byte search),
      so the client side stays far cheaper than the proxy under test.

Concurrency model
    The in-process measurements are synchronous loops on one thread. The HTTP
    measurement runs one asyncio loop here (16 watcher tasks, a controller
    task) against the proxy's single event loop in its own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import metric_value, percentile, proc_cpu_seconds, wait_for
from bench.fanout import equal_ranges
from bench.feed import POD_INFO, SENT_ANNOTATION, FeedUpstream
from hashing import UID_PATH, parse_shard_selector, range_to_selector
from range_filter_proxy.cache import CacheSettings, WatchCache, WatchFilter
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.upstream import WatchEvent
from registry import free_port

log = logging.getLogger(__name__)

WATCHERS = 16
_SENT_KEY = b'"' + SENT_ANNOTATION.encode() + b'":"'


def _lines(objects: int) -> list[bytes]:
    feed = FeedUpstream(objects)
    out = []
    for i, (head, mid, tail) in enumerate(feed.templates):
        out.append(head + str(2000 + i).encode() + mid + repr(time.time()).encode() + tail)
    return out


def bare_loop(seconds: float, objects: int = 1024) -> dict[str, Any]:
    """Decode + re-encode ~1.2 KiB watch lines with orjson for ``seconds``: events/s on one core."""
    lines = _lines(objects)
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    cpu0 = time.process_time()
    while time.perf_counter() < deadline and n < 50_000_000:
        for line in lines:
            orjson.dumps(orjson.loads(line))
        n += len(lines)
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    return {
        "eventsPerSecond": round(n / elapsed),
        "eventsPerCpuSecond": round(n / cpu) if cpu > 0 else None,
        "events": n,
        "seconds": round(elapsed, 3),
        "cpuSeconds": round(cpu, 3),
        "lineBytes": round(sum(len(x) for x in lines) / len(lines)),
    }


def in_process(events: int, objects: int = 1024) -> dict[str, Any]:
    """Feed ``events`` lines through ``WatchCache.apply`` with 16 range watchers; events/s on one core."""

    async def go() -> dict[str, Any]:
        feed = FeedUpstream(objects)
        cache = WatchCache(POD_INFO, feed, ProxyMetrics(), CacheSettings(watcher_queue_size=1_000_000))
        cache.replace(await feed.list(POD_INFO.gvr))
        watchers = [
            cache.add_watcher(
                WatchFilter(shard=parse_shard_selector(range_to_selector(r, UID_PATH))),
                resume_from=cache.rv,
                bookmarks=False,
                initial_events_end=False,
                timeout=None,
            )
            for r in equal_ranges(WATCHERS)
        ]
        rv = cache.rv
        templates = feed.templates
        delivered = 0
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        for i in range(events):
            rv += 1
            head, mid, tail = templates[i % len(templates)]
            doc = orjson.loads(head + str(rv).encode() + mid + repr(time.time()).encode() + tail)
            cache.apply(WatchEvent(doc["type"], doc["object"]))
            if i % 256 == 255:
                for w in watchers:
                    delivered += len(w.live)
                    w.live.clear()
        for w in watchers:
            delivered += len(w.live)
            w.live.clear()
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        return {
            "eventsPerSecond": round(events / elapsed),
            "eventsPerCpuSecond": round(events / cpu) if cpu > 0 else None,
            "events": events,
            "delivered": delivered,
            "seconds": round(elapsed, 3),
            "cpuSeconds": round(cpu, 3),
        }

    return asyncio.run(go())


@dataclass
class _Client:
    events: int = 0
    latencies: list[float] = field(default_factory=list)
    error: str = ""


async def _watch(client: httpx.AsyncClient, url: str, params: dict[str, str], stats: _Client) -> None:
    buf = b""
    try:
        async with client.stream("GET", url, params=params) as resp:
            if resp.status_code != 200:
                stats.error = f"HTTP {resp.status_code}"
                return
            async for chunk in resp.aiter_bytes():
                now = time.time()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    i = line.find(_SENT_KEY)
                    if i < 0:
                        continue  # bookmark
                    start = i + len(_SENT_KEY)
                    sent = float(line[start : line.index(b'"', start)])
                    stats.events += 1
                    stats.latencies.append(now - sent)
    except httpx.HTTPError as e:
        stats.error = repr(e)
    if not stats.error:
        stats.error = "stream ended"


async def _http_steps(
    url: str, pid: int, rates: list[int], step_seconds: float, objects: int
) -> tuple[list[dict[str, Any]], str]:
    steps: list[dict[str, Any]] = []
    clients = [_Client() for _ in range(WATCHERS)]
    timeout = httpx.Timeout(10.0, read=600.0)
    limits = httpx.Limits(max_connections=WATCHERS + 4, max_keepalive_connections=WATCHERS + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        rv = (await client.get(f"{url}/api/v1/pods", params={"resourceVersion": "0", "limit": "1"})).json()
        start_rv = str(rv["metadata"]["resourceVersion"])
        tasks = []
        for r, stats in zip(equal_ranges(WATCHERS), clients, strict=True):
            params = {
                "watch": "true",
                "resourceVersion": start_rv,
                "shardSelector": range_to_selector(r, UID_PATH),
                "timeoutSeconds": "900",
            }
            tasks.append(asyncio.create_task(_watch(client, f"{url}/api/v1/pods", params, stats)))
        try:
            deadline = time.monotonic() + 20
            while True:
                text = (await client.get(f"{url}/metrics")).text
                if metric_value(text, "range_filter_proxy_downstream_watches", resource="pods") >= WATCHERS:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("16 watchers did not connect to the feed proxy")
                await asyncio.sleep(0.02)
            total_before = 0
            for rate in rates:
                count = max(1, int(rate * step_seconds))
                for c in clients:
                    c.latencies.clear()
                cpu0 = proc_cpu_seconds(pid)
                client_cpu0 = time.process_time()
                t0 = time.monotonic()
                resp = await client.post(f"{url}/bench/feed", params={"rate": str(rate), "count": str(count)})
                resp.raise_for_status()
                # The burst itself: bounded by 3x its nominal duration plus slack.
                limit = time.monotonic() + step_seconds * 3 + 10
                status: dict[str, Any] = {}
                while time.monotonic() < limit:
                    status = (await client.get(f"{url}/bench/feed")).json()
                    if status.get("done"):
                        break
                    await asyncio.sleep(0.05)
                feed_done = time.monotonic()
                want = total_before + int(status.get("emitted", 0))
                deliver_limit = time.monotonic() + 5.0
                while sum(c.events for c in clients) < want and time.monotonic() < deliver_limit:
                    if all(t.done() for t in tasks):
                        break
                    await asyncio.sleep(0.01)
                delivered_at = time.monotonic()
                got = sum(c.events for c in clients) - total_before
                cpu = proc_cpu_seconds(pid) - cpu0
                client_cpu = time.process_time() - client_cpu0
                total_before += got
                lat = [x for c in clients for x in c.latencies]
                text = (await client.get(f"{url}/metrics")).text
                cut = metric_value(text, "range_filter_proxy_slow_watchers_cut_total", resource="pods")
                elapsed = float(status.get("elapsed") or (feed_done - t0))
                emitted = int(status.get("emitted", 0))
                achieved = emitted / elapsed if elapsed > 0 else 0.0
                tail = lat[int(len(lat) * 0.8) :] if lat else []
                p99_ms = round(percentile(lat, 0.99) * 1000, 2)
                row: dict[str, Any] = {
                    "offeredPerSecond": rate,
                    "achievedPerSecond": round(achieved),
                    "events": emitted,
                    "delivered": got,
                    "p50LatencyMs": round(percentile(lat, 0.50) * 1000, 2),
                    "p99LatencyMs": p99_ms,
                    "maxLatencyMs": round(max(lat) * 1000, 2) if lat else None,
                    "p99LastFifthMs": round(percentile(tail, 0.99) * 1000, 2),
                    "proxyCpuSeconds": round(cpu, 3),
                    "proxyCpuUtilisation": round(cpu / max(delivered_at - t0, 1e-9), 3),
                    "eventsPerProxyCpuSecond": round(got / cpu) if cpu > 0 else None,
                    "clientCpuSeconds": round(client_cpu, 3),
                    "watchersCut": int(cut),
                    "deliverySeconds": round(delivered_at - t0, 3),
                }
                row["keptUp"] = bool(
                    emitted == count and achieved >= 0.95 * rate and got == emitted and p99_ms < 500 and cut == 0
                )
                steps.append(row)
                log.info("proxy http %s/s: %s", rate, row)
                if not row["keptUp"] or cut:
                    break
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await t
    return steps, ""


def http(rates: list[int], step_seconds: float, workdir: Path, objects: int = 1024) -> dict[str, Any]:
    """Ramp the feed through the real proxy over HTTP with 16 watchers (see module docstring)."""
    port = free_port()
    log_path = workdir / "feed-proxy.log"
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.feed", "--port", str(port), "--objects", str(objects)],
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"feed proxy exited: {log_path.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
            return False

        wait_for(ready, 30, "the feed proxy to be ready", 0.05)
        # One core for the proxy (with its feed), the other(s) for the 16 clients:
        # without pinning they compete and the numbers swing by ~1.5x between runs.
        cpus = sorted(os.sched_getaffinity(0))
        own = set(cpus)
        pinned = len(cpus) >= 2
        if pinned:
            os.sched_setaffinity(proc.pid, {cpus[0]})
            os.sched_setaffinity(0, set(cpus[1:]))
        try:
            steps, _ = asyncio.run(_http_steps(url, proc.pid, rates, step_seconds, objects))
        finally:
            if pinned:
                os.sched_setaffinity(0, own)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
    kept = [s["offeredPerSecond"] for s in steps if s["keptUp"]]
    per_cpu = [s["eventsPerProxyCpuSecond"] for s in steps if s["eventsPerProxyCpuSecond"]]
    return {
        "path": (
            "real proxy app (uvicorn, HTTP, 16 watch clients) fed through its Upstream interface"
            " by bench.feed; proxy pinned to one core, clients to the other"
        ),
        "watchers": WATCHERS,
        "stepSeconds": step_seconds,
        "steps": steps,
        "sustainedPerSecond": max(kept) if kept else 0,
        # Machine-noise-proof capacity: events delivered per CPU second the proxy process got,
        # at the highest offered rate (where fixed per-second costs weigh least).
        "eventsPerProxyCpuSecond": per_cpu[-1] if per_cpu else None,
    }


def run(quick: bool, workdir: Path) -> dict[str, Any]:
    """All three measurements, plus ratios to the bare loop and the report targets."""
    bare = bare_loop(0.5 if quick else 3.0)
    inproc = in_process(8_000 if quick else 50_000)
    rates = [1000, 2000, 5000] if quick else [1000, 2000, 4000, 6000, 8000, 10000, 12000, 15000, 20000]
    over_http = http(rates, 1.0 if quick else 3.0, workdir)
    at_2000 = next((s for s in over_http["steps"] if s["offeredPerSecond"] == 2000), None)
    bare_cpu = bare["eventsPerCpuSecond"] or bare["eventsPerSecond"]
    http_cpu = over_http["eventsPerProxyCpuSecond"]
    return {
        "bareLoop": bare,
        "inProcess": inproc,
        "http": over_http,
        # Ratios per CPU second actually used: independent of how loaded the machine was.
        "inProcessVsBare": round((inproc["eventsPerCpuSecond"] or inproc["eventsPerSecond"]) / bare_cpu, 3),
        "httpPerCpuVsBare": round(http_cpu / bare_cpu, 3) if http_cpu else None,
        "httpSustainedVsBare": round(over_http["sustainedPerSecond"] / bare["eventsPerSecond"], 3),
        "p99At2000Ms": at_2000["p99LatencyMs"] if at_2000 else None,
        "p50At2000Ms": at_2000["p50LatencyMs"] if at_2000 else None,
        "targets": {"eventsPerSecond": 10_000, "p99At2000Ms": 10.0},
    }
