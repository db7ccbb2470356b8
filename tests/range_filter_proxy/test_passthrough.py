"""Pass-through and upstream configuration, against a tiny echoing HTTP upstream served by uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx
import orjson
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from range_filter_proxy import create_app
from range_filter_proxy.app import Proxy, ProxySettings
from range_filter_proxy.auth import AuthMode
from range_filter_proxy.cache import CacheManager
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.passthrough import PassThrough
from range_filter_proxy.upstream import HttpUpstream, Upstream, UpstreamConfig, load_upstream_config
from rangeshard.core.errors import ConfigError
from rangeshard.core.serving import ShutdownSignal
from tests.range_filter_proxy.helpers import async_test, eventually, serve


async def _echo(request: Request) -> Response:
    body = await request.body()
    doc = {
        "method": request.method,
        "path": request.url.path,
        "query": request.url.query,
        "authorization": request.headers.get("authorization"),
        "accept": request.headers.get("accept"),
        "body": body.decode(errors="replace"),
    }
    code = int(request.query_params.get("code", "200"))
    return Response(orjson.dumps(doc), status_code=code, media_type="application/json", headers={"X-Echo": "yes"})


async def _stream(_request: Request) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(50):
            yield f"line {i}\n".encode()

    return StreamingResponse(chunks(), media_type="text/plain")


async def _discovery(_request: Request) -> Response:
    return Response(b'{"kind":"APIResourceList","groupVersion":"v1","resources":[]}', media_type="application/json")


ECHO = Starlette(
    routes=[
        Route("/api/v1", _discovery),
        Route("/stream", _stream),
        Route("/{path:path}", _echo, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
    ]
)


@async_test()
async def test_passthrough_preserves_method_status_headers_body_and_authorization(tmp_path: Path) -> None:
    async with serve(ECHO) as upstream_url:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": upstream_url}}],
                    "users": [{"name": "u", "user": {"token": "proxy-token"}}],
                    "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "ctx",
                }
            )
        )
        config = load_upstream_config(kubeconfig=str(kubeconfig), context="ctx")
        assert config.base_url == upstream_url and config.authorization() == "Bearer proxy-token"
        async with serve(create_app(config)) as url, httpx.AsyncClient(base_url=url) as client:
            resp = await client.post(
                "/apis/x/v1/namespaces/a/things/b?code=409&dryRun=All",
                content=b'{"spec": 1}',
                headers={"Authorization": "Bearer client-token", "Accept": "application/vnd.kubernetes.protobuf"},
            )
            assert resp.status_code == 409 and resp.headers["x-echo"] == "yes"
            echoed = resp.json()
            assert echoed["method"] == "POST" and echoed["path"] == "/apis/x/v1/namespaces/a/things/b"
            assert echoed["query"] == "code=409&dryRun=All"
            assert echoed["authorization"] == "Bearer client-token"
            assert echoed["accept"] == "application/json"
            assert echoed["body"] == '{"spec": 1}'
            # no client credentials: the proxy's own (from the kubeconfig) are used
            resp = await client.delete("/api/v1/namespaces/a/pods/b")
            assert resp.status_code == 200 and resp.json()["authorization"] == "Bearer proxy-token"
            # a mixed Accept keeps its JSON alternatives only
            resp = await client.get(
                "/api/v1/namespaces/a/pods/b",
                headers={"Accept": "application/vnd.kubernetes.protobuf, application/json;as=Table;g=meta.k8s.io"},
            )
            assert resp.json()["accept"] == "application/json;as=Table;g=meta.k8s.io"
            # streamed bodies arrive whole
            async with client.stream("GET", "/stream") as streamed:
                text = "".join([chunk async for chunk in streamed.aiter_text()])
            assert text == "".join(f"line {i}\n" for i in range(50))
            # a collection of a resource unknown to discovery is passed through, not cached
            resp = await client.get("/api/v1/widgets")
            assert resp.json()["path"] == "/api/v1/widgets"


def test_upstream_config_needs_exactly_one_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_upstream_config()
    with pytest.raises(ConfigError):
        load_upstream_config("http://a", kubeconfig="b")
    with pytest.raises(ConfigError):
        load_upstream_config("ftp://a")
    with pytest.raises(ConfigError):
        load_upstream_config(kubeconfig=str(tmp_path / "missing"))


@async_test(timeout=60)
async def test_a_shard_filtered_request_is_never_passed_through_on_stale_or_failed_discovery() -> None:
    """A resource that appears within the 5 s a "not found" is remembered, and a failing discovery.

    Without a shardSelector the proxy passes such requests through (the upstream decides); with one
    it checks discovery again at once, or answers 503: an upstream without shardSelector support
    would answer it unfiltered.
    """
    state = {"widgets": False, "discovery_calls": 0, "discovery_status": 200}

    async def discovery(_request: Request) -> Response:
        state["discovery_calls"] += 1
        resources = [{"name": "widgets", "namespaced": False, "kind": "Widget", "verbs": ["list", "watch"]}]
        doc = {"kind": "APIResourceList", "groupVersion": "v1", "resources": resources if state["widgets"] else []}
        return Response(orjson.dumps(doc), status_code=int(state["discovery_status"]), media_type="application/json")

    async def widgets(request: Request) -> Response:
        if request.query_params.get("watch") in ("1", "true"):
            return Response(b"", media_type="application/json")  # an empty watch: the cache re-watches
        items = [
            {"kind": "Widget", "apiVersion": "v1", "metadata": {"name": "w", "uid": "u-w", "resourceVersion": "5"}}
        ]
        list_doc = {"kind": "WidgetList", "apiVersion": "v1", "metadata": {"resourceVersion": "5"}, "items": items}
        return Response(orjson.dumps(list_doc), media_type="application/json")

    upstream = Starlette(routes=[Route("/api/v1", discovery), Route("/api/v1/widgets", widgets)])
    everything = "shardRange(object.metadata.uid, '0x0000000000000000', '0x10000000000000000')"
    async with serve(upstream) as upstream_url, serve(create_app(upstream_url)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=20) as client:
            # Unknown: passed through (the upstream's own answer), and "not found" is remembered.
            resp = await client.get("/api/v1/widgets")
            assert resp.json()["kind"] == "WidgetList" and "shardInfo" not in resp.json()["metadata"]
            calls = state["discovery_calls"]
            state["widgets"] = True
            # Within the 5 s: a plain request still trusts the remembered answer...
            await client.get("/api/v1/widgets")
            assert state["discovery_calls"] == calls
            # ... a shard-filtered one asks again and is served, filtered, from the new cache.
            resp = await client.get("/api/v1/widgets", params={"shardSelector": everything})
            assert resp.status_code == 200, resp.text
            assert state["discovery_calls"] == calls + 1
            assert resp.json()["metadata"]["shardInfo"]["selector"] == everything
            assert [i["metadata"]["name"] for i in resp.json()["items"]] == ["w"]
        # A failing discovery: 503 for a shard-filtered request, pass-through otherwise.
        state["discovery_status"] = 500
        async with serve(create_app(upstream_url)) as url2, httpx.AsyncClient(base_url=url2, timeout=20) as client:
            resp = await client.get("/api/v1/widgets", params={"shardSelector": everything})
            assert resp.status_code == 503 and resp.json()["kind"] == "Status"
            assert "not passed through unfiltered" in resp.json()["message"]
            resp = await client.get("/api/v1/widgets")
            assert resp.status_code == 200 and "shardInfo" not in resp.json()["metadata"]


class _SlowCloseStream(httpx.AsyncByteStream):
    """An upstream body of one chunk whose close takes a few loop turns (httpcore's close awaits the socket)."""

    def __init__(self) -> None:
        self.close_started = asyncio.Event()
        self.closed_fully = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'{"kind":"ConfigMap"}'

    async def aclose(self) -> None:
        self.close_started.set()
        await asyncio.sleep(0.05)
        self.closed_fully = True


class _OneAnswer(Upstream):
    """An upstream whose pass-through answers with one :class:`_SlowCloseStream` body."""

    def __init__(self, body: _SlowCloseStream) -> None:
        self.body = body

    async def forward(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]],
        body: AsyncIterator[bytes] | None,
        *,
        own_credentials: bool = True,
    ) -> httpx.Response:
        return httpx.Response(200, stream=self.body)


