"""The shared watch cache against an in-memory fake of our own ``Upstream`` interface."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from hashing import MAX_HASH, OWNER_PATH, UID_PATH, HashRange, fnv1a_64, parse_shard_selector, range_to_selector
from range_filter_proxy.cache import CacheManager, WatchCache
from range_filter_proxy.cached import INITIAL_EVENTS_END, CacheSettings, WatchFilter
from range_filter_proxy.errors import UpstreamUnavailable
from range_filter_proxy.freshreads import consistent_snapshot
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.watcher import Watcher
from rangeshard.core.selectors import parse_field_selector, parse_label_selector
from tests.range_filter_proxy.fakes import INFOS, PODS, REPLICASETS, FakeUpstream
from tests.range_filter_proxy.helpers import async_test, eventually

LOWER, UPPER = HashRange(0, MAX_HASH // 2).to_uint64(), HashRange(MAX_HASH // 2 + 1, MAX_HASH).to_uint64()
LOWER_OWNER = parse_shard_selector(range_to_selector(HashRange(0, MAX_HASH // 2), OWNER_PATH))
UPPER_OWNER = parse_shard_selector(range_to_selector(HashRange(MAX_HASH // 2 + 1, MAX_HASH), OWNER_PATH))
LOWER_UID = parse_shard_selector(range_to_selector(HashRange(0, MAX_HASH // 2), UID_PATH))
UPPER_UID = parse_shard_selector(range_to_selector(HashRange(MAX_HASH // 2 + 1, MAX_HASH), UID_PATH))


def _in_lower(uid: str) -> bool:
    return fnv1a_64(uid) < LOWER[1]


def _uid_for(lower: bool, tag: str = "") -> str:
    """A uid whose hash lies in the lower (or upper) half."""
    i = 0
    while True:
        uid = f"uid-{tag}-{i}"
        if _in_lower(uid) == lower:
            return uid
        i += 1


async def _started(fake: FakeUpstream, gvr: Any = PODS, **settings: Any) -> tuple[WatchCache, ProxyMetrics]:
    metrics = ProxyMetrics()
    cache = WatchCache(INFOS[gvr], fake, metrics, CacheSettings(**settings))
    cache.start()
    await cache.wait_synced()
    await eventually(lambda: fake.open_watches[gvr] == 1, what="upstream watch open")
    return cache, metrics


async def _take(w: Watcher, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The first ``n`` events of a watcher's stream (decoded)."""
    out: list[dict[str, Any]] = []
    stream = w.stream()

    async def run() -> None:
        async for chunk in stream:
            # A chunk may carry several newline-terminated events (bursts are batched).
            for line in chunk.splitlines():
                out.append(orjson.loads(line))
                if len(out) >= n:
                    return

    try:
        await asyncio.wait_for(run(), timeout)
    finally:
        await stream.aclose()
    return out


