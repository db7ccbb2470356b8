"""Cache: LIST latency of a 1/16 range at 10k and 100k pods, and memory per cached object.

Purpose
    * ``list``: the real proxy app in process (``create_app`` over an
      in-memory :class:`~range_filter_proxy.upstream.Upstream` holding N
      stored pods of ~1.2 KiB), called through ``httpx.ASGITransport``: a
      consistent LIST (no resourceVersion, as controllers' informers send it)
      with a ``shardSelector`` for each of the 16 slices of the hash space.
      Measured: wall time per request (handler, filter, body assembly; no
      socket), p50 and max over the 16 slices, and items returned. Creating
      100k pods through the local API server (~100/s) would take ~20 minutes,
      so the objects go straight into the proxy's upstream interface.
    * ``memory``: ``tracemalloc`` traced bytes of the proxy's store (decoded
      object, its serialisation, precomputed hashes, labels) built from raw
      JSON, divided by the number of objects, compared with the raw JSON size;
      and the same for the store index's uid-path buckets (built by the first
      range LIST over that path).
    * ``listBreakdown``: CPU time of the parts of one LIST (sort of the whole
      store, a scan filtering it, the cache's select through its shard-hash
      index, body join) and of one full garbage collection over it.
    * ``gcPauses``: garbage-collector pauses while a cache applies events
      until its history is full (100k events; quick 20k), without and with
      the proxy's :class:`~range_filter_proxy.heap.HeapKeeper` (a pass every
      2,500 events: what its default 0.25 s interval sees at 10,000
      events/s). Measured with ``gc.callbacks``: the longest pause, the
      number of full collections, and the total time in the collector.

Invariants
    * Objects are generated once per size; every request is bounded by a timeout.
    * ``tracemalloc`` is stopped in ``finally``.

Concurrency model
    One asyncio loop per size (``asyncio.run``); the memory measurement is a
    synchronous loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx
import orjson

from bench.common import percentile, stored_pod
from bench.fanout import equal_ranges
from bench.feed import POD_INFO, FeedUpstream, PodsUpstream
from hashing import UID_PATH, ShardRange, ShardSelector, parse_shard_selector, range_to_selector
from range_filter_proxy import create_app
from range_filter_proxy.cache import WatchCache
from range_filter_proxy.cached import CachedObject, CacheSettings, WatchFilter
from range_filter_proxy.heap import HeapKeeper, HeapSettings
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.storeindex import StoreIndex
from range_filter_proxy.upstream import ListResult
from range_filter_proxy.watchstream import WatchEvent, decode_watch_line
from rangeshard.core.rest import GVR

log = logging.getLogger(__name__)

SLICES = 16
#: Events between two heap keeper passes in ``gc_pauses``.
KEEPER_EVERY = 2500
NAMESPACES = 20


class StaticUpstream(PodsUpstream):
    """An :class:`~range_filter_proxy.upstream.Upstream` whose pods never change (watch only waits)."""

    def __init__(self, pods: list[dict[str, Any]], rv: int) -> None:
        self.pods = pods
        self.rv = rv
        self._stop = asyncio.Event()

    async def list(self, gvr: GVR, params: Mapping[str, str] | None = None) -> ListResult:
        return ListResult(self.pods, str(self.rv))

    async def watch(self, gvr: GVR, resource_version: str) -> AsyncIterator[WatchEvent]:
        # A quiet upstream: one bookmark (so consistent reads find the cache fresh), then nothing.
        yield WatchEvent("BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)}})
        # Never set: the cache task is cancelled when the app stops. (asyncio.timeout, not wait_for:
        # Python 3.11's wait_for can swallow a cancellation whose inner future has just completed.)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(600):
                await self._stop.wait()


def make_pods(n: int) -> list[dict[str, Any]]:
    """``n`` stored pods spread over a few namespaces."""
    return [stored_pod(f"pod-{i}", f"ns-{i % NAMESPACES}", 10 + i) for i in range(n)]


def list_latency(n: int, repeats: int = 2) -> dict[str, Any]:
    """Time consistent LISTs of each 1/16 slice against a proxy cache of ``n`` pods."""
    pods = make_pods(n)
    rv = 10 + n

    async def go() -> dict[str, Any]:
        upstream = StaticUpstream(pods, rv)
        app = create_app(upstream)
        state = app.state.proxy
        transport = httpx.ASGITransport(app=app)
        times: list[float] = []
        cpu: list[float] = []
        items: list[int] = []
        sizes: list[int] = []
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://proxy", timeout=120) as client:
                t0 = time.perf_counter()
                first = await client.get("/api/v1/pods", params={"resourceVersion": "0", "limit": "1"})
                first.raise_for_status()
                sync_seconds = time.perf_counter() - t0
                for _ in range(repeats):
                    for r in equal_ranges(SLICES):
                        sel = range_to_selector(r, UID_PATH)
                        t = time.perf_counter()
                        c = time.process_time()
                        resp = await client.get("/api/v1/pods", params={"shardSelector": sel})
                        body = resp.content
                        times.append(time.perf_counter() - t)
                        cpu.append(time.process_time() - c)
                        resp.raise_for_status()
                        items.append(len(orjson.loads(body)["items"]))
                        sizes.append(len(body))
        finally:
            await state.manager.stop()
        return {
            "objects": n,
            "slices": SLICES,
            "requests": len(times),
            "syncSeconds": round(sync_seconds, 3),
            "p50Ms": round(percentile(times, 0.5) * 1000, 2),
            "maxMs": round(max(times) * 1000, 2),
            "p50CpuMs": round(percentile(cpu, 0.5) * 1000, 2),
            "itemsPerList": round(sum(items) / len(items), 1),
            "bytesPerList": round(sum(sizes) / len(sizes)),
        }

    return asyncio.run(go())


def list_breakdown(n: int) -> dict[str, Any]:
    """CPU ms of the parts of one 1/16 LIST over a store of ``n`` pods (best of 3), and of one full GC pass.

    Separates the sort of the whole store, a scan filtering it (what
    ``WatchCache.select`` did before its shard-hash index), the cache's
    select (index, filter, sort of the slice), the body join, and the cost
    of a full (generation 2) garbage collection over the store, which is
    what the occasional slow LIST pays.
    """
    store: dict[tuple[str, str], CachedObject] = {}
    pods = make_pods(n)
    for p in pods:
        o = CachedObject.build(p, POD_INFO)
        store[o.key] = o
    filt = WatchFilter(shard=parse_shard_selector(range_to_selector(equal_ranges(SLICES)[0], UID_PATH)))

    def best(fn: Callable[[], object]) -> float:
        out = math.inf
        for _ in range(3):
            c = time.process_time()
            fn()
            out = min(out, time.process_time() - c)
        return round(out * 1000, 2)

    chosen = [o for o in store.values() if filt.matches(o)]
    cache = WatchCache(POD_INFO, StaticUpstream([], 0), ProxyMetrics(), CacheSettings())
    cache.replace(ListResult(pods, "1"))  # the same pods, in a watch cache
    del pods
    cache.select(filt)  # builds the uid path's buckets, as the first range LIST does
    return {
        "objects": n,
        "sortWholeStoreCpuMs": best(lambda: sorted(store.items())),
        "filterWholeStoreCpuMs": best(lambda: [o for o in store.values() if filt.matches(o)]),
        "sortSliceOnlyCpuMs": best(lambda: sorted(chosen, key=lambda o: o.key)),
        "selectIndexedCpuMs": best(lambda: cache.select(filt)),
        "joinBodyCpuMs": best(lambda: b",".join(o.raw for o in chosen)),
        "fullGcCpuMs": best(gc.collect),
    }


def memory_per_object(n: int) -> dict[str, Any]:
    """Traced bytes per object of the proxy's store built from raw JSON, vs the raw JSON size."""
    raws = [orjson.dumps(p) for p in make_pods(n)]
    raw_mean = sum(len(r) for r in raws) / n
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        store: dict[tuple[str, str], CachedObject] = {}
        for raw in raws:
            o = CachedObject.build(orjson.loads(raw), POD_INFO)
            store[o.key] = o
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        index = StoreIndex()  # the uid path's buckets, what a range LIST over that path builds
        index.candidates(ShardSelector((ShardRange(UID_PATH, 0, 1 << 64),)), store)
        gc.collect()
        indexed = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    per_object = (after - before) / n
    index_per_object = (indexed - after) / n
    serialised = sum(len(o.raw) for o in store.values()) / n
    return {
        "objects": n,
        "rawJsonBytes": round(raw_mean),
        "bytesPerObject": round(per_object),
        "ratioToRawJson": round(per_object / raw_mean, 2),
        "ofWhichSerialisedBytes": round(serialised),
        "decodedEtcPerObject": round(per_object - serialised),
        "uidIndexBytesPerObject": round(index_per_object, 1),
        "ratioWithUidIndex": round((per_object + index_per_object) / raw_mean, 2),
        "target": 2.0,
    }


