"""The proxy's HTTP face (FastAPI app served by uvicorn) over the in-memory fake upstream."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from hashing import MAX_HASH, OWNER_PATH, HashRange, parse_shard_selector, range_to_selector
from range_filter_proxy import CacheSettings, create_app
from tests.range_filter_proxy.fakes import PODS, FakeUpstream, uid_in_lower_half
from tests.range_filter_proxy.helpers import assert_statuses, async_test, eventually, open_raw_watch, read_events, serve

LOWER = range_to_selector(HashRange(0, MAX_HASH // 2), OWNER_PATH)
UPPER = range_to_selector(HashRange(MAX_HASH // 2 + 1, MAX_HASH), OWNER_PATH)


def _fast() -> CacheSettings:
    return CacheSettings(
        bookmark_interval=0.1, consistent_read_timeout=0.2, rv_wait_timeout=0.3, history_events=5, history_seconds=0
    )


@async_test()
async def test_list_filters_by_shard_selector_and_reports_shard_info() -> None:
    fake = FakeUpstream()
    for i in range(20):
        fake.create(PODS, f"p{i}", owner_uid=f"owner-{i % 5}")
    fake.create(PODS, "orphan", namespace="other")
    async with serve(create_app(fake, settings=_fast())) as url, httpx.AsyncClient(base_url=url) as client:
        lower = (await client.get("/api/v1/pods", params={"shardSelector": LOWER})).json()
        upper = (await client.get("/api/v1/pods", params={"shardSelector": UPPER})).json()
        assert lower["kind"] == "PodList" and lower["apiVersion"] == "v1"
        assert lower["metadata"]["shardInfo"] == {"selector": LOWER}
        lo = {i["metadata"]["name"] for i in lower["items"]}
        hi = {i["metadata"]["name"] for i in upper["items"]}
        assert lo & hi == {"orphan"} and len(lo | hi) == 21
        for item in lower["items"]:
            assert parse_shard_selector(LOWER).matches(item)
        ns = (await client.get("/api/v1/namespaces/other/pods")).json()
        assert [i["metadata"]["name"] for i in ns["items"]] == ["orphan"]
        assert "shardInfo" not in ns["metadata"]
        any_rv = (await client.get("/api/v1/pods", params={"resourceVersion": "0"})).json()
        assert len(any_rv["items"]) == 21
        # the cache's list RV is the upstream's current one: a consistent read
        assert lower["metadata"]["resourceVersion"] == str(fake.rv)


@async_test()
async def test_bad_input_is_a_status_never_a_500() -> None:
    fake = FakeUpstream()
    async with serve(create_app(fake, settings=_fast())) as url, httpx.AsyncClient(base_url=url) as client:
        cases: list[tuple[dict[str, str], int, str]] = [
            (
                {"shardSelector": "shardRange(object.metadata.name, '0x0000000000000000', '0x0000000000000001')"},
                400,
                "unsupported path",
            ),
            (
                {"shardSelector": "shardRange(object.metadata.uid, '0x0000000000000005', '0x0000000000000001')"},
                400,
                "less than end",
            ),
            (
                {"shardSelector": "shardRange(object.metadata.uid, '0x0', '0x8000000000000002')"},
                400,
                'invalid shard selector: hexStart must be a 0x-prefixed 16-digit hex value, got "0x0" '
                '(did you mean "0x0000000000000000"?)',  # the real KEP-5866 server's words
            ),
            (
                {"shardSelector": "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000ABC')"},
                400,
                'did you mean "0x8000000000000abc"?',
            ),
            ({"labelSelector": "a in (b"}, 400, "label selector"),
            ({"fieldSelector": "nonsense"}, 400, "field selector"),
            ({"resourceVersion": "abc"}, 400, "invalid resource version"),
            ({"watch": "maybe"}, 400, "watch"),
            ({"resourceVersionMatch": "Exact"}, 422, "resourceVersion is provided"),
            ({"resourceVersionMatch": "Sometimes", "resourceVersion": "1"}, 422, "supported values"),
            ({"resourceVersion": "0", "resourceVersionMatch": "Exact"}, 422, "forbidden"),
            ({"watch": "1", "sendInitialEvents": "true"}, 422, "NotOlderThan"),
            (
                {"watch": "1", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"},
                422,
                "allowWatchBookmarks",
            ),
            ({"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"}, 422, "forbidden for list"),
        ]
        await assert_statuses(client, "/api/v1/pods", cases)
        resp = await client.get("/api/v1/pods", params={"resourceVersion": str(fake.rv + 1000)})
        assert resp.status_code == 504 and resp.json()["reason"] == "Timeout"
        # no pass-through in this configuration: a Status, not a 500
        resp = await client.post("/api/v1/namespaces/default/pods", content=b"{}")
        assert resp.status_code == 404 and resp.json()["kind"] == "Status"


@async_test()
async def test_watch_over_http_filters_resumes_bookmarks_and_410() -> None:
    fake = FakeUpstream()
    fake.create(PODS, "seed", owner_uid="owner-seed")
    async with serve(create_app(fake, settings=_fast())) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        listed = (await client.get("/api/v1/pods", params={"shardSelector": LOWER})).json()
        rv = listed["metadata"]["resourceVersion"]
        sel = parse_shard_selector(LOWER)
        params = {"watch": "true", "resourceVersion": rv, "shardSelector": LOWER, "allowWatchBookmarks": "true"}
        async with client.stream("GET", "/api/v1/pods", params=params) as resp:
            assert resp.status_code == 200
            lines = resp.aiter_lines()
            for i in range(10):
                fake.create(PODS, f"p{i}", owner_uid=uid_in_lower_half(i % 3 == 0, f"owner{i}"))
            expected = [f"p{i}" for i in range(10) if sel.matches(fake.objects[PODS][("default", f"p{i}")])]
            assert 0 < len(expected) < 10
            got: list[str] = []
            last_rv = rv
            while len(got) < len(expected):
                (event,) = await read_events(lines, 1)
                if event["type"] == "BOOKMARK":
                    continue
                assert event["type"] == "ADDED"
                got.append(event["object"]["metadata"]["name"])
                last_rv = event["object"]["metadata"]["resourceVersion"]
            assert got == expected
            # quiet range: bookmarks keep coming with the current RV
            fake.create(PODS, "elsewhere", owner_uid=uid_in_lower_half(False, "elsewhere"))
            target = str(fake.rv)

            async def bookmark_at_target() -> bool:
                (event,) = await read_events(lines, 1)
                return bool(event["type"] == "BOOKMARK" and event["object"]["metadata"]["resourceVersion"] == target)

            await eventually(bookmark_at_target, what="bookmark at current RV")
        # resume after reconnect from the last RV seen: nothing is lost
        fake.create(PODS, "late-lo", owner_uid=uid_in_lower_half(True, "late"))
        params["resourceVersion"] = last_rv
        async with client.stream("GET", "/api/v1/pods", params=params) as resp:
            events = [e for e in await read_events(resp.aiter_lines(), 1) if e["type"] != "BOOKMARK"]
            assert _first_names(events) == ["late-lo"]
        # after the history window moved on, the old RV gets an ERROR 410 event
        for i in range(10):
            fake.create(PODS, f"more{i}")
        await eventually(lambda: fake.list_calls[PODS] >= 1)
        async with client.stream("GET", "/api/v1/pods", params={"watch": "1", "resourceVersion": rv}) as resp:
            (event,) = await read_events(resp.aiter_lines(), 1)
            assert event["type"] == "ERROR" and event["object"]["code"] == 410


def _first_names(events: list[dict[str, Any]]) -> list[str]:
    return [e["object"]["metadata"]["name"] for e in events]


@async_test()
async def test_send_initial_events_and_legacy_initial_state() -> None:
    fake = FakeUpstream()
    for i in range(3):
        fake.create(PODS, f"p{i}")
    async with serve(create_app(fake, settings=_fast())) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        params = {
            "watch": "true",
            "sendInitialEvents": "true",
            "resourceVersionMatch": "NotOlderThan",
            "allowWatchBookmarks": "true",
        }
        async with client.stream("GET", "/api/v1/pods", params=params) as resp:
            events = await read_events(resp.aiter_lines(), 4)
        assert [e["type"] for e in events] == ["ADDED"] * 3 + ["BOOKMARK"]
        assert events[3]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
        assert events[3]["object"]["metadata"]["resourceVersion"] == str(fake.rv)
        async with client.stream("GET", "/api/v1/pods", params={"watch": "true"}) as resp:
            lines = resp.aiter_lines()
            assert _first_names(await read_events(lines, 3)) == ["p0", "p1", "p2"]
            fake.create(PODS, "p3")
            assert _first_names(await read_events(lines, 1)) == ["p3"]


@async_test()
async def test_health_ready_and_metrics() -> None:
    fake = FakeUpstream()
    app = create_app(fake, resources=["pods", "replicasets.apps"], settings=_fast())
    async with serve(app) as url, httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/healthz")).text == "ok"

        async def ready() -> bool:
            return (await client.get("/readyz")).status_code == 200

        await eventually(ready, what="readyz")
        for i in range(4):
            async with client.stream("GET", "/api/v1/pods", params={"watch": "1", "resourceVersion": "0"}) as resp:
                assert resp.status_code == 200
                fake.create(PODS, f"p{i}")
                assert len(await read_events(resp.aiter_lines(), i + 1)) == i + 1
        text = (await client.get("/metrics")).text
        assert 'range_filter_proxy_upstream_watches{resource="pods"} 1.0' in text
        assert 'range_filter_proxy_upstream_watches{resource="replicasets.apps"} 1.0' in text
        assert "range_filter_proxy_event_delivery_latency_seconds_bucket" in text
        assert fake.watch_calls[PODS] == 1

        async def lag_probed() -> bool:  # the loop-lag probe observes every 0.25 s
            text = (await client.get("/metrics")).text
            count = "range_filter_proxy_event_loop_lag_seconds_count"
            return count in text and f"{count} 0.0" not in text

        await eventually(lag_probed, what="the loop-lag probe's first observation")

        async def no_downstream_watches() -> bool:
            text = (await client.get("/metrics")).text
            return 'range_filter_proxy_downstream_watches{resource="pods"} 0.0' in text

        await eventually(no_downstream_watches, what="closed watches unregistered")


_TOKENS = st.sampled_from(
    [
        "shardRange",
        "(",
        ")",
        ",",
        "||",
        " ",
        "'",
        '"',
        "0x",
        "0x0",
        "'0x0'",
        "'0x10000000000000000'",
        "'0xffffffffffffffffff'",
        "object.metadata.uid",
        "object.metadata.namespace",
        "object.metadata.ownerReferences.controller.uid",
        "object",
        "\x00",
        "é",
        "-1",
        "%",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=80), st.lists(_TOKENS, max_size=14).map("".join)))
def test_fuzz_shard_selector_never_500(text: str) -> None:
    resp = _FUZZ.get({"shardSelector": text})
    assert resp.status_code in (200, 400), (text, resp.status_code, resp.text)
    body = resp.json()
    if resp.status_code == 400:
        assert body["kind"] == "Status" and "invalid shard selector" in body["message"]
    elif text:
        assert body["metadata"]["shardInfo"]["selector"] == text
    else:  # an empty selector is no selector
        assert "shardInfo" not in body["metadata"]


class _FuzzClient:
    """One app and event loop shared by every Hypothesis example (ASGI transport, no sockets)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.client: httpx.AsyncClient | None = None

    def get(self, query: dict[str, str]) -> httpx.Response:
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            fake = FakeUpstream()
            fake.create(PODS, "a", owner_uid="o1")
            app = create_app(fake, settings=CacheSettings(consistent_read_timeout=0.05))
            self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy")
        assert self.client is not None
        params = {"resourceVersion": "0", **query}
        return self.loop.run_until_complete(self.client.get("/api/v1/pods", params=params))

    def close(self) -> None:
        if self.loop is not None and self.client is not None:
            loop = self.loop
            loop.run_until_complete(self.client.aclose())
            for task in asyncio.all_tasks(loop):
                task.cancel()
            loop.run_until_complete(asyncio.gather(*asyncio.all_tasks(loop), return_exceptions=True))
            loop.close()
            self.loop = None


