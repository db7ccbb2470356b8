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
