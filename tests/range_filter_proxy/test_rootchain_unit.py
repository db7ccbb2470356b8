"""Placement by owner chain in the watch cache, against the in-memory fake of our ``Upstream`` interface.

The order of a move in the dependent's stream (held until that stream reaches
the intermediate's resourceVersion, or the hold runs out), the nearest known
owner, cycles and the chain bound, and a second chain refused.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from hashing import (
    MAX_CHAIN,
    MAX_HASH,
    HashRange,
    fnv1a_64,
    hash_key,
    parse_shard_selector,
    range_to_selector,
    root_path,
)
from range_filter_proxy.cache import CacheManager, WatchCache
from range_filter_proxy.cached import CacheSettings, WatchFilter
from range_filter_proxy.errors import ApiError
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.resources import ResourceInfo
from range_filter_proxy.rootchain import RootChain
from range_filter_proxy.watcher import Watcher
from tests.range_filter_proxy.fakes import INFOS, PODS, REPLICASETS, FakeUpstream, uid_in_lower_half
from tests.range_filter_proxy.helpers import async_test, eventually

VIA = ("replicasets.apps",)
PATH = root_path(VIA)
LOWER = WatchFilter(shard=parse_shard_selector(range_to_selector(HashRange(0, MAX_HASH // 2), PATH)))
UPPER = WatchFilter(shard=parse_shard_selector(range_to_selector(HashRange(MAX_HASH // 2 + 1, MAX_HASH), PATH)))
D_LO, D_HI = uid_in_lower_half(True, "d"), uid_in_lower_half(False, "d")


def _lower(uid: str) -> bool:
    return fnv1a_64(uid) < 1 << 63


async def _chained(fake: FakeUpstream, hold: float = 30.0) -> tuple[CacheManager, WatchCache, WatchCache]:
    manager = CacheManager(fake, ProxyMetrics(), CacheSettings())
    pods = manager.cache_for(INFOS[PODS])
    await pods.wait_synced()
    await manager.ensure_chain(pods, VIA)
    assert pods.chain is not None
    pods.chain.hold_seconds = hold
    rs = manager.caches[REPLICASETS]
    await eventually(lambda: fake.open_watches[PODS] == 1 and fake.open_watches[REPLICASETS] == 1)
    return manager, pods, rs


def _watch(cache: WatchCache, filt: WatchFilter) -> Watcher:
    return cache.add_watcher(filt, resume_from=cache.rv, bookmarks=False, initial_events_end=False, timeout=None)


async def _take(w: Watcher, n: int, timeout: float = 5.0) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    stream = w.stream()

    async def run() -> None:
        async for chunk in stream:
            for line in chunk.splitlines():
                ev = orjson.loads(line)
                meta = ev["object"]["metadata"]
                out.append((ev["type"], meta.get("name", ""), int(meta["resourceVersion"])))
                if len(out) >= n:
                    return

    try:
        await asyncio.wait_for(run(), timeout)
    finally:
        await stream.aclose()
    return out


def _names(cache: WatchCache, filt: WatchFilter) -> set[str]:
    return {o.name for o in cache.select(filt)}


@async_test()
async def test_a_move_waits_for_the_dependents_stream_and_comes_before_its_next_event() -> None:
    fake = FakeUpstream()
    fake.create(REPLICASETS, "r", uid="r-uid", owner_uid=D_LO)
    fake.create(PODS, "p", owner_uid="r-uid")
    manager, pods, rs = await _chained(fake)
    try:
        assert _names(pods, LOWER) == {"p"} and _names(pods, UPPER) == set()
        lo, hi = _watch(pods, LOWER), _watch(pods, UPPER)
        before = pods.rv
        fake.update(REPLICASETS, "r", owner_uid=D_HI)  # re-parented at rv N
        moved_at = fake.rv
        await eventually(lambda: rs.rv == moved_at, what="the ReplicaSet event applied")
        # The pods' stream has not reached N: the move waits (lists still show the old placement at the old RV).
        assert pods.chain is not None and len(pods.chain.pending) == 1
        assert pods.rv == before and _names(pods, LOWER) == {"p"}
        fake.create(PODS, "q", owner_uid="r-uid")  # the pods' next event, after N
        assert await _take(lo, 1) == [("DELETED", "p", moved_at)]
        assert await _take(hi, 2) == [("ADDED", "p", moved_at), ("ADDED", "q", fake.rv)]
        assert _names(pods, LOWER) == set() and _names(pods, UPPER) == {"p", "q"}
        assert (
            manager.metrics.registry.get_sample_value("range_filter_proxy_root_moves_total", {"resource": "pods"}) == 1
        )
    finally:
        await manager.stop()


@async_test()
async def test_a_bookmark_releases_a_move_and_the_hold_bounds_the_wait() -> None:
    fake = FakeUpstream()
    fake.create(REPLICASETS, "r", uid="r-uid", owner_uid=D_LO)
    fake.create(PODS, "p", owner_uid="r-uid")
    manager, pods, rs = await _chained(fake)
    try:
        hi = _watch(pods, UPPER)
        fake.update(REPLICASETS, "r", owner_uid=D_HI)
        first = fake.rv
        await eventually(lambda: rs.rv == first)
        fake.bookmark(PODS)
        assert await _take(hi, 1) == [("ADDED", "p", first)]
        assert pods.rv == first
        # Without bookmarks or events of the pods, the hold runs out: the move is filed at its RV anyway.
        assert pods.chain is not None
        pods.chain.hold_seconds = 0.05
        lo = _watch(pods, LOWER)
        fake.bump()  # other resources' writes: the pods' stream has not seen these RVs
        fake.bump()
        fake.update(REPLICASETS, "r", owner_uid=D_LO)
        second = fake.rv
        assert await _take(lo, 1) == [("ADDED", "p", second)]
        assert pods.rv == second
        # An event of the pods older than that move, arriving late, is filed at the cache's RV and counted.
        lo = _watch(pods, LOWER)  # (a stream read by _take ends with it)
        fake.rv = second - 2
        fake.create(PODS, "late", owner_uid="r-uid")  # at second - 1
        fake.rv = second
        assert await _take(lo, 1) == [("ADDED", "late", second - 1)]
        await eventually(
            lambda: (
                manager.metrics.registry.get_sample_value(
                    "range_filter_proxy_root_late_events_total", {"resource": "pods"}
                )
                == 1
            )
        )
        assert _names(pods, LOWER) == {"p", "late"}
    finally:
        await manager.stop()


@async_test()
async def test_nearest_known_owner_until_the_intermediate_appears() -> None:
    fake = FakeUpstream()
    rs_uid = "rs-late"
    fake.create(PODS, "p", owner_uid=rs_uid)  # its ReplicaSet is not (yet) cached: placed by that owner
    manager, pods, _ = await _chained(fake)
    try:
        lower = _lower(rs_uid)
        assert _names(pods, LOWER if lower else UPPER) == {"p"}
        d = D_HI if lower else D_LO  # a Deployment on the other side
        fake.create(REPLICASETS, "r", uid=rs_uid, owner_uid=d)
        fake.bookmark(PODS)
        await eventually(lambda: _names(pods, UPPER if lower else LOWER) == {"p"}, what="moved to the Deployment")
        fake.delete(REPLICASETS, "r")  # gone again: back to the nearest known owner
        fake.bookmark(PODS)
        await eventually(lambda: _names(pods, LOWER if lower else UPPER) == {"p"}, what="moved back")
    finally:
        await manager.stop()


@async_test()
async def test_cycles_and_long_chains_stop_at_the_bound() -> None:
    fake = FakeUpstream()
    fake.create(REPLICASETS, "a", uid="a", owner_uid="b")
    fake.create(REPLICASETS, "b", uid="b", owner_uid="a")
    fake.create(PODS, "in-cycle", owner_uid="a")
    chain = [f"c{i}" for i in range(MAX_CHAIN + 3)]
    for i, uid in enumerate(chain[:-1]):
        fake.create(REPLICASETS, uid, uid=uid, owner_uid=chain[i + 1])
    fake.create(PODS, "deep", owner_uid=chain[0])
    manager, pods, _ = await _chained(fake)
    try:
        resolver = pods.chain
        assert resolver is not None
        assert resolver.root_uid("p", "a") in ("a", "b")  # a cycle ends, at one of its uids
        assert resolver.root_uid("p", chain[0]) == chain[MAX_CHAIN - 1]  # 8 owners followed, no more
        both = _names(pods, LOWER) | _names(pods, UPPER)
        assert both == {"in-cycle", "deep"} and not _names(pods, LOWER) & _names(pods, UPPER)
    finally:
        await manager.stop()


@async_test()
async def test_a_second_chain_for_one_resource_is_refused() -> None:
    fake = FakeUpstream()
    manager, pods, _ = await _chained(fake)
    try:
        with pytest.raises(ApiError, match="a second chain") as e:
            await manager.ensure_chain(pods, ())
        assert e.value.code == 400
        await manager.ensure_chain(pods, VIA)  # the same chain again: fine
    finally:
        await manager.stop()


def test_root_path_grammar() -> None:
    assert root_path(["replicasets.v1.apps", "jobs.batch", "replicasets.apps"]) == (
        "object.metadata.ownerReferences.root(jobs.batch,replicasets.apps).uid"
    )
    sel = parse_shard_selector(range_to_selector(HashRange(0, MAX_HASH), root_path(VIA)))
    assert str(sel).startswith("shardRange(object.metadata.ownerReferences.root(replicasets.apps).uid, ")
    for bad in ("root(b,a)", "root(a,a)", "root(A)", "root()"):
        with pytest.raises(ValueError, match="unsupported path"):
            parse_shard_selector(f"shardRange(object.metadata.ownerReferences.{bad}.uid, '0x{0:016x}', '0x{1:016x}')")


class _Via:
    """A via cache as far as the fence's chain needs one: what kind it holds."""

    def __init__(self, info: ResourceInfo) -> None:
        self.info = info


