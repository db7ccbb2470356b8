"""Pass-through and upstream configuration, against a tiny echoing HTTP upstream served by uvicorn."""

from __future__ import annotations

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
from range_filter_proxy.upstream import load_upstream_config
from rangeshard.core.errors import ConfigError
from tests.range_filter_proxy.helpers import async_test, serve


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
