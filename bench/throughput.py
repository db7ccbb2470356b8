"""Proxy throughput and latency: how many ~1 KiB upstream events/s the proxy absorbs with 16 range watchers.

Purpose
    Four measurements of the same event stream (``MODIFIED`` pods of ~1.2 KiB,
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
      HTTP watch clients in this process. After one unreported warm-up
      burst at the lowest rate, the feed ramps the offered rate;
      each step reports the achieved rate, the client-observed delivery
      latency (feed send time to client receipt, wall clock, same host) and
      the proxy's CPU use. The *sustained* rate is the highest step that kept
      up (achieved >= 95 % of offered, all events delivered within 5 s, p99
      latency < 50 ms, no watcher cut off);
    * ``realUpstream``: the same ramp through the unmodified ``rangeshard
      proxy`` command (defaults: uvloop, heap keeper), which reads a real
      chunked HTTP watch from :mod:`bench.upstream_server` -- the whole
      path, socket read and line split included. The proxy gets one core,
      the upstream server and the clients the other;
    * ``socketFloorAt2000``: the same lines at 2,000/s to the same clients
      from :mod:`bench.floor`, which only writes them: the latency this
      machine adds to anything, the floor of the proxy's latency.

Invariants
    * Every loop is bounded by an event count and a deadline; the child proxy
      is stopped (SIGTERM, then SIGKILL) in ``finally``.
    * The proxies (:class:`FeedProxy`, ``ProxyProcess``) are
      :class:`~rangeshard.core.process.ManagedProcess` children waited for by
      the one readiness routine (``/readyz``, an exit fails the wait at once);
      ``bench.upstream_server`` and ``bench.floor`` are ready once they print
      the port they bound.
    * Clients read their watch over a bare socket and extract only the send
      timestamp from each line (a byte search), so the client side stays far
      cheaper than the proxy under test and adds little noise to latencies.

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
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import orjson

from bench.common import metric_value, percentile, proc_cpu_seconds
from bench.fanout import equal_ranges
from bench.feed import POD_INFO, SENT_ANNOTATION, FeedUpstream
from hashing import UID_PATH, parse_shard_selector, range_to_selector
from range_filter_proxy.cache import WatchCache
from range_filter_proxy.cached import CacheSettings, WatchFilter
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.process import ProxyProcess
from range_filter_proxy.watchstream import decode_watch_line
from rangeshard.core.process import ManagedProcess, free_port, popen

log = logging.getLogger(__name__)
_T = TypeVar("_T")

WATCHERS = 16
_SENT_KEY = b'"' + SENT_ANNOTATION.encode() + b'":"'


def _lines(objects: int) -> list[bytes]:
    feed = FeedUpstream(objects)
    return [feed.next_line() for _ in range(objects)]


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
        delivered = 0
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        for i in range(events):
            cache.apply(decode_watch_line(feed.next_line(), "feed"))
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


async def _watch(url: str, params: dict[str, str], stats: _Client) -> None:
    """One watch over a bare socket: the response bytes are only scanned for send timestamps.

    Each line the proxy writes is whole inside one HTTP chunk, so the chunk
    framing never splits a timestamp; a read may, so the unscanned tail of
    each read is kept for the next one.
    """
    target = httpx.URL(url).copy_merge_params(params)
    host, port = target.host, target.port or 80
    writer: asyncio.StreamWriter | None = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        request = f"GET {target.raw_path.decode()} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: application/json\r\n\r\n"
        writer.write(request.encode())
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            stats.error = head.split(b"\r\n", 1)[0].decode(errors="replace")
            return
        buf = b""
        key_len = len(_SENT_KEY)
        latencies = stats.latencies
        for _ in range(100_000_000):  # bounded; the stream normally ends by cancellation
            data = await reader.read(1 << 18)
            if not data:
                break
            now = time.time()
            buf = buf + data if buf else data
            pos = 0
            keep_from = -1
            while True:
                i = buf.find(_SENT_KEY, pos)
                if i < 0:
                    break
                start = i + key_len
                end = buf.find(b'"', start)
                if end < 0:
                    keep_from = i  # the timestamp continues in the next read
                    break
                latencies.append(now - float(buf[start:end]))
                stats.events += 1
                pos = end
            buf = buf[keep_from if keep_from >= 0 else max(pos, len(buf) - key_len) :]
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
        stats.error = repr(e)
    finally:
        if writer is not None:
            writer.close()
    if not stats.error:
        stats.error = "stream ended"


async def _http_steps(
    url: str, pid: int, rates: list[int], step_seconds: float, control_url: str | None = None
) -> list[dict[str, Any]]:
    """Ramp the offered rate through the proxy at ``url``; bursts are started at ``control_url`` (the feed)."""
    control = control_url or url
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
            tasks.append(asyncio.create_task(_watch(f"{url}/api/v1/pods", params, stats)))
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
            # A first, unreported burst at the lowest rate warms both sides up (lazily
            # created paths, first allocations); its latencies are not anybody's steady state.
            for step, rate in enumerate([rates[0], *rates]):
                warm_up = step == 0
                count = max(1, int(rate * step_seconds))
                for c in clients:
                    c.latencies.clear()
                cpu0 = proc_cpu_seconds(pid)
                client_cpu0 = time.process_time()
                t0 = time.monotonic()
                resp = await client.post(f"{control}/bench/feed", params={"rate": str(rate), "count": str(count)})
                resp.raise_for_status()
                # The burst itself: bounded by 3x its nominal duration plus slack.
                limit = time.monotonic() + step_seconds * 3 + 10
                status: dict[str, Any] = {}
                while time.monotonic() < limit:
                    status = (await client.get(f"{control}/bench/feed")).json()
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
                    emitted == count and achieved >= 0.95 * rate and got == emitted and p99_ms < 50 and cut == 0
                )
                if warm_up and row["keptUp"]:
                    continue
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
    return steps


def _run_loop(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run the client side on uvloop, like the proxy (plain asyncio if uvloop is missing)."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


@contextlib.contextmanager
def _pinned(server_pid: int, *client_side: int) -> Iterator[None]:
    """One core for the server process, the other(s) for this one (the clients) and ``client_side``.

    Without pinning the server and the 16 clients compete and the numbers
    swing by ~1.5x between runs. This process's affinity is restored on exit.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        yield
        return
    own = set(cpus)
    os.sched_setaffinity(server_pid, {cpus[0]})
    for pid in (0, *client_side):
        os.sched_setaffinity(pid, set(cpus[1:]))
    try:
        yield
    finally:
        os.sched_setaffinity(0, own)


