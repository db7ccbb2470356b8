"""The store index by shard hash (issue 27): a range select answers what the scan answers, visiting its slice only.

* Property: after any sequence of upstream events (added, modified with the
  owner moving to another uid, to none or from none, deleted, a deletion at a
  stale RV, both the fast wire decoder's and the general path) and relists, a
  select with any filter (shard terms over any path and range, bounds on and
  next to the objects' hashes, namespace, labels) returns exactly the
  objects the brute-force scan returns, in the same order. Selects come
  between the events, so each path's buckets are built mid-stream and then
  kept up to date.
* A 1/64 range of 8,192 pods looks at ~1/64 of the store (a scan would look
  at every object), on the uid and on the owner path.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from hashing import NAMESPACE_PATH, OWNER_PATH, UID_PATH, ShardRange, ShardSelector, fnv1a_64
from range_filter_proxy.cache import WatchCache
from range_filter_proxy.cached import CachedObject, CacheSettings, WatchFilter
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.upstream import ListResult
from range_filter_proxy.watchstream import WatchEvent, decode_watch_line
from rangeshard.core.selectors import parse_label_selector
from tests.range_filter_proxy.fakes import INFOS, PODS, FakeUpstream

POD = INFOS[PODS]
_SPACE = 1 << 64
#: uids as the API server makes them (UUIDs): ``uid-1``, ``uid-2``... share their top hash bits, so one bucket.
_UIDS = [str(uuid.uuid5(uuid.NAMESPACE_DNS, f"pod-{i}")) for i in range(24)]
_NAMESPACES = ["default", "kube-system", None]  # in different buckets; None: no namespace (no namespace hash)
_NAMES = ["p0", "p1", "p2"]  # few keys: most events replace a stored object
#: Bounds on and next to the hashes the objects can have (the edges of ranges), and sixteenths of the space.
_NEAR = sorted(
    {max(0, min(_SPACE, fnv1a_64(v) + d)) for v in [*_UIDS, "default", "kube-system"] for d in (-1, 0, 1)}
    | {k * (_SPACE // 16) for k in range(17)}
)


def _pod(name: str, ns: str | None, uid: str | None, owner: str | None, rv: int, app: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": str(rv), "labels": {"app": app}}
    if ns is not None:
        meta["namespace"] = ns
    if uid is not None:
        meta["uid"] = uid
    if owner is not None:
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": "rs", "uid": owner, "controller": True}]
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "status": {"phase": "Running"}}


# Mostly meaningful bounds: hypothesis draws integers near 0 and the edges, ranges holding no object.
_BOUND = st.sampled_from(_NEAR) | st.sampled_from(_NEAR) | st.integers(0, _SPACE)


def _term(path: str, a: int, b: int) -> ShardRange:
    lo, hi = min(a, b), max(a, b)
    if lo == hi:
        lo, hi = (lo - 1, lo) if lo == _SPACE else (lo, lo + 1)
    return ShardRange(path, lo, hi)


_TERM = st.builds(_term, st.sampled_from([UID_PATH, OWNER_PATH, NAMESPACE_PATH]), _BOUND, _BOUND)
_FILTER = st.builds(
    lambda ns, labels, terms: WatchFilter(
        ns, parse_label_selector(labels), shard=ShardSelector(tuple(terms)) if terms else None
    ),
    st.none() | st.sampled_from(["default", "kube-system"]),
    st.sampled_from([None, None, "app=a"]),
    st.lists(_TERM, max_size=3),
)
_OBJECT = st.tuples(
    st.sampled_from(_NAMES),
    st.sampled_from(_NAMESPACES),
    st.none() | st.sampled_from(_UIDS),
    st.none() | st.sampled_from(_UIDS),
    st.sampled_from(["a", "b"]),
)
_EVENT = st.tuples(st.sampled_from(["ADDED", "MODIFIED", "MODIFIED", "DELETED"]), _OBJECT, st.booleans())
_SELECT = st.tuples(st.just("SELECT"), _FILTER)
_OP = st.one_of(
    _EVENT,
    _SELECT,
    _EVENT,
    _SELECT,
    st.tuples(st.just("STALE_DELETE"), st.sampled_from(_NAMES), st.sampled_from(_NAMESPACES)),
    st.tuples(st.just("RELIST"), st.lists(_OBJECT, max_size=9)),
)


def _scan(cache: WatchCache, f: WatchFilter) -> list[CachedObject]:
    """The definition: every object of the store that passes the filter, by key."""
    return sorted((o for o in cache.objects.values() if f.matches(o)), key=lambda o: o.key)


def _check(cache: WatchCache, f: WatchFilter) -> None:
    got = cache.select(f)
    want = _scan(cache, f)
    assert [o.key for o in got] == [o.key for o in want], f
    assert all(a is b for a, b in zip(got, want, strict=True)), f"not the stored objects: {f}"


@settings(max_examples=200, deadline=None)
@given(st.lists(_OP, max_size=60), st.lists(_FILTER, min_size=1, max_size=4))
def test_select_equals_the_scan_after_any_events_and_relists(ops: list[Any], finals: list[WatchFilter]) -> None:
    cache = WatchCache(POD, FakeUpstream(), ProxyMetrics(), CacheSettings())
    cache.replace(ListResult([], "1"))
    rv = 1
    for op in ops:
        kind = op[0]
        if kind == "SELECT":
            _check(cache, op[1])
        elif kind == "RELIST":
            rv += 1
            items = {(o[1] or "", o[0]): _pod(*o[:4], rv=rv, app=o[4]) for o in op[1]}
            cache.replace(ListResult(list(items.values()), str(rv)))
        elif kind == "STALE_DELETE":
            # A deletion reported with the object's last RV (<= the cache's): applied at the cache's RV.
            stored = cache.objects.get((op[2] or "", op[1]))
            if stored is not None:
                cache.apply(WatchEvent("DELETED", orjson.loads(stored.raw)))
                assert (op[2] or "", op[1]) not in cache.objects
        else:
            rv += 1
            name, ns, uid, owner, app = op[1]
            obj = _pod(name, ns, uid, owner, rv, app)
            if op[2]:  # kube-apiserver's encoding: the fast wire decoder's path
                cache.apply(decode_watch_line(orjson.dumps({"type": kind, "object": obj}) + b"\n", "test"))
            else:
                cache.apply(WatchEvent(kind, obj))
    for f in finals:
        _check(cache, f)
    for path in (UID_PATH, OWNER_PATH, NAMESPACE_PATH):  # the whole space: each object once
        _check(cache, WatchFilter(shard=ShardSelector((ShardRange(path, 0, _SPACE),))))


def _slice(path: str, i: int, parts: int) -> WatchFilter:
    step = _SPACE // parts
    return WatchFilter(shard=ShardSelector((ShardRange(path, i * step, (i + 1) * step),)))


def test_a_range_select_looks_at_its_slice_only() -> None:
    n = 8192
    cache = WatchCache(POD, FakeUpstream(), ProxyMetrics(), CacheSettings())
    owners = [str(uuid.uuid4()) for _ in range(n // 2)]  # two pods per ReplicaSet
    pods = [_pod(f"p{i}", f"ns-{i % 4}", str(uuid.uuid4()), owners[i // 2], 2, "a") for i in range(n)]
    cache.replace(ListResult(pods, "2"))
    for path in (UID_PATH, OWNER_PATH):
        total = 0
        examined = 0
        for i in range(64):
            f = _slice(path, i, 64)
            before = cache.stats.select_examined
            got = cache.select(f)
            examined = max(examined, cache.stats.select_examined - before)
            assert [o.key for o in got] == [o.key for o in _scan(cache, f)]
            total += len(got)
        assert total == n, path  # the slices partition the store
        # ~n/64 = 128 matching, plus at most the keys of the buckets it shares with its neighbours.
        assert examined < n // 16, (path, examined)
    # Without a shard range the scan stays: every object is looked at.
    before = cache.stats.select_examined
    cache.select(WatchFilter(namespace="ns-1"))
    assert cache.stats.select_examined - before == n