def _get_request(path: str) -> Request:
    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"accept", b"application/json")],
    }

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    return Request(scope, receive)


@async_test()
async def test_a_client_leaving_while_the_answer_closes_does_not_cut_the_close_short() -> None:
    """Issue 25's pool exhaustion: a cancellation during the close of a relayed answer must not stop the close.

    The client goes away just as the body ends (the relay is closing the upstream answer): the close
    runs to its end anyway, so httpcore gets its connection back. Cut short, the connection stayed
    ACTIVE in the pool forever, and after 200 of them every upstream request of the proxy waited.
    """
    body = _SlowCloseStream()
    shutdown = ShutdownSignal()
    upstream = _OneAnswer(body)
    metrics = ProxyMetrics()
    manager = CacheManager(upstream, metrics)
    passthrough = PassThrough(upstream, manager, metrics, AuthMode.NONE, None, shutdown)
    response = await passthrough.forward(_get_request("/api/v1/namespaces/x/configmaps/y"))
    assert isinstance(response, StreamingResponse)
    chunks = response.body_iterator
    assert await anext(chunks) == b'{"kind":"ConfigMap"}'
    assert passthrough.open_responses  # the answer is open until it is closed
    ending = asyncio.ensure_future(anext(chunks))  # the body ends: the relay closes the upstream answer
    await asyncio.wait_for(body.close_started.wait(), 2)
    ending.cancel()  # the client went away at that moment (Starlette cancels the response's task)
    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
        await ending
    for _ in range(100):
        if body.closed_fully:
            break
        await asyncio.sleep(0.01)
    assert body.closed_fully, "the close of the upstream answer was cut short by the cancellation"
    assert passthrough.open_responses == {}