def _spawn_printing_port(args: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``python -m ARGS``, a server of ours that prints its port on its first stdout line."""
    proc = popen([sys.executable, "-m", *args], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    line = proc.stdout.readline() if proc.stdout is not None else b""
    if not line.strip().isdigit():
        proc.kill()
        proc.wait(5)
        raise RuntimeError(f"{args[0]} did not start")
    return proc, int(line)


def socket_floor(rate: int, seconds: float) -> dict[str, Any]:
    """Latency of the same lines to the same 16 clients from a sender that does nothing else (bench.floor)."""
    count = max(1, int(rate * seconds))
    proc, port = _spawn_printing_port(
        ["bench.floor", "--rate", str(rate), "--count", str(count), "--watchers", str(WATCHERS)]
    )
    clients = [_Client() for _ in range(WATCHERS)]
    try:

        async def go() -> None:
            tasks = [asyncio.create_task(_watch(f"http://127.0.0.1:{port}/floor", {}, c)) for c in clients]
            async with asyncio.timeout(seconds * 3 + 30):
                await asyncio.gather(*tasks)

        with _pinned(proc.pid):
            _run_loop(go())
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(10)
    lat = [x for c in clients for x in c.latencies]
    return {
        "path": "bench.floor: the same lines written to 16 chunked HTTP responses, nothing else",
        "offeredPerSecond": rate,
        "events": count,
        "delivered": len(lat),
        "p50LatencyMs": round(percentile(lat, 0.50) * 1000, 2),
        "p99LatencyMs": round(percentile(lat, 0.99) * 1000, 2),
        "maxLatencyMs": round(max(lat) * 1000, 2) if lat else None,
    }


def real_upstream(rates: list[int], step_seconds: float, workdir: Path, objects: int = 1024) -> dict[str, Any]:
    """The unmodified ``rangeshard proxy`` process, reading a real HTTP watch from :mod:`bench.upstream_server`.

    The proxy gets one core; the upstream server and the 16 clients share the other.
    """
    upstream, port = _spawn_printing_port(["bench.upstream_server", "--objects", str(objects)])
    try:
        upstream_url = f"http://127.0.0.1:{port}"
        proxy = ProxyProcess(
            upstream_url,
            resources=["pods"],
            log_file=workdir / "real-upstream-proxy.log",
            extra_args=["--log-level", "warning"],
        )
        proxy.start(timeout=60)
        try:
            pid = proxy.pid
            if pid is None:
                raise RuntimeError("the proxy exited right after start")
            with _pinned(pid, upstream.pid):
                steps = _run_loop(_http_steps(proxy.url, pid, rates, step_seconds, control_url=upstream_url))
        finally:
            proxy.stop()
    finally:
        if upstream.poll() is None:
            upstream.terminate()
        upstream.wait(10)
    return _summary(
        "`rangeshard proxy` (python -m range_filter_proxy, defaults) reading a chunked HTTP watch from"
        " bench.upstream_server; proxy pinned to one core, upstream and clients to the other",
        steps,
        step_seconds,
    )


class FeedProxy(ManagedProcess):
    """``python -m bench.feed`` on a free loopback port: the proxy app over a :class:`FeedUpstream`."""

    what = "feed proxy"

    def __init__(self, log_path: Path, objects: int) -> None:
        self.log_path = log_path
        self.objects = objects
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self, timeout: float = 30.0) -> None:
        """Start it and wait until ``/readyz`` answers 200 (an exit or a timeout raises, with its log tail)."""
        # ``bench`` is not installed: ``-m`` finds it from the working directory (the repository root).
        command = [sys.executable, "-m", "bench.feed", "--port", str(self.port), "--objects", str(self.objects)]
        self._spawn(command, self.error, self.what, new_session=False)
        self.wait_http_ready(f"{self.url}/readyz", timeout)


def http(rates: list[int], step_seconds: float, workdir: Path, objects: int = 1024) -> dict[str, Any]:
    """Ramp the feed through the real proxy over HTTP with 16 watchers (see module docstring)."""
    feed = FeedProxy(workdir / "feed-proxy.log", objects)
    feed.start()
    try:
        pid = feed.pid
        if pid is None:
            raise RuntimeError("the feed proxy exited right after start")
        with _pinned(pid):
            steps = _run_loop(_http_steps(feed.url, pid, rates, step_seconds))
    finally:
        feed.stop()
    return _summary(
        "real proxy app (uvicorn, HTTP, 16 watch clients) fed through its Upstream interface"
        " by bench.feed; proxy pinned to one core, clients to the other",
        steps,
        step_seconds,
    )


def _summary(path: str, steps: list[dict[str, Any]], step_seconds: float) -> dict[str, Any]:
    """The result of one rate ramp: its steps, the sustained rate and the capacity per CPU second."""
    kept = [s["offeredPerSecond"] for s in steps if s["keptUp"]]
    per_cpu = [s["eventsPerProxyCpuSecond"] for s in steps if s["eventsPerProxyCpuSecond"]]
    return {
        "path": path,
        "watchers": WATCHERS,
        "stepSeconds": step_seconds,
        "steps": steps,
        "sustainedPerSecond": max(kept) if kept else 0,
        # Machine-noise-proof capacity: events delivered per CPU second the proxy process got,
        # at the highest offered rate (where fixed per-second costs weigh least).
        "eventsPerProxyCpuSecond": per_cpu[-1] if per_cpu else None,
    }


def run(quick: bool, workdir: Path) -> dict[str, Any]:
    """All measurements, plus ratios to the bare loop and the report targets."""
    bare = bare_loop(0.5 if quick else 3.0)
    inproc = in_process(8_000 if quick else 50_000)
    # The ramp goes on past 20,000/s (up to 80,000/s, stopping at the first step that does not keep
    # up): the real-upstream target (sustained >= 0.2 of the bare loop: 23,000-27,000/s on the
    # Intel VM, 30,000-50,000/s on the AMD one) could not be measured if the ramp ended below it,
    # and steps of 5,000/s near the top keep the sustained rate from being under-reported by a
    # whole coarse step.
    rates = (
        [1000, 2000, 5000]
        if quick
        else [
            *(1000, 2000, 4000, 6000, 8000, 10000, 12000, 15000, 20000, 25000, 30000, 35000),
            *(40000, 45000, 50000, 55000, 60000, 70000, 80000),
        ]
    )
    over_http = http(rates, 1.0 if quick else 3.0, workdir)
    over_real = real_upstream(rates, 1.0 if quick else 3.0, workdir)
    floor = socket_floor(2000, 1.0 if quick else 3.0)
    at_2000 = next((s for s in over_http["steps"] if s["offeredPerSecond"] == 2000), None)
    real_2000 = next((s for s in over_real["steps"] if s["offeredPerSecond"] == 2000), None)
    bare_cpu = bare["eventsPerCpuSecond"] or bare["eventsPerSecond"]
    http_cpu = over_http["eventsPerProxyCpuSecond"]
    return {
        "bareLoop": bare,
        "inProcess": inproc,
        "http": over_http,
        "realUpstream": over_real,
        "socketFloorAt2000": floor,
        # Ratios per CPU second actually used: independent of how loaded the machine was.
        "inProcessVsBare": round((inproc["eventsPerCpuSecond"] or inproc["eventsPerSecond"]) / bare_cpu, 3),
        "httpPerCpuVsBare": round(http_cpu / bare_cpu, 3) if http_cpu else None,
        "realUpstreamPerCpuVsBare": (
            round(over_real["eventsPerProxyCpuSecond"] / bare_cpu, 3) if over_real["eventsPerProxyCpuSecond"] else None
        ),
        "httpSustainedVsBare": round(over_http["sustainedPerSecond"] / bare["eventsPerSecond"], 3),
        "p99At2000Ms": at_2000["p99LatencyMs"] if at_2000 else None,
        "p50At2000Ms": at_2000["p50LatencyMs"] if at_2000 else None,
        "floorP99At2000Ms": floor["p99LatencyMs"],
        "realUpstreamP99At2000Ms": real_2000["p99LatencyMs"] if real_2000 else None,
        "realUpstreamSustainedVsBare": round(over_real["sustainedPerSecond"] / bare["eventsPerSecond"], 3),
        # What the proxy adds to the machine's own latency at 2,000/s (issue 17: <= 3 ms).
        "realUpstreamP99OverFloorMs": (
            round(real_2000["p99LatencyMs"] - floor["p99LatencyMs"], 2) if real_2000 else None
        ),
        "targets": {
            "eventsPerSecond": 10_000,
            "p99At2000Ms": 10.0,
            "realUpstreamPerCpuVsBare": 0.25,
            "realUpstreamSustainedVsBare": 0.2,
            "realUpstreamP99OverFloorMs": 3.0,
        },
    }
