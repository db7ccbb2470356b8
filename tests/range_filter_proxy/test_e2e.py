"""End to end: real etcd, the real local API server, the proxy process, the official client and kubectl."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from hashing import MAX_HASH, OWNER_PATH, UID_PATH, HashRange, hash_key, parse_shard_selector, range_to_selector
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.process import popen
from tests.helpers import wait_until
from tests.range_filter_proxy.helpers import read_events

HALF = MAX_HASH // 2
LOWER_OWNER = range_to_selector(HashRange(0, HALF), OWNER_PATH)
UPPER_OWNER = range_to_selector(HashRange(HALF + 1, MAX_HASH), OWNER_PATH)
LOWER_UID = range_to_selector(HashRange(0, HALF), UID_PATH)
UPPER_UID = range_to_selector(HashRange(HALF + 1, MAX_HASH), UID_PATH)
N_RS, PODS_PER_RS, N_ORPHANS = 20, 10, 5


def _pod(name: str, owner: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels or {"app": "e2e"}}
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def _rs(name: str) -> dict[str, Any]:
    labels = {"rs": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
        },
    }


def _create(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post(path, content=orjson.dumps(body), headers={"Content-Type": "application/json"})
    assert resp.status_code == 201, resp.text
    return dict(resp.json())


class World:
    """The objects every test of this module starts from."""

    def __init__(
        self, namespace: str, rs: list[dict[str, Any]], owned: list[dict[str, Any]], orphans: list[dict[str, Any]]
    ) -> None:
        self.namespace = namespace
        self.rs = rs
        self.owned = owned
        self.orphans = orphans


@pytest.fixture(scope="module")
def world(local_apiserver: Any) -> World:
    ns = f"e2e-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=local_apiserver.url, timeout=10) as c:
        _create(c, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        rs = [_create(c, f"/apis/apps/v1/namespaces/{ns}/replicasets", _rs(f"rs-{i}")) for i in range(N_RS)]
        owned = [
            _create(c, f"/api/v1/namespaces/{ns}/pods", _pod(f"p-{i}-{j}", owner))
            for i, owner in enumerate(rs)
            for j in range(PODS_PER_RS)
        ]
        orphans = [_create(c, f"/api/v1/namespaces/{ns}/pods", _pod(f"orphan-{k}")) for k in range(N_ORPHANS)]
    return World(ns, rs, owned, orphans)


def _owner_uid(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["ownerReferences"][0]["uid"])


def _metric(text: str, name: str, resource: str) -> float:
    pattern = re.compile(rf'^{name}\{{[^}}]*resource="{re.escape(resource)}"[^}}]*\}} ([0-9.e+-]+)$', re.M)
    m = pattern.search(text)
    return float(m.group(1)) if m else 0.0


def test_owner_and_uid_paths_partition_exactly(proxy: ProxyProcess, world: World) -> None:
    ns = world.namespace
    with httpx.Client(base_url=proxy.url, timeout=10) as c:
        lower = c.get(f"/api/v1/namespaces/{ns}/pods", params={"shardSelector": LOWER_OWNER}).json()
        upper = c.get(f"/api/v1/namespaces/{ns}/pods", params={"shardSelector": UPPER_OWNER}).json()
        rs_lo = c.get(f"/apis/apps/v1/namespaces/{ns}/replicasets", params={"shardSelector": LOWER_UID}).json()
        rs_hi = c.get(f"/apis/apps/v1/namespaces/{ns}/replicasets", params={"shardSelector": UPPER_UID}).json()
    assert lower["metadata"]["shardInfo"]["selector"] == LOWER_OWNER
    lo = {p["metadata"]["name"] for p in lower["items"]}
    hi = {p["metadata"]["name"] for p in upper["items"]}
    orphans = {p["metadata"]["name"] for p in world.orphans}
    assert lo & hi == orphans
    assert lo | hi == orphans | {p["metadata"]["name"] for p in world.owned}
    for pod in world.owned:
        on_lower = hash_key(_owner_uid(pod)) <= HALF
        assert (pod["metadata"]["name"] in lo) == on_lower
        assert (pod["metadata"]["name"] in hi) != on_lower
    assert 0 < len(lo) - len(orphans) < N_RS * PODS_PER_RS  # both sides own something
    rlo = {r["metadata"]["name"] for r in rs_lo["items"]}
    rhi = {r["metadata"]["name"] for r in rs_hi["items"]}
    assert not rlo & rhi and len(rlo | rhi) == N_RS
    for r in world.rs:
        assert (r["metadata"]["name"] in rlo) == (hash_key(r["metadata"]["uid"]) <= HALF)


def test_sixteen_range_watches_cause_one_upstream_watch(
    proxy: ProxyProcess, world: World, local_apiserver: Any
) -> None:
    ns = world.namespace
    ranges = [HashRange(i * (MAX_HASH // 16 + 1), min((i + 1) * (MAX_HASH // 16 + 1) - 1, MAX_HASH)) for i in range(16)]
    ranges[-1] = HashRange(ranges[-1].lo, MAX_HASH)
    selectors = [range_to_selector(r, OWNER_PATH) for r in ranges]
    new_names = [f"w16-{k}" for k in range(8)]

    async def run() -> list[list[str]]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=20) as c:
            rv = c.get  # keep mypy quiet about unused
            del rv
            listed = (await c.get(f"/api/v1/namespaces/{ns}/pods", params={"resourceVersion": "0"})).json()
            start_rv = listed["metadata"]["resourceVersion"]
            ready = asyncio.Event()
            opened = 0
            results: list[list[str]] = [[] for _ in selectors]

            async def one(i: int) -> None:
                nonlocal opened
                params = {"watch": "true", "resourceVersion": start_rv, "shardSelector": selectors[i]}
                async with c.stream("GET", f"/api/v1/namespaces/{ns}/pods", params=params) as resp:
                    assert resp.status_code == 200
                    opened += 1
                    if opened == len(selectors):
                        ready.set()
                    lines = resp.aiter_lines()
                    while True:
                        (event,) = await read_events(lines, 1, timeout=15)
                        name = event["object"]["metadata"]["name"]
                        results[i].append(name)
                        if name == "w16-done":
                            return

            tasks = [asyncio.create_task(one(i)) for i in range(len(selectors))]
            await asyncio.wait_for(ready.wait(), 15)
            metrics = (await c.get("/metrics")).text
            assert _metric(metrics, "range_filter_proxy_downstream_watches", "pods") >= 16
            async with httpx.AsyncClient(base_url=local_apiserver.url, timeout=10) as up:
                upstream_metrics = (await up.get("/metrics")).text
                assert _metric(upstream_metrics, "local_apiserver_watches", "pods") == 1
                assert _metric(metrics, "range_filter_proxy_upstream_watches", "pods") == 1
                owner = world.rs[0]
                for name in new_names:
                    resp = await up.post(
                        f"/api/v1/namespaces/{ns}/pods",
                        content=orjson.dumps(_pod(name, owner)),
                        headers={"Content-Type": "application/json"},
                    )
                    assert resp.status_code == 201
                # an orphan reaches every range: it ends every watch
                resp = await up.post(
                    f"/api/v1/namespaces/{ns}/pods",
                    content=orjson.dumps(_pod("w16-done")),
                    headers={"Content-Type": "application/json"},
                )
                assert resp.status_code == 201
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
            return results

    results = asyncio.run(run())
    owner_key = hash_key(world.rs[0]["metadata"]["uid"])
    for rng, got in zip(ranges, results, strict=True):
        expected = new_names if owner_key in rng else []
        assert got == [*expected, "w16-done"]
    with httpx.Client(timeout=10) as c:
        assert _metric(c.get(local_apiserver.url + "/metrics").text, "local_apiserver_watches", "pods") == 1
        proxy_metrics = c.get(proxy.url + "/metrics").text
        assert _metric(proxy_metrics, "range_filter_proxy_upstream_watches", "pods") == 1
    # The `rangeshard proxy` process (uvicorn with httptools) writes live events straight to the connections.
    direct = [
        float(line.rsplit(" ", 1)[1])
        for line in proxy_metrics.splitlines()
        if line.startswith("range_filter_proxy_watch_writes_total{") and 'path="direct"' in line and '"pods"' in line
    ]
    assert direct and direct[0] > 0, "live watch events never took the direct path in the real proxy"


def test_watch_in_range_resume_410_and_bookmarks(proxy: ProxyProcess, world: World, local_apiserver: Any) -> None:
    ns = world.namespace
    lo_owner = next(r for r in world.rs if hash_key(r["metadata"]["uid"]) <= HALF)
    hi_owner = next(r for r in world.rs if hash_key(r["metadata"]["uid"]) > HALF)
    path = f"/api/v1/namespaces/{ns}/pods"

    async def run() -> None:
        async with (
            httpx.AsyncClient(base_url=proxy.url, timeout=20) as c,
            httpx.AsyncClient(base_url=local_apiserver.url, timeout=10) as up,
        ):

            async def create(name: str, owner: dict[str, Any]) -> None:
                resp = await up.post(
                    path, content=orjson.dumps(_pod(name, owner)), headers={"Content-Type": "application/json"}
                )
                assert resp.status_code == 201, resp.text

            start = (await c.get(path, params={"shardSelector": LOWER_OWNER})).json()["metadata"]["resourceVersion"]
            params = {
                "watch": "true",
                "resourceVersion": start,
                "shardSelector": LOWER_OWNER,
                "allowWatchBookmarks": "true",
            }
            last_rv = start
            async with c.stream("GET", path, params=params) as resp:
                lines = resp.aiter_lines()
                await create("res-hi-1", hi_owner)
                await create("res-lo-1", lo_owner)
                while True:
                    (event,) = await read_events(lines, 1)
                    if event["type"] == "BOOKMARK":
                        continue
                    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "res-lo-1")
                    last_rv = event["object"]["metadata"]["resourceVersion"]
                    break
                # quiet range: bookmarks still arrive and move past the out-of-range event
                await create("res-hi-2", hi_owner)
                hi2_rv = int((await up.get(f"{path}/res-hi-2")).json()["metadata"]["resourceVersion"])
                deadline = time.monotonic() + 10
                while True:
                    (event,) = await read_events(lines, 1)
                    assert event["type"] == "BOOKMARK", event
                    if int(event["object"]["metadata"]["resourceVersion"]) >= hi2_rv:
                        break
                    assert time.monotonic() < deadline
            # disconnected: events happen meanwhile, then resume from the last RV seen
            await create("res-lo-2", lo_owner)
            await create("res-hi-3", hi_owner)
            await create("res-lo-3", lo_owner)
            params["resourceVersion"] = last_rv
            async with c.stream("GET", path, params=params) as resp:
                lines = resp.aiter_lines()
                got: list[str] = []
                while len(got) < 2:
                    (event,) = await read_events(lines, 1)
                    if event["type"] != "BOOKMARK":
                        got.append(event["object"]["metadata"]["name"])
                assert got == ["res-lo-2", "res-lo-3"]
            # an RV older than the history window: ERROR event with a 410 Status
            async with c.stream("GET", path, params={"watch": "true", "resourceVersion": "1"}) as resp:
                (event,) = await read_events(resp.aiter_lines(), 1)
                assert event["type"] == "ERROR" and event["object"]["code"] == 410

    asyncio.run(run())


def test_official_client_list_and_watch_with_shard_selector(
    proxy: ProxyProcess, world: World, local_apiserver: Any
) -> None:
    ns = world.namespace
    cfg = k8s.Configuration()
    cfg.host = proxy.url
    with k8s.ApiClient(cfg) as api_client:
        v1 = k8s.CoreV1Api(api_client)
        result = v1.list_namespaced_pod(ns, shard_selector=LOWER_OWNER)
        assert result.metadata is not None and result.metadata.shard_info is not None
        assert result.metadata.shard_info.selector == LOWER_OWNER
        sel = parse_shard_selector(LOWER_OWNER)
        names = {p.metadata.name for p in result.items if p.metadata is not None}
        for pod in world.owned + world.orphans:
            assert (pod["metadata"]["name"] in names) == sel.matches(pod)
        lo_owner = next(r for r in world.rs if hash_key(r["metadata"]["uid"]) <= HALF)
        hi_owner = next(r for r in world.rs if hash_key(r["metadata"]["uid"]) > HALF)
        w = k8s_watch.Watch()  # type: ignore[no-untyped-call]
        seen: list[tuple[str, str]] = []
        created = False
        initial = len(result.items)
        with httpx.Client(base_url=local_apiserver.url, timeout=10) as up:
            stream = w.stream(  # type: ignore[no-untyped-call]
                v1.list_namespaced_pod, ns, shard_selector=LOWER_OWNER, timeout_seconds=20
            )
            for event in stream:
                seen.append((event["type"], event["object"].metadata.name))
                if not created and len(seen) >= initial:
                    _create(up, f"/api/v1/namespaces/{ns}/pods", _pod("client-hi", hi_owner))
                    _create(up, f"/api/v1/namespaces/{ns}/pods", _pod("client-lo", lo_owner))
                    created = True
                if seen[-1][1] == "client-lo":
                    w.stop()  # type: ignore[no-untyped-call]
        assert ("ADDED", "client-lo") in seen
        assert all(name != "client-hi" for _, name in seen)
        assert {n for t, n in seen if t == "ADDED"} >= names


@pytest.fixture
def kubectl_home(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["HOME"] = str(tmp_path)
    env["KUBECONFIG"] = str(tmp_path / "no-kubeconfig")
    yield env


def test_kubectl_through_proxy(proxy: ProxyProcess, world: World, kubectl_home: dict[str, str], tmp_path: Path) -> None:
    ns = world.namespace
    base = ["/usr/bin/kubectl", "--server", proxy.url, "-n", ns]

    def kubectl(*args: str, stdin: str | None = None) -> str:
        out = subprocess.run(
            [*base, *args], input=stdin, capture_output=True, text=True, env=kubectl_home, timeout=30, check=False
        )
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        return out.stdout

    # Tables from the cache: the columns kubectl shows on a real cluster (pods and replicasets are cached here).
    out = kubectl("get", "pods", "--field-selector", "metadata.name=orphan-0")  # a list: served from the cache
    assert out.splitlines()[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert out.splitlines()[1].split()[:4] == ["orphan-0", "0/1", "Pending", "0"]
    wide = kubectl("get", "rs", "rs-0", "-o", "wide")  # a single get is passed through: the upstream's Table
    assert wide.splitlines()[0].split() == [
        "NAME",
        "DESIRED",
        "CURRENT",
        "READY",
        "AGE",
        "CONTAINERS",
        "IMAGES",
        "SELECTOR",
    ]
    assert wide.splitlines()[1].split()[:4] == ["rs-0", "0", "0", "0"] and "rs=rs-0" in wide
    table_accept = {"accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
    with httpx.Client(base_url=proxy.url, timeout=10) as c:
        listed = c.get(f"/apis/apps/v1/namespaces/{ns}/replicasets", headers=table_accept).json()
        assert listed["kind"] == "Table" and len(listed["rows"]) == N_RS
        assert [d["name"] for d in listed["columnDefinitions"]][:5] == ["Name", "Desired", "Current", "Ready", "Age"]
        assert listed["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
        bare = c.get(f"/api/v1/namespaces/{ns}/pods", params={"includeObject": "None"}, headers=table_accept).json()
        assert all("object" not in row for row in bare["rows"])
        assert (
            c.get(f"/api/v1/namespaces/{ns}/pods", params={"includeObject": "x"}, headers=table_accept).status_code
            == 400
        )
        with c.stream(
            "GET",
            f"/api/v1/namespaces/{ns}/pods",
            params={"watch": "1", "timeoutSeconds": "1", "labelSelector": "app=e2e"},
            headers=table_accept,
        ) as resp:
            events = [orjson.loads(line) for line in resp.iter_lines() if line]
        assert len(events) >= N_ORPHANS and all(e["object"]["kind"] == "Table" for e in events)
        assert {row["cells"][0] for e in events for row in e["object"]["rows"]} >= {
            o["metadata"]["name"] for o in world.orphans
        }
        assert events[0]["object"]["columnDefinitions"] and not events[-1]["object"]["columnDefinitions"]
    watcher = popen(
        [*base, "get", "pods", "-w", "-o", "name"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=kubectl_home,
    )
    lines: list[str] = []
    found = threading.Event()

    def reader() -> None:
        assert watcher.stdout is not None
        for line in watcher.stdout:
            lines.append(line.strip())
            if line.strip() == "pod/kubectl-made":
                found.set()

    thread = threading.Thread(target=reader, name="kubectl-watch-reader", daemon=True)
    thread.start()
    try:
        manifest = tmp_path / "pod.json"
        manifest.write_text(json.dumps(_pod("kubectl-made")))
        assert "created" in kubectl("create", "-f", str(manifest))  # default validation (server-side, Strict)
        assert found.wait(20), lines
        assert "kubectl-made" in kubectl("get", "pod", "kubectl-made", "-o", "name")
        assert "deleted" in kubectl("delete", "pod", "kubectl-made", "--wait=false")
    finally:
        watcher.terminate()
        watcher.wait(10)
        thread.join(5)
        assert watcher.stdout is not None
        watcher.stdout.close()
    out = subprocess.run(
        [*base, "get", "pod", "kubectl-made"], capture_output=True, text=True, env=kubectl_home, timeout=30, check=False
    )
    assert out.returncode != 0 and "NotFound" in out.stderr


def test_passthrough_preserves_status_codes_and_bodies(proxy: ProxyProcess, world: World) -> None:
    ns = world.namespace
    with httpx.Client(base_url=proxy.url, timeout=10) as c:
        missing = c.get(f"/api/v1/namespaces/{ns}/pods/does-not-exist")
        assert missing.status_code == 404 and missing.json()["kind"] == "Status"
        name = world.orphans[0]["metadata"]["name"]
        again = c.post(
            f"/api/v1/namespaces/{ns}/pods",
            content=orjson.dumps(_pod(name)),
            headers={"Content-Type": "application/json", "Accept": "application/vnd.kubernetes.protobuf"},
        )
        assert again.status_code == 409 and again.headers["content-type"].startswith("application/json")
        got = c.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        assert got.status_code == 200 and got.json()["metadata"]["uid"] == world.orphans[0]["metadata"]["uid"]
        bad = c.get(
            f"/api/v1/namespaces/{ns}/pods",
            params={"shardSelector": "shardRange(object.spec, '0x0000000000000000', '0x0000000000000001')"},
        )
        assert bad.status_code == 400 and "unsupported path" in bad.json()["message"]
        text = c.get("/metrics").text
        assert _metric(text, "range_filter_proxy_upstream_watches", "replicasets.apps") == 1
        assert c.get("/readyz").status_code == 200
        # The local API server implements KEP-5866 itself: the proxy's probe finds it native.
        wait_until(
            lambda: "upstream-shard-selector ok: supported: native KEP-5866" in c.get("/readyz?verbose").text,
            10,
            "the proxy's shardSelector probe",
        )
        assert re.search(r"^range_filter_proxy_upstream_shard_selector_supported 1\.0$", c.get("/metrics").text, re.M)


def test_upstream_restart_relists_and_keeps_serving(etcd_server: Any, tmp_path: Path) -> None:
    from local_apiserver.process import LocalApiServerProcess  # noqa: PLC0415

    prefix = f"/proxy-restart-{uuid.uuid4().hex[:8]}"
    upstream = LocalApiServerProcess(
        etcd_server.url, prefix=prefix, log_file=tmp_path / "api.log", bookmark_interval=0.2
    )
    upstream.start(timeout=30)
    proxy = ProxyProcess(upstream.url, resources=["pods"], log_file=tmp_path / "proxy.log")
    try:
        proxy.start(timeout=30)
        with httpx.Client(base_url=upstream.url, timeout=10) as up:
            _create(up, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "r"}})
            _create(up, "/api/v1/namespaces/r/pods", _pod("before"))
        with httpx.Client(base_url=proxy.url, timeout=10) as c:
            listed = c.get("/api/v1/namespaces/r/pods").json()
            assert [p["metadata"]["name"] for p in listed["items"]] == ["before"]
            params = {"watch": "true", "resourceVersion": listed["metadata"]["resourceVersion"]}
            with c.stream("GET", "/api/v1/namespaces/r/pods", params=params) as resp:
                upstream.kill()
                upstream = LocalApiServerProcess(
                    etcd_server.url,
                    port=upstream.port,
                    prefix=prefix,
                    log_file=tmp_path / "api2.log",
                    bookmark_interval=0.2,
                )
                upstream.start(timeout=30)
                # the relist closes every downstream watch: the stream ends, clients re-watch
                assert [line for line in resp.iter_lines() if line.strip()] == []
            with httpx.Client(base_url=upstream.url, timeout=10) as up:
                _create(up, "/api/v1/namespaces/r/pods", _pod("after"))
            deadline = time.monotonic() + 20
            while True:
                names = [p["metadata"]["name"] for p in c.get("/api/v1/namespaces/r/pods").json()["items"]]
                if names == ["after", "before"]:
                    break
                assert time.monotonic() < deadline, names
                time.sleep(0.05)  # polling interval
            text = c.get("/metrics").text
            assert _metric(text, "range_filter_proxy_relists_total", "pods") >= 2
            assert _metric(text, "range_filter_proxy_upstream_watches", "pods") == 1
    finally:
        proxy.stop()
        upstream.stop()
