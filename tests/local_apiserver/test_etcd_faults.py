"""Compaction (410) and etcd outages, each on a private etcd so the session etcd keeps its history."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as _client
from kubernetes import watch as _watch
from kubernetes.client.exceptions import ApiException

from local_apiserver.process import LocalApiServerProcess
from local_apiserver.resources import core_spec
from local_apiserver.store import ListResult, Store
from local_apiserver.watch import WatchRequest, watch_events
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.etcdserver import EtcdServer
from rangeshard.core.selectors import FieldSelector, LabelSelector
from tests.local_apiserver.conftest import metric, wait_for

k: Any = _client
kwatch: Any = _watch


@pytest.fixture
def private(etcd_server_factory: Callable[[], EtcdServer], tmp_path: Path) -> Iterator[tuple[EtcdServer, str]]:
    etcd = etcd_server_factory()
    etcd.start()
    proc = LocalApiServerProcess(etcd.url, log_file=tmp_path / "apiserver.log", bookmark_interval=0.3)
    proc.start()
    yield etcd, proc.url
    proc.stop()


def _cm(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": {"v": "0"}}


def test_410_after_compaction(private: tuple[EtcdServer, str]) -> None:
    etcd, url = private
    cfg = k.Configuration()
    cfg.host = url
    with k.ApiClient(cfg) as api, httpx.Client(base_url=url) as http:
        core = k.CoreV1Api(api)
        for i in range(3):
            core.create_namespaced_config_map("default", k.V1ConfigMap(metadata=k.V1ObjectMeta(name=f"c{i}")))
        page = core.list_namespaced_config_map("default", limit=1)
        old_rv = page.metadata.resource_version
        for i in range(3):
            core.patch_namespaced_config_map("c0", "default", {"data": {"v": str(i)}})
        with EtcdClient(EtcdConfig.from_urls(etcd.url)) as client:
            client.compact(client.revision())

        # A watch from a compacted revision: the stream carries one ERROR event with a 410 Status.
        with http.stream("GET", f"/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={old_rv}") as resp:
            assert resp.status_code == 200
            lines = [json.loads(line) for line in resp.iter_lines() if line.strip()]
        assert [e["type"] for e in lines] == ["ERROR"]
        assert lines[0]["object"]["code"] == 410 and lines[0]["object"]["reason"] == "Expired"
        # The official client surfaces it as ApiException 410 (no retry because timeout_seconds is set).
        with pytest.raises(ApiException) as info:
            for _ in kwatch.Watch().stream(
                core.list_namespaced_config_map, "default", resource_version=old_rv, timeout_seconds=5
            ):
                pass
        assert info.value.status == 410
        # A continue token and an Exact read at the compacted revision are 410 too.
        with pytest.raises(ApiException) as info:
            core.list_namespaced_config_map("default", limit=1, _continue=page.metadata._continue)
        assert info.value.status == 410
        resp = http.get(
            "/api/v1/namespaces/default/configmaps", params={"resourceVersion": old_rv, "resourceVersionMatch": "Exact"}
        )
        assert resp.status_code == 410 and resp.json()["kind"] == "Status"
        assert metric(http, "local_apiserver_requests_total", code="500") == 0


def test_watch_ends_cleanly_when_etcd_goes_away(private: tuple[EtcdServer, str]) -> None:
    etcd, url = private
    with httpx.Client(base_url=url, timeout=httpx.Timeout(5.0, read=20.0)) as http:
        http.post("/api/v1/namespaces/default/configmaps", json=_cm("w"))
        with http.stream("GET", "/api/v1/namespaces/default/configmaps?watch=1") as resp:
            lines = resp.iter_lines()
            first = json.loads(next(lines))
            assert first["type"] == "ADDED" and first["object"]["metadata"]["name"] == "w"
            assert metric(http, "local_apiserver_watches", resource="configmaps") == 1
            started = time.monotonic()
            etcd.stop()
            rest = [line for line in lines if line.strip()]  # ends instead of hanging
            assert time.monotonic() - started < 15
        assert rest == []
        wait_for(lambda: metric(http, "local_apiserver_watches", resource="configmaps") == 0, what="gauge drop")
        # While etcd is down: 503 Status, not 500; readiness fails.
        resp = http.get("/api/v1/namespaces/default/configmaps")
        assert resp.status_code in (503, 504) and resp.json()["kind"] == "Status"
        assert http.get("/readyz").status_code == 503
        etcd.start()
        wait_for(lambda: http.get("/readyz").status_code == 200, timeout=20, what="ready again")
        assert http.get("/api/v1/namespaces/default/configmaps/w").status_code == 200


def test_compaction_during_the_initial_list_of_a_watch_is_410_naming_the_list_revision(
    etcd_server_factory: Callable[[], EtcdServer],
) -> None:
    """etcd compacts between a watch's initial list (at R) and its etcd watch from R+1: one ERROR 410 event.

    The message names the list's revision and the compacted one, as kube's ``too old resource version: R (C)``,
    and the stream ends there (the client relists). etcd reports the compaction on the watch stream once the
    watch is created, so the listed objects may already have been sent as ``ADDED``.
    """
    etcd = etcd_server_factory()
    etcd.start()
    spec = core_spec("configmaps")
    seen: dict[str, int] = {}
    with EtcdClient(EtcdConfig.from_urls(etcd.url)) as client:
        store = Store(client)
        store.ensure_namespaces(("default",))
        store.create(spec, "default", _cm("listed"))
        real_list = store.list_page

        def list_then_compact(*args: Any, **kwargs: Any) -> ListResult:
            result = real_list(*args, **kwargs)
            for i in range(2):  # two writes after R, then compact past R + 1
                store.create(spec, "default", _cm(f"later{i}"))
            seen["list"], seen["compacted"] = result.revision, client.revision()
            client.compact(seen["compacted"])
            return result

        store.list_page = list_then_compact  # type: ignore[method-assign]
        req = WatchRequest(
            spec=spec,
            namespace="default",
            labels=LabelSelector(()),
            fields=FieldSelector(()),
            resource_version=None,
            allow_bookmarks=False,
            timeout_seconds=5,
            send_initial_events=False,
        )

        async def events() -> list[dict[str, Any]]:
            config = EtcdConfig.from_urls(etcd.url)
            stream = await watch_events(
                store, config, req, bookmark_interval=1.0, on_open=lambda: None, on_close=lambda: None
            )
            return [json.loads(line) async for line in stream]

        lines = asyncio.run(asyncio.wait_for(events(), timeout=10))
    assert seen["compacted"] > seen["list"] + 1
    *before, last = lines
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in before] in ([], [("ADDED", "listed")])
    assert last == {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {seen['list']} ({seen['compacted']})",
            "reason": "Expired",
            "code": 410,
        },
    }
