"""Pass-through and upstream configuration, against a tiny echoing HTTP upstream served by uvicorn."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
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
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.upstream import HttpUpstream, UpstreamConfig, load_upstream_config
from rangeshard.core.errors import ConfigError
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


@async_test()
async def test_a_client_leaving_mid_answer_gives_the_upstream_connection_back() -> None:
    """Issue 25's pool exhaustion: a relayed answer the client leaves must release its upstream connection.

    A streamed answer that never ends, a client that reads its first bytes and goes away: the relay ends,
    the connection is released (closed, not left in use), and nothing stays open. Cut short, connections
    stayed in use forever, and after 200 of them every upstream request of the proxy waited.
    """
    release = asyncio.Event()

    async def endless(_request: Request) -> Response:
        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"kind":"ConfigMap"}\n'
            await release.wait()
            yield b"late\n"

        return StreamingResponse(chunks(), media_type="application/json")

    async def discovery(_request: Request) -> Response:
        return Response(b'{"kind":"APIResourceList","groupVersion":"v1","resources":[]}', media_type="application/json")

    upstream_app = Starlette(routes=[Route("/api/v1", discovery), Route("/{path:path}", endless)])
    async with serve(upstream_app) as upstream_url:
        app = create_app(upstream_url)
        proxy = app.state.proxy
        async with serve(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                for _ in range(3):
                    async with client.stream("GET", "/api/v1/namespaces/x/configmaps/y") as resp:
                        first = await anext(resp.aiter_bytes())
                        assert first.startswith(b'{"kind":"ConfigMap"}')
                        assert proxy.passthrough.open_responses, "the answer is open while it streams"
            await eventually(lambda: proxy.upstream.pool_state()[0] == 0, what="every connection released")
            assert proxy.passthrough.open_responses == {}
            release.set()


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
            held = asyncio.ensure_future(upstream.forward("GET", "/api/v1/namespaces/a/configmaps/held", [], b""))
            await eventually(lambda: upstream.pool_state()[0] == 1, what="the one connection in use")
            waiting = asyncio.ensure_future(upstream.forward("GET", "/api/v1/namespaces/a/configmaps/next", [], b""))
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
                resp.close()
            # Nothing busy, nothing waiting.
            await eventually(lambda: upstream.pool_state()[0] == upstream.pool_state()[1], what="no busy connection")
            assert upstream.pool_state()[2] == 0
        finally:
            await upstream.aclose()


@async_test()
async def test_a_write_the_upstream_took_without_answering_is_passed_through_once_and_is_a_503() -> None:
    """Never twice, on the proxy's pass-through: a create over a kept-alive connection the upstream drops."""
    seen: list[bytes] = []

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = [int(x.split(b":")[1]) for x in head.lower().split(b"\r\n") if x.startswith(b"content-length")]
                await reader.readexactly(length[0] if length else 0)
                seen.append(head.split(b" ")[0])
                if head.startswith(b"POST"):
                    return  # took the create, died before answering
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with serve(create_app(url)) as proxy, httpx.AsyncClient(base_url=proxy, timeout=10) as client:
            assert (await client.get("/api/v1/namespaces/a/configmaps/x")).status_code == 200
            resp = await client.post("/api/v1/namespaces/a/configmaps", json={"metadata": {"generateName": "x-"}})
            assert resp.status_code == 503 and resp.json()["kind"] == "Status", resp.text
            assert "may have been applied" in resp.json()["message"]
            assert seen == [b"GET", b"POST"], "the create reached the upstream exactly once"
            assert (await client.get("/api/v1/namespaces/a/configmaps/x")).status_code == 200
    finally:
        server.close()


@async_test()
async def test_streamed_answers_leave_their_connection_reusable_for_the_next_write() -> None:
    """A relayed answer without a length (chunked) gives its connection back intact: the writes after it pass."""
    seen: list[bytes] = []
    connections = 0

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = [int(x.split(b":")[1]) for x in head.lower().split(b"\r\n") if x.startswith(b"content-length")]
                await reader.readexactly(length[0] if length else 0)
                seen.append(head.split(b" ")[0])
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                await writer.drain()
                await asyncio.sleep(0.05)  # a slow upstream (scenario time): the proxy relays the body as it comes
                writer.write(b"1\r\n{\r\n1\r\n}\r\n0\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with serve(create_app(url)) as proxy, httpx.AsyncClient(base_url=proxy, timeout=10) as client:
            assert (await client.get("/api/v1/namespaces/a/configmaps/x")).text == "{}"
            for _ in range(3):
                resp = await client.post("/api/v1/namespaces/a/configmaps", json={"metadata": {"name": "x"}})
                assert resp.status_code == 200 and resp.text == "{}", resp.text
            assert seen == [b"GET", b"POST", b"POST", b"POST"]
            assert connections == 1, "every request went over the one kept-alive connection"
    finally:
        server.close()
