"""The watch cache lists its upstream in pages and keeps only one page decoded at a time (issue 27).

Listing a million pods in one response decoded every object at once (~9x its
JSON) next to the store being built; the allocator kept that peak and the
proxy stayed at ~8.5x the raw JSON per object. These tests pin the paging and
the release of each page before the next is read (weak references, no timing).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Mapping
from typing import Any

from range_filter_proxy.cache import WatchCache
from range_filter_proxy.cached import CacheSettings, WatchFilter
from range_filter_proxy.freshreads import list_upstream
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.reflector import list_pages
from range_filter_proxy.resources import GVR
from range_filter_proxy.upstream import ListResult
from rangeshard.core.reflector import LIST_PAGE_SIZE
from tests.range_filter_proxy.fakes import INFOS, PODS, FakeUpstream
from tests.range_filter_proxy.helpers import async_test


class _Item(dict[str, Any]):
    """A decoded object that can be watched with a weak reference."""


class _PagedUpstream(FakeUpstream):
    """Honours ``limit``/``continue`` (offset tokens) and records, per page, earlier pages' objects still alive."""

    def __init__(self, n: int) -> None:
        super().__init__()
        for i in range(n):
            self.objects[PODS][("ns", f"p{i:05d}")] = {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"name": f"p{i:05d}", "namespace": "ns", "uid": f"u{i}", "resourceVersion": "50"},
            }
        self.pages: list[dict[str, str]] = []
        self.alive_at_page: list[int] = []
        self._handed_out: list[weakref.ref[_Item]] = []

    async def list(self, gvr: GVR, params: Mapping[str, str] | None = None) -> ListResult:
        p = dict(params or {})
        self.pages.append(p)
        gc.collect()
        self.alive_at_page.append(sum(1 for r in self._handed_out if r() is not None))
        ordered = [o for _, o in sorted(self.objects[gvr].items())]
        limit = int(p.get("limit") or 0) or len(ordered)
        start = int(p.get("continue") or 0)
        page = [_Item(o) for o in ordered[start : start + limit]]
        self._handed_out += [weakref.ref(o) for o in page]
        more = start + limit < len(ordered)
        return ListResult(list(page), str(self.rv), str(start + limit) if more else None)


@async_test()
async def test_the_initial_list_is_read_in_pages_each_released_before_the_next() -> None:
    n = LIST_PAGE_SIZE * 2 + 7
    up = _PagedUpstream(n)
    cache = WatchCache(INFOS[PODS], up, ProxyMetrics(), CacheSettings())
    objects, rv = await list_pages(up, INFOS[PODS])
    cache.install(objects, rv)
    assert len(cache.objects) == n
    assert cache.rv == up.rv
    assert up.pages == [
        {"limit": str(LIST_PAGE_SIZE)},
        {"limit": str(LIST_PAGE_SIZE), "continue": str(LIST_PAGE_SIZE)},
        {"limit": str(LIST_PAGE_SIZE), "continue": str(2 * LIST_PAGE_SIZE)},
    ]
    assert up.alive_at_page == [0, 0, 0], "a page's decoded objects outlived it"


@async_test()
async def test_an_upstream_that_ignores_limit_answers_in_one_page() -> None:
    up = FakeUpstream()
    up.objects[PODS][("ns", "a")] = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": "a", "namespace": "ns", "uid": "ua", "resourceVersion": "7"},
    }
    objects, rv = await list_pages(up, INFOS[PODS])
    assert list(objects) == [("ns", "a")]
    assert rv == str(up.rv)
    assert up.list_calls[PODS] == 1


@async_test()
async def test_an_upstream_list_of_the_proxy_is_paged_and_keeps_only_what_passes() -> None:
    """An exact-resourceVersion list (or a consistent read the cache could not serve) lists upstream in pages
    too: the first page carries the list's own parameters, the others only their ``continue`` token (which holds
    them, as Kubernetes requires), and only the objects passing the filter are kept of each page."""
    n = LIST_PAGE_SIZE + 9
    up = _PagedUpstream(n)
    cache = WatchCache(INFOS[PODS], up, ProxyMetrics(), CacheSettings())
    wanted = {f"p{i:05d}" for i in range(0, n, 7)}
    filt = WatchFilter()
    object.__setattr__(filt, "matches", lambda o: o.key[1] in wanted)  # a filter passing every 7th pod
    chosen, rv = await list_upstream(cache, filt, {"resourceVersion": "50", "resourceVersionMatch": "Exact"})
    assert [o.key[1] for o in chosen] == sorted(wanted)
    assert rv == up.rv
    assert up.pages == [
        {"resourceVersion": "50", "resourceVersionMatch": "Exact", "limit": str(LIST_PAGE_SIZE)},
        {"limit": str(LIST_PAGE_SIZE), "continue": str(LIST_PAGE_SIZE)},
    ]
    assert up.alive_at_page == [0, 0], "a page's decoded objects outlived it"
