"""The dispatch index (issue 17) never hides an event from a watcher that wants it.

* Property: for any set of filters (shard selectors over any path, with any
  ranges, with or without namespace/label/field parts, or none) and any pair
  of object versions, every watcher whose filter gives the event a variant is
  among the index's candidates, each candidate once.
* Through the cache: 16 range watchers plus a namespace watcher and an
  unfiltered one receive exactly what the plain definition gives them.
* Updates that keep labels and hashes share them with the previous version.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from hashing import NAMESPACE_PATH, OWNER_PATH, UID_PATH, ShardRange, ShardSelector
from range_filter_proxy.cache import WatchCache
from range_filter_proxy.cached import CachedEvent, CachedObject, CacheSettings, WatchFilter
from range_filter_proxy.dispatch import DispatchIndex
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.upstream import ListResult
from range_filter_proxy.watcher import Watcher
from range_filter_proxy.watchstream import WatchEvent
from rangeshard.core.selectors import parse_field_selector, parse_label_selector
from tests.range_filter_proxy.fakes import INFOS, PODS, FakeUpstream
from tests.range_filter_proxy.helpers import async_test
from tests.range_filter_proxy.test_hot_path import _VERSION, _version

POD = INFOS[PODS]
_SPACE = 1 << 64


@dataclass(eq=False)
class _Stub:
    """What the index reads of a watcher: its filter."""

    filter: WatchFilter


_BOUND = st.integers(0, _SPACE)
_PATH = st.sampled_from([UID_PATH, OWNER_PATH, NAMESPACE_PATH])
_TERM = st.builds(
    lambda path, a, b: ShardRange(path, min(a, b), max(a, b) + (1 if a == b else 0)) if min(a, b) < _SPACE else None,
    _PATH,
    _BOUND,
    _BOUND,
) | st.builds(  # quarters of the space: the sampled uids fall in several of them
    lambda path, q: ShardRange(path, q * (_SPACE // 4), (q + 1) * (_SPACE // 4)), _PATH, st.integers(0, 3)
)
_SHARD = st.none() | st.lists(_TERM, min_size=1, max_size=3).map(
    lambda terms: ShardSelector(tuple(t for t in terms if t is not None)) if any(terms) else None
)
_FILTER = st.builds(
    lambda ns, labels, fields, shard: WatchFilter(
        ns, parse_label_selector(labels), parse_field_selector(fields), shard
    ),
    st.none() | st.sampled_from(["ns1", "ns2"]),
    st.sampled_from([None, None, "app=a"]),
    st.sampled_from([None, None, "status.phase=Running"]),
    _SHARD,
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_FILTER, min_size=1, max_size=8),
    _VERSION,
    st.none() | _VERSION,
    st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
)
def test_every_interested_watcher_is_a_candidate(
    filters: list[WatchFilter], cur_v: dict[str, Any], prev_v: dict[str, Any] | None, etype: str
) -> None:
    watchers = [_Stub(f) for f in filters]
    index = DispatchIndex(cast(list[Watcher], watchers))
    cur = _version("p", 20, cur_v)
    prev = _version("p", 10, prev_v) if prev_v is not None else None
    ev = CachedEvent.of(etype, 20, cur, prev, 0.0)
    candidates = index.candidates(ev)
    assert len(set(map(id, candidates))) == len(candidates), "a watcher came twice"
    wanted = [w for w in watchers if w.filter.variant(ev) is not None]
    assert {id(w) for w in wanted} <= {id(w) for w in candidates}
    assert index.size == len(watchers)


def _pod(i: int, rv: int, phase: str = "Running", labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta = {"name": f"p{i}", "namespace": f"ns{i % 3}", "uid": f"uid-{i}", "resourceVersion": str(rv)}
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {**meta, "labels": labels or {"app": "a" if i % 2 else "b"}},
        "status": {"phase": phase},
    }


@async_test()
async def test_cache_delivers_what_the_plain_definition_gives() -> None:
    cache = WatchCache(POD, FakeUpstream(), ProxyMetrics(), CacheSettings(watcher_queue_size=100_000))
    cache.replace(ListResult([_pod(i, 1) for i in range(64)], "1"))
    slices = [
        ShardSelector((ShardRange(UID_PATH, i * (_SPACE // 16), (i + 1) * (_SPACE // 16) if i < 15 else _SPACE),))
        for i in range(16)
    ]
    filters = [WatchFilter(shard=s) for s in slices]
    filters += [WatchFilter(namespace="ns1"), WatchFilter(), WatchFilter(labels=parse_label_selector("app=a"))]
    watchers = [
        cache.add_watcher(f, resume_from=cache.rv, bookmarks=False, initial_events_end=False, timeout=None)
        for f in filters
    ]
    expected: list[list[bytes]] = [[] for _ in watchers]
    rv = 1
    for step in range(400):
        i = (step * 7) % 64
        rv += 1
        etype = "DELETED" if step % 37 == 36 else "MODIFIED"
        labels = {"app": "a"} if step % 5 else {"app": "b"}
        obj = _pod(i, rv, "Pending" if step % 3 else "Running", labels)
        prev = cache.objects.get((f"ns{i % 3}", f"p{i}"))
        cache.apply(WatchEvent(etype, obj))
        ev = cache.history[-1]
        assert ev.prev is prev
        for k, w in enumerate(watchers):
            variant = w.filter.variant(ev)
            if variant is not None:
                expected[k].append(ev.line(variant))
    for k, w in enumerate(watchers):
        assert [line for line, _ in w.live] == expected[k], f"watcher {k}"
    assert sum(len(e) for e in expected) > 400  # every event reached at least its range watcher
    assert cache.stats.events_delivered + cache.stats.events_filtered == 400 * len(watchers)


def test_an_update_shares_unchanged_labels_and_hashes() -> None:
    first = CachedObject.build(_pod(1, 5), POD)
    store = {first.key: first}
    same = CachedObject.build(_pod(1, 6, phase="Pending"), POD, previous=store)
    assert same.labels is first.labels and same.hashes is first.hashes
    relabelled = CachedObject.build(_pod(1, 7, labels={"app": "z"}), POD, previous=store)
    assert relabelled.labels == {"app": "z"}
    # The labels are part of the hashes (``by: label``), shared with the object; the rest is unchanged.
    assert relabelled.hashes.labels is relabelled.labels and relabelled.hashes.uid == first.hashes.uid
    other = CachedObject.build(_pod(2, 8), POD, previous=store)
    assert other.labels is not first.labels and other.hashes != first.hashes


def _brute_segments(
    index_bounds: tuple[int, ...], entries: list[tuple[_Stub, list[tuple[int, int]]]]
) -> list[set[int]]:
    """The definition: segment i holds the watchers one of whose ranges contains [bounds[i-1], bounds[i])."""
    out: list[set[int]] = [set()]
    for lo, hi in pairwise(index_bounds):
        out.append({id(w) for w, ranges in entries if any(s <= lo and hi <= e for s, e in ranges)})
    out.append(set())
    return out


_RANGE = st.tuples(st.integers(0, 64), st.integers(0, 64)).map(lambda t: (min(t), max(t) + 1))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_RANGE, min_size=1, max_size=3), min_size=1, max_size=12))
def test_the_sweep_builds_the_segments_of_the_definition(ranges: list[list[tuple[int, int]]]) -> None:
    """Overlapping, touching and repeated terms of one watcher: each watcher once per segment it is in."""
    from range_filter_proxy.dispatch import _PathIndex  # noqa: PLC0415 (the private structure under test)

    entries = [(_Stub(WatchFilter()), r) for r in ranges]
    index = _PathIndex.build(UID_PATH, cast(list[tuple[Watcher, list[tuple[int, int]]]], entries))
    want = _brute_segments(index.bounds, entries)
    got = [[id(w) for w in seg] for seg in index.segments]
    assert [len(g) for g in got] == [len(set(g)) for g in got], "a watcher twice in one segment"
    assert [set(g) for g in got] == want


def test_a_thousand_disjoint_watchers_index_in_one_sweep() -> None:
    """Each of 1,000 equal slices lands in exactly one segment (the sum of the segments' sizes is linear)."""
    n = 1000
    step = _SPACE // n
    slices = [
        WatchFilter(shard=ShardSelector((ShardRange(UID_PATH, i * step, (i + 1) * step if i < n - 1 else _SPACE),)))
        for i in range(n)
    ]
    index = DispatchIndex(cast(list[Watcher], [_Stub(f) for f in slices]))
    (path_index,) = index._paths
    assert sum(len(s) for s in path_index.segments) == n
    assert all(len(s) <= 1 for s in path_index.segments)


@async_test()
async def test_watch_requests_do_not_rebuild_the_index_each(monkeypatch: Any) -> None:
    """1,000 watchers added in a row cost one index build, at the next event (was: one build per request,
    each O(watchers^2): a thousand range watchers took minutes to register)."""
    import range_filter_proxy.watchcache as cache_module  # noqa: PLC0415

    builds: list[int] = []

    class Counting(DispatchIndex):
        def __init__(self, watchers: Any) -> None:
            super().__init__(watchers)
            builds.append(self.size)

    monkeypatch.setattr(cache_module, "DispatchIndex", Counting)
    cache = WatchCache(POD, FakeUpstream(), ProxyMetrics(), CacheSettings(watcher_queue_size=100_000))
    cache.replace(ListResult([_pod(i, 1) for i in range(64)], "1"))
    n = 1000
    step = _SPACE // n
    watchers = [
        cache.add_watcher(
            WatchFilter(
                shard=ShardSelector((ShardRange(UID_PATH, i * step, (i + 1) * step if i < n - 1 else _SPACE),))
            ),
            resume_from=cache.rv,
            bookmarks=False,
            initial_events_end=False,
            timeout=None,
        )
        for i in range(n)
    ]
    builds.clear()  # the relist's empty index
    for rv in range(2, 12):
        cache.apply(WatchEvent("MODIFIED", _pod(rv % 64, rv)))
    assert builds == [n]
    assert sum(len(w.live) for w in watchers) == 10  # each event reached exactly its slice's watcher
    cache.remove_watcher(watchers[0])
    cache.remove_watcher(watchers[1])
    cache.apply(WatchEvent("MODIFIED", _pod(0, 20)))
    assert builds == [n, n - 2]