def gc_pauses(events: int, keeper: bool) -> dict[str, Any]:
    """Collector pauses while ``events`` events fill a cache's history (see module docstring)."""
    pauses: list[tuple[int, float]] = []
    started = [0.0]

    def on_gc(phase: str, info: Mapping[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((int(info["generation"]), time.perf_counter() - started[0]))

    async def go() -> tuple[int, list[float]]:
        feed = FeedUpstream(1024)
        cache = WatchCache(POD_INFO, feed, ProxyMetrics(), CacheSettings(watcher_queue_size=1))
        cache.replace(await feed.list(POD_INFO.gvr))
        heap = HeapKeeper(HeapSettings())
        passes: list[float] = []
        gc.callbacks.append(on_gc)
        try:
            for i in range(events):
                cache.apply(decode_watch_line(feed.next_line(), "bench"))
                if keeper and i % KEEPER_EVERY == KEEPER_EVERY - 1:
                    passes.append(heap.run_pass())
        finally:
            gc.callbacks.remove(on_gc)
            gc.unfreeze()
        return len(cache.history), passes

    history, passes = asyncio.run(go())
    full = [p for g, p in pauses if g == 2]
    return {
        "keeper": keeper,
        "events": events,
        "historyEvents": history,
        "maxPauseMs": round(max((p for _, p in pauses), default=0.0) * 1000, 2),
        "fullCollections": len(full),
        "maxFullCollectionMs": round(max(full, default=0.0) * 1000, 2),
        "keeperPasses": len(passes),
        "totalGcMs": round(sum(p for _, p in pauses) * 1000, 1),
    }


def run(quick: bool) -> dict[str, Any]:
    sizes = [10_000] if quick else [10_000, 100_000]
    lists = []
    for n in sizes:
        row = list_latency(n, repeats=1 if quick else 2)
        log.info("cache list of 1/16 at %d pods: %s", n, row)
        lists.append(row)
    breakdown = list_breakdown(sizes[-1])
    log.info("cache list breakdown: %s", breakdown)
    mem = memory_per_object(1_000 if quick else 10_000)
    log.info("cache memory: %s", mem)
    pauses = [gc_pauses(20_000 if quick else 100_000, keeper) for keeper in (False, True)]
    log.info("gc pauses: %s", pauses)
    return {
        "path": "in-process: real proxy app via httpx.ASGITransport over an in-memory Upstream (no sockets)",
        "list": lists,
        "listBreakdown": breakdown,
        "memory": mem,
        "gcPauses": pauses,
        "targets": {"listMsAt100k": 100.0, "memoryRatio": 2.0},
    }
