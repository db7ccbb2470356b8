"""The proxy's hot path after the throughput work (issue 8): same answers, fewer cycles.

* ``decode_watch_line`` keeps the upstream's object bytes only when they are
  exactly the object; the HTTP upstream splits lines as bytes across reads.
* The compiled ``WatchFilter`` predicate and the "stable modification" fast
  path choose the same event variant as the plain definition, for any filter
  and any pair of object versions (property test).
* The plain-integer metrics are exposed as ordinary counters and a histogram.
* The heap keeper freezes survivors, and a full pass reclaims a cycle that
  died while frozen.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hashing import NAMESPACE_PATH, OWNER_PATH, UID_PATH, HashRange, parse_shard_selector, range_to_selector
from range_filter_proxy.cache import WatchCache
from range_filter_proxy.cached import CachedEvent, CachedObject, CacheSettings, WatchFilter
from range_filter_proxy.errors import UpstreamError, UpstreamGone
from range_filter_proxy.heap import HeapKeeper, HeapSettings
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.upstream import HttpUpstream, UpstreamConfig
from range_filter_proxy.watchstream import WatchEvent, decode_watch_line
from rangeshard.core.selectors import parse_field_selector, parse_label_selector
from tests.range_filter_proxy.fakes import INFOS, PODS
from tests.range_filter_proxy.helpers import async_test, eventually, serve

POD = INFOS[PODS]


def _pod(name: str, rv: int, **meta: Any) -> dict[str, Any]:
    return {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "resourceVersion": str(rv), **meta}}


# ---- decoding ----------------------------------------------------------------------------------


def test_decode_keeps_exact_object_bytes_only_when_unambiguous() -> None:
    obj = orjson.dumps(_pod("a", 5, namespace="ns", uid="u1"))
    ev = decode_watch_line(b'{"type":"ADDED","object":' + obj + b"}", "w")
    assert (ev.type, ev.raw) == ("ADDED", obj)
    assert orjson.loads(ev.raw or b"") == ev.object
    # Trailing whitespace (a \r, spaces) is not part of the object.
    assert decode_watch_line(b'{"type":"MODIFIED","object":' + obj + b"}\r ", "w").raw == obj
    # Other member order, extra members, spaces: decoded, but the bytes are not reused.
    for line in (
        b'{"object":' + obj + b',"type":"ADDED"}',
        b'{"type":"ADDED","object":' + obj + b',"extra":1}',
        b'{"type": "ADDED", "object": ' + obj + b"}",
    ):
        ev = decode_watch_line(line, "w")
        assert ev.raw is None and ev.object["metadata"]["name"] == "a"


@pytest.mark.parametrize(
    ("line", "error", "text"),
    [
        (b"{not json", UpstreamError, "undecodable"),
        (b'{"type":"ADDED"}', UpstreamError, "malformed"),
        (b'{"type":"ERROR","object":{"code":410,"message":"too old"}}', UpstreamGone, "too old"),
        (b'{"type":"ERROR","object":{"code":500,"message":"boom"}}', UpstreamError, "boom"),
    ],
)
def test_decode_errors(line: bytes, error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        decode_watch_line(line, "watch pods")


def test_cached_object_reuses_raw_bytes_unless_kind_is_missing() -> None:
    obj = _pod("a", 7, namespace="ns", uid="u")
    raw = orjson.dumps(obj)
    assert CachedObject.build(obj, POD, raw).raw is raw
    bare = {"metadata": {"name": "b", "resourceVersion": "8"}}
    built = CachedObject.build(bare, POD, orjson.dumps(bare))
    assert orjson.loads(built.raw)["kind"] == "Pod"


@async_test()
async def test_http_upstream_splits_lines_across_reads() -> None:
    """Lines cut at every awkward place (mid-line, a 300 KB line in many reads, blank lines, no final newline)."""
    big = _pod("big", 11, namespace="ns", uid="ub", annotations={"blob": "x" * 300_000})
    events = [
        b'{"type":"ADDED","object":' + orjson.dumps(_pod("a", 10, namespace="ns", uid="ua")) + b"}",
        b'{"type":"ADDED","object":' + orjson.dumps(big) + b"}",
        b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"12"}}}',
        b'{"type":"DELETED","object":' + orjson.dumps(_pod("a", 13, namespace="ns", uid="ua")) + b"}",
    ]
    body = events[0] + b"\n\n" + events[1] + b"\n" + events[2] + b"\n" + events[3]
    cuts = [7, 40, 41, 1000, 70_000, 140_000, 250_000, len(body) - 3]
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            for _ in range(2):
                message = await receive()
                await send({"type": message["type"] + ".complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            await asyncio.sleep(0)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async with serve(app) as url:
        upstream = HttpUpstream(UpstreamConfig(url))
        try:
            got: list[WatchEvent] = []
            stream: AsyncIterator[WatchEvent] = upstream.watch(PODS, "9")
            async for ev in stream:
                got.append(ev)
        finally:
            await upstream.aclose()
    assert [(e.type, e.object["metadata"].get("name")) for e in got] == [
        ("ADDED", "a"),
        ("ADDED", "big"),
        ("BOOKMARK", None),
        ("DELETED", "a"),
    ]
    assert got[1].object == big and got[1].raw == orjson.dumps(big)


# ---- filters ------------------------------------------------------------------------------------

_UIDS = st.sampled_from([f"uid-{i}" for i in range(12)])
_LABELS = st.dictionaries(st.sampled_from(["app", "tier"]), st.sampled_from(["a", "b"]), max_size=2)
_VERSION = st.fixed_dictionaries(
    {
        "namespace": st.sampled_from(["ns1", "ns2"]),
        "uid": _UIDS,
        "owner": st.none() | _UIDS,
        "labels": _LABELS,
        "phase": st.sampled_from(["Running", "Pending"]),
    }
)
_HALVES = [HashRange(0, (1 << 62) - 1), HashRange(1 << 62, (1 << 63) - 1)]
_SHARD = st.none() | st.builds(
    lambda path, halves: parse_shard_selector(" || ".join(range_to_selector(h, path) for h in halves)),
    st.sampled_from([UID_PATH, OWNER_PATH, NAMESPACE_PATH]),
    st.lists(st.sampled_from(_HALVES), min_size=1, max_size=2, unique=True),
)
_FILTER = st.builds(
    lambda ns, labels, fields, shard: WatchFilter(
        ns, parse_label_selector(labels), parse_field_selector(fields), shard
    ),
    st.none() | st.sampled_from(["ns1", "ns2"]),
    st.sampled_from([None, "app=a", "tier!=b", "app"]),
    st.sampled_from([None, "status.phase=Running", "metadata.name=p"]),
    _SHARD,
)


def _version(name: str, rv: int, v: dict[str, Any]) -> CachedObject:
    meta: dict[str, Any] = {"name": name, "namespace": v["namespace"], "uid": v["uid"], "labels": v["labels"]}
    if v["owner"] is not None:
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": "rs", "uid": v["owner"], "controller": True}]
    obj = {"kind": "Pod", "apiVersion": "v1", "metadata": {**meta, "resourceVersion": str(rv)}}
    obj["status"] = {"phase": v["phase"]}
    return CachedObject.build(obj, POD)


def _reference_matches(f: WatchFilter, o: CachedObject) -> bool:
    """The definition of a match, written out without any compiled predicate."""
    if f.namespace is not None and o.namespace != f.namespace:
        return False
    if f.shard is not None and not f.shard.matches_hashes(o.hashes):
        return False
    if not f.labels.empty and not f.labels.matches(o.labels):
        return False
    return f.fields.empty or f.fields.matches(o.obj)


@settings(max_examples=400, deadline=None)
@given(_FILTER, _VERSION, st.none() | _VERSION, st.sampled_from(["ADDED", "MODIFIED", "DELETED"]))
def test_compiled_filter_and_fast_path_choose_the_defined_variant(
    f: WatchFilter, cur_v: dict[str, Any], prev_v: dict[str, Any] | None, etype: str
) -> None:
    cur = _version("p", 20, cur_v)
    prev = _version("p", 10, prev_v) if prev_v is not None else None
    ev = CachedEvent.of(etype, 20, cur, prev, 0.0)
    cur_ok = _reference_matches(f, cur)
    prev_ok = prev is not None and _reference_matches(f, prev)
    if etype == "DELETED":
        want = "DELETED" if cur_ok else None
    elif cur_ok:
        want = "MODIFIED" if prev_ok else "ADDED"
    else:
        want = "DELETED_PREV" if prev_ok else None
    assert f.matches(cur) == cur_ok
    assert f.variant(ev) == want


# ---- metrics ------------------------------------------------------------------------------------


@async_test()
async def test_plain_integer_metrics_are_exposed_as_counters_and_a_histogram() -> None:
    from tests.range_filter_proxy.fakes import FakeUpstream  # noqa: PLC0415

    fake = FakeUpstream()
    metrics = ProxyMetrics()
    cache = WatchCache(POD, fake, metrics, CacheSettings())
    cache.start()
    try:
        await cache.wait_synced()
        lower = parse_shard_selector(range_to_selector(_HALVES[0], UID_PATH))
        w = cache.add_watcher(
            WatchFilter(shard=lower), resume_from=cache.rv, bookmarks=False, initial_events_end=False, timeout=5
        )
        stream = w.stream()
        await eventually(lambda: fake.open_watches[PODS] == 1, what="upstream watch")
        for i in range(20):
            fake.create(PODS, f"p{i}")
        await eventually(lambda: cache.stats.events_received == 20, what="20 events applied")
        delivered = len(w.live)
        chunks = [await anext(stream)] if delivered else []
        await stream.aclose()
    finally:
        await cache.stop()

    def value(name: str, **labels: str) -> float:
        got = metrics.registry.get_sample_value(name, {"resource": "pods", **labels})
        assert got is not None, name
        return got

    assert value("range_filter_proxy_events_received_total") == 20
    assert value("range_filter_proxy_events_delivered_total") == delivered
    assert value("range_filter_proxy_events_filtered_total") == 20 - delivered
    assert value("range_filter_proxy_event_delivery_latency_seconds_count") == delivered
    assert value("range_filter_proxy_event_delivery_latency_seconds_bucket", le="+Inf") == delivered
    assert value("range_filter_proxy_bytes_out_total") == sum(len(c) for c in chunks)
    assert 0 < delivered < 20  # 20 random uids: both halves hit (fails with probability 2**-19)


# ---- heap keeper ---------------------------------------------------------------------------------


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_heap_keeper_freezes_survivors_and_a_full_pass_reclaims_dead_cycles() -> None:
    keeper = HeapKeeper(HeapSettings(freeze_interval=0.01, full_interval=3600))
    try:
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        alive = weakref.ref(a)
        keeper.run_pass()
        assert gc.get_freeze_count() > 0 and keeper.passes == 1
        del a, b
        gc.collect()
        assert alive() is not None, "a cycle frozen while alive is out of the collector's sight"
        keeper._last_full -= 3600  # the full interval has passed
        keeper.run_pass()
        assert alive() is None and keeper.full_passes == 1
    finally:
        asyncio.run(keeper.stop())
    assert gc.get_freeze_count() == 0


@async_test()
async def test_heap_keeper_runs_in_the_background_and_stops() -> None:
    keeper = HeapKeeper(HeapSettings(freeze_interval=0.01, full_interval=0.05))
    keeper.start()
    try:
        await eventually(lambda: keeper.passes >= 3 and keeper.full_passes >= 1, what="passes")
    finally:
        await keeper.stop()
    assert gc.get_freeze_count() == 0
    with pytest.raises(ValueError):
        HeapSettings(freeze_interval=0)
