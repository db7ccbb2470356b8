"""A resource that the upstream stops serving (a deleted CRD) is forgotten by the proxy, unless configured.

Before: the cache of a deleted CRD stayed, emptied, answering empty lists
instead of 404, relisting with backoff forever, and discovery remembered the
resource as present for good.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import pytest

from range_filter_proxy import CacheSettings, create_app
from range_filter_proxy.cache import CacheManager
from range_filter_proxy.cached import WatchFilter
from range_filter_proxy.errors import ApiError, UpstreamError
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.process import ProxyProcess
from range_filter_proxy.resources import ResourceInfo
from range_filter_proxy.upstream import ListResult
from range_filter_proxy.watchstream import WatchEvent
from rangeshard.core.rest import GVR
from tests.local_apiserver.conftest import wait_for
from tests.local_apiserver.test_crd import widget_crd
from tests.range_filter_proxy.fakes import PODS, REPLICASETS, FakeUpstream
from tests.range_filter_proxy.helpers import async_test, eventually


class RemovableUpstream(FakeUpstream):
    """The fake upstream, where a resource can be removed (its discovery entry, lists and watches: 404)."""

    def __init__(self) -> None:
        super().__init__()
        self.removed: set[GVR] = set()
        self.discovery_calls = 0
        self.refused_lists = 0

    async def discover(self, group: str, version: str) -> dict[str, ResourceInfo]:
        self.discovery_calls += 1
        found = await super().discover(group, version)
        return {name: info for name, info in found.items() if info.gvr not in self.removed}

    async def list(self, gvr: GVR, params: Mapping[str, str] | None = None) -> ListResult:
        if gvr in self.removed:
            self.refused_lists += 1
            raise UpstreamError(f"{gvr.label}: the server could not find the requested resource", 404)
        return await super().list(gvr, params)

    async def watch(self, gvr: GVR, resource_version: str) -> AsyncIterator[WatchEvent]:
        if gvr in self.removed:
            raise UpstreamError(f"{gvr.label}: the server could not find the requested resource", 404)
        async for event in super().watch(gvr, resource_version):
            yield event

    def remove(self, gvr: GVR) -> None:
        self.removed.add(gvr)
        self.disconnect(gvr, UpstreamError("watch ended: resource removed", 404))


def _fast() -> CacheSettings:
    return CacheSettings(relist_backoff_initial=0.01, relist_backoff_max=0.05, sync_timeout=5)


@async_test()
async def test_an_on_demand_cache_is_forgotten_when_its_resource_goes_away() -> None:
    fake = RemovableUpstream()
    fake.create(REPLICASETS, "rs-1")
    manager = CacheManager(fake, ProxyMetrics(), _fast())
    info = await manager.resource_info("apps", "v1", "replicasets")
    assert info is not None
    cache = manager.cache_for(info)
    await cache.wait_synced()
    w = cache.add_watcher(cache_filter(), resume_from=cache.rv, bookmarks=False, initial_events_end=False, timeout=None)
    fake.remove(REPLICASETS)
    await eventually(lambda: cache.gone, what="the cache noticed the resource is gone")
    assert w.closed and w.close_reason == "resource no longer served by the upstream"
    assert REPLICASETS not in manager.caches and cache.objects == {}
    with pytest.raises(ApiError) as e:
        await cache.wait_synced()
    assert e.value.code == 404
    # Discovery was forgotten too: the next lookup asks the upstream and finds nothing.
    calls = fake.discovery_calls
    assert await manager.resource_info("apps", "v1", "replicasets") is None
    assert fake.discovery_calls == calls + 1
    # Back (the CRD created again): a new cache, synced from the upstream.
    fake.removed.clear()
    info = await manager.resource_info("apps", "v1", "replicasets", fresh_miss=True)
    assert info is not None
    again = manager.cache_for(info)
    assert again is not cache
    await again.wait_synced()
    assert [o.name for o in again.objects.values()] == ["rs-1"]
    await manager.stop()


@async_test()
async def test_a_configured_cache_stays_and_relists_until_its_resource_is_back() -> None:
    fake = RemovableUpstream()
    fake.create(PODS, "p-1")
    manager = CacheManager(fake, ProxyMetrics(), _fast())
    manager.start_configured([("pods", "v1", "")])
    await eventually(lambda: manager.ready()[0], what="configured cache synced")
    cache = manager.caches[PODS]
    fake.remove(PODS)
    await eventually(lambda: fake.refused_lists >= 3, what="relisting")
    assert manager.caches.get(PODS) is cache and not cache.gone
    fake.removed.clear()
    fake.create(PODS, "p-2")
    await eventually(lambda: {o.name for o in cache.objects.values()} == {"p-1", "p-2"}, what="back")
    await manager.stop()


@async_test(timeout=60)
async def test_http_a_deleted_resource_is_passed_through_again() -> None:
    """Through the app: served from the cache while it exists; afterwards the upstream's own answer."""
    fake = RemovableUpstream()
    fake.create(REPLICASETS, "rs-1")
    app = create_app(fake, settings=_fast())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        resp = await client.get("/apis/apps/v1/replicasets")
        assert resp.status_code == 200 and [i["metadata"]["name"] for i in resp.json()["items"]] == ["rs-1"]
        manager = app.state.proxy.manager
        fake.remove(REPLICASETS)
        await eventually(lambda: REPLICASETS not in manager.caches, what="cache forgotten")
        resp = await client.get("/apis/apps/v1/replicasets")
        # Passed through now (the in-memory upstream has no pass-through: 404, as a real upstream answers).
        assert resp.status_code == 404 and resp.json()["kind"] == "Status"


def cache_filter() -> WatchFilter:
    return WatchFilter()


def test_real_upstream_a_deleted_crd_is_404_through_the_proxy(proxy: ProxyProcess, local_apiserver: Any) -> None:
    """The `rangeshard proxy` process in front of the local API server: create a CRD, read it, delete it."""
    group = f"t{uuid.uuid4().hex[:8]}.example.com"
    everything = "shardRange(object.metadata.uid, '0x0000000000000000', '0x10000000000000000')"
    with (
        httpx.Client(base_url=local_apiserver.url, timeout=10) as api,
        httpx.Client(base_url=proxy.url, timeout=10) as via_proxy,
    ):
        resp = api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=widget_crd(group))
        assert resp.status_code == 201, resp.text
        wait_for(lambda: api.get(f"/apis/{group}/v1/widgets").status_code == 200, timeout=10, what="CRD served")
        obj = {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": {"color": "red"}}
        assert api.post(f"/apis/{group}/v1/namespaces/default/widgets", json=obj).status_code == 201
        listed = via_proxy.get(f"/apis/{group}/v1/widgets", params={"shardSelector": everything})
        assert listed.status_code == 200, listed.text
        assert listed.json()["metadata"]["shardInfo"]["selector"] == everything
        assert [i["metadata"]["name"] for i in listed.json()["items"]] == ["w1"]
        assert api.delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.{group}").status_code in (
            200,
            202,
        )
        # Until the proxy noticed, a list may still come from its cache; then it is the upstream's 404.
        wait_for(
            lambda: via_proxy.get(f"/apis/{group}/v1/widgets", params={"shardSelector": everything}).status_code == 404,
            timeout=20,
            what="the proxy answers 404 for the deleted CRD's resource",
        )