def _obj(uid: str, owner: tuple[str, str, str] | None = None) -> dict[str, Any]:
    """An object with ``uid`` and a controller owner ``(apiVersion, kind, name)`` whose uid is its name."""
    if owner is None:
        return {"metadata": {"uid": uid}}
    ref = {"apiVersion": owner[0], "kind": owner[1], "name": owner[2], "uid": owner[2], "controller": True}
    return {"metadata": {"uid": uid, "ownerReferences": [ref]}}


@async_test()
async def test_the_fences_chain_reads_each_intermediate_from_the_upstream() -> None:
    """The fence's root: the same chain as the caches' (own uid, other kinds, nearest known owner, bounds), read now."""
    chain = RootChain(_Via(INFOS[PODS]), VIA, [_Via(INFOS[REPLICASETS])])  # type: ignore[arg-type]
    upstream: dict[str, dict[str, Any]] = {}
    reads: list[tuple[str | None, str]] = []

    async def read(info: ResourceInfo, namespace: str | None, name: str) -> dict[str, Any] | None:
        assert info is INFOS[REPLICASETS]
        reads.append((namespace, name))
        return upstream.get(name)

    async def key(obj: dict[str, Any]) -> int | None:
        reads.clear()
        return await chain.fresh_key_of_object(obj, "ns", read)

    rs = ("apps/v1", "ReplicaSet", "r")
    assert await key(_obj("p")) == hash_key("p") and reads == []  # no owner: its own uid
    assert await key({"metadata": {}}) is None  # a body naming neither
    assert await key(_obj("p", ("apps/v1", "Deployment", "d"))) == hash_key("d") and reads == []  # not a via kind
    assert await key(_obj("p", ("v1", "ReplicaSet", "r"))) == hash_key("r") and reads == []  # core has none
    assert await key(_obj("p", rs)) == hash_key("r") and reads == [("ns", "r")]  # not upstream: nearest owner
    upstream["r"] = _obj("r", ("apps/v1", "Deployment", "d1"))
    assert await key(_obj("p", rs)) == hash_key("d1")
    upstream["r"] = _obj("r", ("apps/v1", "Deployment", "d2"))  # re-parented: the next write sees it at once
    assert await key(_obj("p", rs)) == hash_key("d2")
    upstream["r"] = _obj("r")  # orphaned: the ReplicaSet is the root
    assert await key(_obj("p", rs)) == hash_key("r")
    upstream["r"] = _obj("another-uid", ("apps/v1", "Deployment", "d1"))  # a new object of that name
    assert await key(_obj("p", rs)) == hash_key("r")
    reads.clear()  # a request path without a namespace: the object's own
    body = _obj("p", rs)
    body["metadata"]["namespace"] = "other"
    assert await chain.fresh_key_of_object(body, None, read) == hash_key("r") and reads == [("other", "r")]
    upstream["a"], upstream["b"] = _obj("a", ("apps/v1", "ReplicaSet", "b")), _obj("b", ("apps/v1", "ReplicaSet", "a"))
    assert await key(_obj("p", ("apps/v1", "ReplicaSet", "a"))) in (hash_key("a"), hash_key("b"))  # a cycle ends
    assert len(reads) == 2
    names = [f"c{i}" for i in range(MAX_CHAIN + 3)]
    for i, name in enumerate(names[:-1]):
        upstream[name] = _obj(name, ("apps/v1", "ReplicaSet", names[i + 1]))
    assert await key(_obj("p", ("apps/v1", "ReplicaSet", "c0"))) == hash_key(names[MAX_CHAIN - 1])  # 8 owners
    assert len(reads) == MAX_CHAIN - 1