_FUZZ = _FuzzClient()

_SELECTOR_TOKENS = st.sampled_from(
    ["a", "b", "=", "==", "!=", ",", " in ", " notin ", "(", ")", "!", ">", "<", "1", "metadata.name", "\\", ".", "-"]
)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["labelSelector", "fieldSelector", "timeoutSeconds", "watch", "sendInitialEvents", "limit"]),
    st.one_of(st.text(max_size=40), st.lists(_SELECTOR_TOKENS, max_size=12).map("".join)),
)
def test_fuzz_other_list_parameters_never_500(name: str, value: str) -> None:
    params = {name: value}
    if name != "timeoutSeconds":
        # A watch that is accepted ends after a second (0 would mean the server's default, as in kube:
        # "watch=1" with timeoutSeconds=0 never ended and hung the suite).
        params["timeoutSeconds"] = "1"
    if name == "sendInitialEvents":
        params.update(watch="true", resourceVersionMatch="NotOlderThan")
    resp = _FUZZ.get(params)
    assert resp.status_code in (200, 400, 422), (params, resp.status_code, resp.text)
    if resp.status_code != 200:
        assert resp.json()["kind"] == "Status"


def teardown_module() -> None:
    _FUZZ.close()


def test_list_body_is_valid_json_with_items() -> None:
    fake = FakeUpstream()
    fake.create(PODS, "a")
    client = _FuzzClient()
    try:
        resp = client.get(
            {"shardSelector": "shardRange(object.metadata.uid, '0x0000000000000000', '0x10000000000000000')"}
        )
        doc = orjson.loads(resp.content)
        assert doc["items"][0]["metadata"]["name"] == "a"
    finally:
        client.close()