@async_test()
async def test_the_pool_watchdog_names_what_holds_the_upstream_connections(caplog: pytest.LogCaptureFixture) -> None:
    """With every upstream connection busy and a request waiting, the proxy says so and names the requests."""
    release = asyncio.Event()

    async def slow(_request: Request) -> Response:
        await release.wait()
        return Response(b"{}", media_type="application/json")

    app = Starlette(routes=[Route("/{path:path}", slow)])
    async with serve(app) as url:
        upstream = HttpUpstream(UpstreamConfig(url), max_connections=1)
        proxy = Proxy(upstream, ProxySettings(), ProxyMetrics())
        try:
            held = asyncio.ensure_future(upstream.forward("GET", "/api/v1/namespaces/a/configmaps/held", [], None))
            await eventually(lambda: upstream.pool_state()[0] == 1, what="the one connection in use")
            waiting = asyncio.ensure_future(upstream.forward("GET", "/api/v1/namespaces/a/configmaps/next", [], None))
            await eventually(lambda: upstream.pool_state()[2] == 1, what="a request waiting for a connection")
            assert upstream.pool_state() == (1, 0, 1)
            with caplog.at_level(logging.WARNING, logger="range_filter_proxy.app"):
                watchdog = asyncio.ensure_future(proxy._watch_pool(every=0.05))
                await eventually(lambda: any("pool full" in r.getMessage() for r in caplog.records), what="a warning")
                watchdog.cancel()
            [message] = [r.getMessage() for r in caplog.records if "pool full" in r.getMessage()]
            assert message.startswith("upstream connection pool full: 1 connections (0 idle; 1 ")
            assert "1 requests waiting" in message and "2 sent without an answer yet" in message
            assert "GET /api/v1/namespaces/a/configmaps/held" in message
            release.set()
            for fut in (held, waiting):
                resp = await asyncio.wait_for(fut, 5)
                await resp.aclose()
            # Nothing busy, nothing waiting (a connection closed unread is dropped, not kept idle).
            await eventually(lambda: upstream.pool_state()[0] == upstream.pool_state()[1], what="no busy connection")
            assert upstream.pool_state()[2] == 0
        finally:
            await upstream.aclose()