async def _drain(stream: AsyncIterator[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(line) async for c in stream for line in c.splitlines()]


def _names(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in events]


def _metric(metrics: ProxyMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@async_test()
async def test_owner_path_partitions_dependents_and_keeps_orphans_in_both() -> None:
    fake = FakeUpstream()
    owners = [_uid_for(True, "a"), _uid_for(False, "b"), _uid_for(True, "c"), _uid_for(False, "d")]
    for i in range(40):
        fake.create(PODS, f"p{i}", owner_uid=owners[i % 4])
    fake.create(PODS, "orphan-1")
    fake.create(PODS, "orphan-2")
    cache, _ = await _started(fake)
    lower = {o.name for o in cache.select(WatchFilter(shard=LOWER_OWNER))}
    upper = {o.name for o in cache.select(WatchFilter(shard=UPPER_OWNER))}
    assert lower & upper == {"orphan-1", "orphan-2"}
    assert lower | upper == {o.name for o in cache.objects.values()}
    for i in range(40):
        assert (f"p{i}" in lower) == _in_lower(owners[i % 4])
    await cache.stop()


@async_test()
async def test_uid_path_partitions_and_label_field_namespace_filters_apply() -> None:
    fake = FakeUpstream()
    for i in range(30):
        fake.create(PODS, f"p{i}", namespace="a" if i % 2 else "b", labels={"app": "x" if i % 3 else "y"})
    cache, _ = await _started(fake)
    lower = {o.name for o in cache.select(WatchFilter(shard=LOWER_UID))}
    upper = {o.name for o in cache.select(WatchFilter(shard=UPPER_UID))}
    assert not lower & upper
    assert len(lower | upper) == 30
    sel = WatchFilter(namespace="a", labels=parse_label_selector("app in (y)"))
    assert {o.name for o in cache.select(sel)} == {f"p{i}" for i in range(30) if i % 2 and i % 3 == 0}
    sel = WatchFilter(fields=parse_field_selector("metadata.name=p4"))
    assert [o.name for o in cache.select(sel)] == ["p4"]
    await cache.stop()


@async_test()
async def test_watch_delivers_only_in_range_events_and_moves_as_added_deleted() -> None:
    fake = FakeUpstream()
    lo_owner, hi_owner = _uid_for(True, "lo"), _uid_for(False, "hi")
    cache, metrics = await _started(fake)
    w_lo = cache.add_watcher(
        WatchFilter(shard=LOWER_OWNER), resume_from=cache.rv, bookmarks=False, initial_events_end=False, timeout=None
    )
    w_hi = cache.add_watcher(
        WatchFilter(shard=UPPER_OWNER), resume_from=cache.rv, bookmarks=False, initial_events_end=False, timeout=None
    )
    fake.create(PODS, "a", owner_uid=lo_owner)
    fake.create(PODS, "b", owner_uid=hi_owner)
    fake.update(PODS, "a", owner_uid=hi_owner)  # adoption moves "a" to the upper range
    fake.delete(PODS, "b")
    lo = await _take(w_lo, 2)
    hi = await _take(w_hi, 3)
    assert _names(lo) == [("ADDED", "a"), ("DELETED", "a")]
    assert _names(hi) == [("ADDED", "b"), ("ADDED", "a"), ("DELETED", "b")]
    # the DELETED sent for leaving the range carries the new resourceVersion
    assert lo[1]["object"]["metadata"]["resourceVersion"] == hi[1]["object"]["metadata"]["resourceVersion"]
    assert _metric(metrics, "range_filter_proxy_events_filtered_total", resource="pods") >= 2
    assert fake.open_watches[PODS] == 1
    await cache.stop()


@async_test()
async def test_resume_from_resource_version_replays_history_and_too_old_gets_410() -> None:
    fake = FakeUpstream()
    cache, _ = await _started(fake, history_events=3, history_seconds=0)
    start = cache.rv
    for i in range(3):
        fake.create(PODS, f"p{i}")
    await eventually(lambda: len(cache.objects) == 3)
    mid = cache.rv - 1  # after p1
    w = cache.add_watcher(WatchFilter(), resume_from=mid, bookmarks=False, initial_events_end=False, timeout=None)
    assert _names(await _take(w, 1)) == [("ADDED", "p2")]
    for i in range(3, 6):
        fake.create(PODS, f"p{i}")
    await eventually(lambda: len(cache.objects) == 6)
    old = cache.add_watcher(WatchFilter(), resume_from=start, bookmarks=False, initial_events_end=False, timeout=None)
    events = await _drain(old.stream())
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410 and events[0]["object"]["kind"] == "Status"
    await cache.stop()


@async_test()
async def test_bookmarks_carry_current_rv_when_nothing_matches_and_initial_events_end() -> None:
    fake = FakeUpstream()
    fake.create(PODS, "x", uid=_uid_for(True, "x"))
    cache, _ = await _started(fake, bookmark_interval=0.05)
    w = cache.add_watcher(
        WatchFilter(shard=UPPER_UID), resume_from=None, bookmarks=True, initial_events_end=True, timeout=None
    )
    first = await _take(w, 1)
    assert first[0]["type"] == "BOOKMARK"
    assert first[0]["object"]["metadata"]["annotations"] == {INITIAL_EVENTS_END: "true"}
    w2 = cache.add_watcher(
        WatchFilter(shard=UPPER_UID), resume_from=cache.rv, bookmarks=True, initial_events_end=False, timeout=None
    )
    fake.create(PODS, "y", uid=_uid_for(True, "y"))  # lower range only: filtered for w2
    await eventually(lambda: len(cache.objects) == 2)
    target = str(cache.rv)
    events = await _take(w2, 1)
    assert events == [
        {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": target}}}
    ]
    await cache.stop()


@async_test()
async def test_slow_watcher_is_cut_off_without_stalling_others() -> None:
    fake = FakeUpstream()
    cache, metrics = await _started(fake, watcher_queue_size=5)
    slow = cache.add_watcher(
        WatchFilter(), resume_from=cache.rv, bookmarks=False, initial_events_end=False, timeout=None
    )
    fast = cache.add_watcher(
        WatchFilter(), resume_from=cache.rv, bookmarks=False, initial_events_end=False, timeout=None
    )
    got: list[dict[str, Any]] = []

    async def consume() -> None:
        async for chunk in fast.stream():
            got.extend(orjson.loads(line) for line in chunk.splitlines())

    consumer = asyncio.create_task(consume())
    for i in range(50):
        fake.create(PODS, f"p{i}")
        if i % 4 == 0:
            await asyncio.sleep(0)  # let the upstream loop and the fast consumer run
    await eventually(lambda: len(got) == 50, what="fast watcher got every event")
    assert slow.closed and slow.id not in cache.watchers
    assert _metric(metrics, "range_filter_proxy_slow_watchers_cut_total", resource="pods") == 1
    assert await _drain(slow.stream()) == []
    consumer.cancel()
    await cache.stop()


@async_test()
async def test_upstream_410_relists_and_closes_watchers_disconnect_rewatches() -> None:
    fake = FakeUpstream()
    fake.create(PODS, "a")
    cache, metrics = await _started(fake)
    w = cache.add_watcher(WatchFilter(), resume_from=cache.rv, bookmarks=False, initial_events_end=False, timeout=None)
    fake.disconnect(PODS, UpstreamUnavailable("connection reset"))
    await eventually(lambda: _metric(metrics, "range_filter_proxy_relists_total", resource="pods") == 2)
    await eventually(lambda: fake.open_watches[PODS] == 1)
    assert w.closed and await _drain(w.stream()) == []
    fake.create(PODS, "b")
    fake.compact()
    fake.fail_watches_with_gone = 1
    fake.disconnect(PODS, None)  # clean end; the re-watch gets 410 -> relist
    await eventually(lambda: _metric(metrics, "range_filter_proxy_relists_total", resource="pods") == 3)
    await eventually(lambda: {o.name for o in cache.objects.values()} == {"a", "b"})
    assert cache.history_start_rv == cache.rv
    await cache.stop()
    assert _metric(metrics, "range_filter_proxy_upstream_watches", resource="pods") == 0


@async_test()
async def test_consistent_read_waits_for_cache_or_falls_back_to_upstream() -> None:
    fake = FakeUpstream()
    fake.create(PODS, "a")
    cache, metrics = await _started(fake, consistent_read_timeout=0.2)
    fake.create(PODS, "b")
    items, rv = await consistent_snapshot(cache, WatchFilter())
    assert [o.name for o in items] == ["a", "b"] and rv == fake.rv
    assert _metric(metrics, "range_filter_proxy_consistent_read_fallbacks_total", resource="pods") == 0
    fake.bump()  # another resource changed: the pod cache cannot know it is current
    lists = fake.list_calls[PODS]
    items, rv = await consistent_snapshot(cache, WatchFilter())
    assert rv == fake.rv and fake.list_calls[PODS] == lists + 1
    assert _metric(metrics, "range_filter_proxy_consistent_read_fallbacks_total", resource="pods") == 1
    fake.bump()
    fake.bookmark(PODS)  # a bookmark proves freshness: no fallback
    items, rv = await consistent_snapshot(cache, WatchFilter())
    assert rv == fake.rv and fake.list_calls[PODS] == lists + 1
    await cache.stop()


@async_test()
async def test_many_watchers_one_upstream_watch_and_manager_discovery() -> None:
    fake = FakeUpstream()
    manager = CacheManager(fake, ProxyMetrics(), CacheSettings())
    manager.start_configured([("pods", None, ""), ("replicasets", None, "apps"), ("nosuch", None, "")])
    await eventually(lambda: manager.ready()[0], what="configured caches synced")
    info = await manager.resource_info("", "v1", "pods")
    assert info is not None
    cache = manager.cache_for(info)
    watchers = [
        cache.add_watcher(WatchFilter(), resume_from=cache.rv, bookmarks=False, initial_events_end=False, timeout=None)
        for _ in range(16)
    ]
    fake.create(PODS, "a")
    for w in watchers:
        assert _names(await _take(w, 1)) == [("ADDED", "a")]
    assert fake.open_watches[PODS] == 1 and fake.watch_calls[PODS] == 1
    assert fake.open_watches[REPLICASETS] == 1
    assert await manager.resource_info("", "v1", "nosuch") is None
    await manager.stop()
    assert fake.open_watches[PODS] == 0