@async_test(timeout=60)
async def test_stalled_http_client_is_cut_off_while_others_keep_receiving() -> None:
    fake = FakeUpstream()
    app = create_app(fake, settings=CacheSettings(watcher_queue_size=20))
    manager = app.state.proxy.manager
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        reader, writer = await open_raw_watch(url, "/api/v1/pods?watch=true&resourceVersion=0")
        await eventually(lambda: sum(len(c.watchers) for c in manager.caches.values()) == 1, what="stalled watch open")
        blob = "x" * 100_000
        async with client.stream("GET", "/api/v1/pods", params={"watch": "1", "resourceVersion": "0"}) as resp:
            lines = resp.aiter_lines()
            await eventually(lambda: sum(len(c.watchers) for c in manager.caches.values()) == 2)
            names: list[str] = []
            for i in range(200):
                fake.create(PODS, f"p{i}", spec={"blob": blob})
                if i % 10 == 9:
                    names += _first_names(await read_events(lines, 10))
            assert names == [f"p{i}" for i in range(200)]
        cut = app.state.proxy.metrics.registry.get_sample_value(
            "range_filter_proxy_slow_watchers_cut_total", {"resource": "pods"}
        )
        assert cut == 1
        # the stalled client, once it reads again, finds a finished (chunked) response
        data = b""
        while not data.endswith(b"\r\n0\r\n\r\n"):
            chunk = await asyncio.wait_for(reader.read(1 << 20), 10)
            assert chunk, "connection closed before the response ended"
            data += chunk
        assert data.startswith(b"HTTP/1.1 200")
        writer.close()
        await writer.wait_closed()
