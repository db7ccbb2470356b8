"""Oversized request bodies: 413 ``RequestEntityTooLarge`` Status from both apps, never a 500 and never forwarded.

The local API server and the proxy (pass-through) get bodies just over the
default 3 MiB limit, once with ``Content-Length`` (refused before reading) and
once chunked (refused as soon as the stream crosses the limit); a body under
the limit still works (up to etcd's own 1.5 MiB request limit, beyond which
the local API server answers 413 too, as kube-apiserver does). A lowered ``--max-request-body-bytes`` takes effect.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.etcdserver import EtcdServer

LIMIT = 3 * 1024 * 1024


@pytest.fixture(scope="module")
def urls(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    base: Path = tmp_path_factory.mktemp("limits")
    with (
        LocalApiServerProcess(
            etcd_server.url, prefix=f"/limits-{uuid.uuid4().hex[:8]}", log_file=base / "las.log"
        ) as api,
        ProxyProcess(api.url, log_file=base / "proxy.log") as proxy,
        ProxyProcess(api.url, log_file=base / "small.log", extra_args=["--max-request-body-bytes", "4096"]) as small,
    ):
        yield api.url, proxy.url, small.url


def configmap(size: int) -> bytes:
    head = b'{"metadata":{"name":"big-%s"},"data":{"k":"' % uuid.uuid4().hex[:8].encode()
    return head + b"x" * (size - len(head) - 3) + b'"}}'


def chunks(body: bytes, step: int = 64 * 1024) -> Iterator[bytes]:
    for i in range(0, len(body), step):
        yield body[i : i + step]


def assert_413(resp: httpx.Response) -> None:
    assert resp.status_code == 413, resp.text[:300]
    doc = orjson.loads(resp.content)
    assert doc["kind"] == "Status" and doc["reason"] == "RequestEntityTooLarge" and doc["code"] == 413


@pytest.mark.parametrize("which", [0, 1], ids=["apiserver", "proxy"])
def test_oversized_bodies_are_413(urls: tuple[str, str, str], which: int) -> None:
    path = "/api/v1/namespaces/default/configmaps"
    with httpx.Client(base_url=urls[which], timeout=30.0) as client:
        headers = {"Content-Type": "application/json"}
        assert_413(client.post(path, content=configmap(LIMIT + 1), headers=headers))
        assert_413(client.post(path, content=chunks(configmap(LIMIT + 1)), headers=headers))
        assert_413(client.put(f"{path}/x", content=chunks(configmap(2 * LIMIT)), headers=headers))
        # Under the limit but over etcd's 1.5 MiB request limit: 413 as well (as kube-apiserver answers).
        assert_413(client.post(path, content=configmap(LIMIT - 1024), headers=headers))
        ok = client.post(path, content=configmap(1024 * 1024), headers=headers)
        assert ok.status_code == 201, ok.text[:300]
        assert client.get("/healthz").status_code == 200


def test_configured_limit(urls: tuple[str, str, str]) -> None:
    with httpx.Client(base_url=urls[2], timeout=30.0) as client:
        headers = {"Content-Type": "application/json"}
        assert_413(client.post("/api/v1/namespaces/default/configmaps", content=configmap(5000), headers=headers))
        streamed = chunks(configmap(5000), step=1000)  # chunked: refused by the proxy itself mid-stream
        assert_413(client.post("/api/v1/namespaces/default/configmaps", content=streamed, headers=headers))
        ok = client.post("/api/v1/namespaces/default/configmaps", content=configmap(3000), headers=headers)
        assert ok.status_code == 201, ok.text[:300]
