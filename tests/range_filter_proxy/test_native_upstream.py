"""Detecting a native KEP-5866 upstream: the probe, ``/readyz?verbose`` and the metric.

The proxy lists one object with a whole-space ``shardSelector`` once a watch
cache has synced; an upstream that answers with ``metadata.shardInfo`` filters
by shard itself (kube-apiserver with ``ShardedListAndWatch``). The proxy still
filters from its own cache either way: this only reports.
"""

from __future__ import annotations

import re

import httpx

from hashing import parse_shard_selector
from range_filter_proxy import CacheSettings, create_app
from tests.range_filter_proxy.fakes import PODS, FakeUpstream
from tests.range_filter_proxy.helpers import async_test, eventually, serve

GAUGE = "range_filter_proxy_upstream_shard_selector_supported"


def _settings() -> CacheSettings:
    return CacheSettings(relist_backoff_initial=0.05, relist_backoff_max=0.2)


def _gauge(app: object) -> float | None:
    return app.state.proxy.metrics.registry.get_sample_value(GAUGE)  # type: ignore[attr-defined,no-any-return]


async def _probed(client: httpx.AsyncClient) -> str:
    """Touch the pods cache, wait until the probe answered, return ``/readyz?verbose``."""
    assert (await client.get("/api/v1/pods")).status_code == 200

    async def done() -> bool:
        text = (await client.get("/readyz", params={"verbose": ""})).text
        return "not probed yet" not in text

    await eventually(done, what="the shardSelector probe")
    return (await client.get("/readyz", params={"verbose": ""})).text


@async_test()
async def test_native_upstream_is_reported_in_readyz_and_metrics() -> None:
    fake = FakeUpstream()
    fake.native_shard_selector = True
    fake.create(PODS, "a")
    app = create_app(fake, settings=_settings())
    async with serve(app) as url, httpx.AsyncClient(base_url=url) as client:
        text = await _probed(client)
        assert re.search(r"^\[\+\]upstream-shard-selector ok: supported: native KEP-5866", text, re.M), text
        assert text.rstrip().endswith("readyz check passed")
        assert _gauge(app) == 1.0
        scraped = (await client.get("/metrics")).text
        assert f"{GAUGE} 1.0" in scraped
        # One probe, whole space, canonical bounds (a real server refuses any other spelling).
        assert len(fake.shard_selector_lists) == 1
        probe = fake.shard_selector_lists[0]
        assert probe == "shardRange(object.metadata.uid, '0x0000000000000000', '0x10000000000000000')"
        assert parse_shard_selector(probe) is not None
        # Touching another resource does not probe again.
        assert (await client.get("/api/v1/namespaces/default/pods")).status_code == 200
        assert len(fake.shard_selector_lists) == 1
        # The plain /readyz stays the one-word answer probes expect.
        plain = await client.get("/readyz")
        assert plain.status_code == 200 and plain.text == "ok"


@async_test()
async def test_upstream_that_ignores_the_selector_is_reported_unsupported() -> None:
    fake = FakeUpstream()  # answers the probe without metadata.shardInfo, like a server without the gate
    app = create_app(fake, settings=_settings())
    async with serve(app) as url, httpx.AsyncClient(base_url=url) as client:
        assert _gauge(app) == 0.0  # known before the probe: 0 means "not (yet) known to be native"
        text = await _probed(client)
        assert "[+]upstream-shard-selector ok: not supported: the upstream answered a list of pods without" in text
        assert _gauge(app) == 0.0
        # The proxy still filters: a selector request gets shardInfo from the proxy itself.
        sel = "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
        listed = (await client.get("/api/v1/pods", params={"shardSelector": sel})).json()
        assert listed["metadata"]["shardInfo"] == {"selector": sel}


@async_test()
async def test_upstream_that_refuses_the_selector_is_reported_unsupported() -> None:
    fake = FakeUpstream()
    fake.refuse_shard_selector = 400
    app = create_app(fake, settings=_settings())
    async with serve(app) as url, httpx.AsyncClient(base_url=url) as client:
        text = await _probed(client)
        assert "not supported: the upstream refused a list of pods with a shardSelector (400" in text
        assert _gauge(app) == 0.0
        # A refused probe does not make the proxy unready, nor the caches unusable.
        assert (await client.get("/readyz")).status_code == 200
        assert (await client.get("/api/v1/pods")).status_code == 200


@async_test()
async def test_transient_probe_errors_are_retried() -> None:
    fake = FakeUpstream()
    fake.native_shard_selector = True
    fake.refuse_shard_selector = 503
    app = create_app(fake, settings=_settings())
    async with serve(app) as url, httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/api/v1/pods")).status_code == 200
        await eventually(lambda: len(fake.shard_selector_lists) >= 2, what="a retried probe")
        assert "not probed yet" in (await client.get("/readyz", params={"verbose": "1"})).text
        fake.refuse_shard_selector = None
        await eventually(lambda: _gauge(app) == 1.0, what="the probe succeeding after the upstream recovered")
