"""Placement by owner chain (``by: root``) through the proxy: Deployment -> ReplicaSet -> Pod.

Real etcd, the real local API server and the proxy process. Pods are listed and
watched with the root path through ``replicasets.apps``; ReplicaSets are
orphaned, adopted and re-parented while the watches run. Checked: every pod is
in exactly one half of the space, the one of its root; every move reaches each
watch once (``DELETED`` from the half it left, ``ADDED`` to the half it
entered); a list at resourceVersion N equals the replay of the watch up to N.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from hashing import MAX_HASH, HashRange, hash_key, range_to_selector
from hashing.rules import root_path
from range_filter_proxy.process import ProxyProcess

HALF = MAX_HASH // 2
ROOT = root_path(["replicasets.apps"])
LOWER = range_to_selector(HashRange(0, HALF), ROOT)
UPPER = range_to_selector(HashRange(HALF + 1, MAX_HASH), ROOT)
JSON = {"Content-Type": "application/json"}
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture(scope="module")
def root_proxy(local_apiserver: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    base: Path = tmp_path_factory.mktemp("root-proxy")
    proc = ProxyProcess(
        local_apiserver.url,
        resources=["pods", "replicasets.apps"],
        log_file=base / "proxy.log",
        extra_args=["--bookmark-interval", "0.2"],
    )
    proc.start(timeout=30)
    yield proc
    proc.stop()


def _ref(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    api = "apps/v1" if kind in ("Deployment", "ReplicaSet") else "batch/v1"
    meta = obj["metadata"]
    return {"apiVersion": api, "kind": kind, "name": meta["name"], "uid": meta["uid"], "controller": True}


def _template(labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


class Tree:
    """Deployments, their ReplicaSets and pods in one namespace, created through the local API server."""

    def __init__(self, client: httpx.AsyncClient, namespace: str) -> None:
        self.c = client
        self.ns = namespace
        self.deployments: dict[str, dict[str, Any]] = {}
        self.rs: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        #: ReplicaSet name -> Deployment name (None: orphan).
        self.parent: dict[str, str | None] = {}
        #: Pod name -> owner uid (a ReplicaSet's, or any other) or None.
        self.owner: dict[str, str | None] = {}

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = await self.c.post(path, content=orjson.dumps(body), headers=JSON)
        assert resp.status_code == 201, resp.text
        return dict(resp.json())

    async def deployment(self, name: str) -> dict[str, Any]:
        labels = {"d": name}
        body = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": _template(labels)},
        }
        d = self.deployments[name] = await self.post(f"/apis/apps/v1/namespaces/{self.ns}/deployments", body)
        return d

    async def replicaset(self, name: str, parent: str | None) -> dict[str, Any]:
        labels = {"rs": name}
        meta: dict[str, Any] = {"name": name}
        if parent is not None:
            meta["ownerReferences"] = [_ref("Deployment", self.deployments[parent])]
        body = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": meta,
            "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": _template(labels)},
        }
        rs = self.rs[name] = await self.post(f"/apis/apps/v1/namespaces/{self.ns}/replicasets", body)
        self.parent[name] = parent
        return rs

    async def pod(self, name: str, owner: dict[str, Any] | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name}
        if owner is not None:
            meta["ownerReferences"] = [owner]
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": _template({})["spec"]}
        p = self.pods[name] = await self.post(f"/api/v1/namespaces/{self.ns}/pods", body)
        self.owner[name] = owner["uid"] if owner is not None else None
        return p

    async def delete_pod(self, name: str) -> None:
        resp = await self.c.delete(f"/api/v1/namespaces/{self.ns}/pods/{name}")
        assert resp.status_code == 200, resp.text
        del self.pods[name], self.owner[name]

    async def reparent(self, rs: str, parent: str | None) -> None:
        refs = [_ref("Deployment", self.deployments[parent])] if parent is not None else None
        resp = await self.c.patch(
            f"/apis/apps/v1/namespaces/{self.ns}/replicasets/{rs}",
            content=orjson.dumps({"metadata": {"ownerReferences": refs}}),
            headers=MERGE,
        )
        assert resp.status_code == 200, resp.text
        self.parent[rs] = parent

    async def delete_rs_orphaning(self, rs: str) -> None:
        """Delete a ReplicaSet with ``propagationPolicy: Orphan``: the garbage collector orphans its pods."""
        resp = await self.c.request(
            "DELETE",
            f"/apis/apps/v1/namespaces/{self.ns}/replicasets/{rs}",
            content=orjson.dumps({"propagationPolicy": "Orphan"}),
            headers=JSON,
        )
        assert resp.status_code == 200, resp.text
        uid = self.rs[rs]["metadata"]["uid"]
        del self.parent[rs]
        for pod, owner in self.owner.items():
            if owner == uid:
                self.owner[pod] = None

    def root(self, pod: str) -> str:
        """The expected root uid of a pod."""
        owner = self.owner[pod]
        if owner is None:
            return str(self.pods[pod]["metadata"]["uid"])
        rs = next((n for n, r in self.rs.items() if r["metadata"]["uid"] == owner and n in self.parent), None)
        if rs is None or self.parent[rs] is None:
            return owner  # not a cached ReplicaSet (another kind): that owner is the root
        return str(self.deployments[str(self.parent[rs])]["metadata"]["uid"])

    def expected(self) -> tuple[set[str], set[str]]:
        lower = {p for p in self.pods if hash_key(self.root(p)) <= HALF}
        return lower, set(self.pods) - lower


async def _names(c: httpx.AsyncClient, path: str, selector: str) -> tuple[set[str], int]:
    resp = await c.get(path, params={"shardSelector": selector})
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    return {i["metadata"]["name"] for i in doc["items"]}, int(doc["metadata"]["resourceVersion"])


async def _deployments_on_both_sides(tree: Tree) -> tuple[str, str]:
    lo = hi = None
    for i in range(40):  # bounded: each side is a coin flip
        d = await tree.deployment(f"d-{i}")
        if hash_key(d["metadata"]["uid"]) <= HALF:
            lo = lo or d["metadata"]["name"]
        else:
            hi = hi or d["metadata"]["name"]
        if lo and hi:
            return lo, hi
    raise AssertionError("40 deployments all hashed to one half")


class Stream:
    """One watch of the pods of one half: every event kept, read by a background task."""

    def __init__(self, initial: set[str], rv: int) -> None:
        self.initial = set(initial)
        self.start = rv
        self.events: list[tuple[str, str, int]] = []  # (type, name, rv); bookmarks as ("BOOKMARK", "", rv)
        self.progress = asyncio.Event()

    @property
    def rv(self) -> int:
        return self.events[-1][2] if self.events else 0

    def state(self, upto: int | None = None) -> set[str]:
        """Replay: the names present after every event with rv <= ``upto``; doubles and misses fail."""
        present = set(self.initial)
        for etype, name, rv in self.events:
            if upto is not None and rv > upto:
                break
            if etype == "ADDED":
                assert name not in present, f"{name} ADDED twice: {self.start} {self.events}"
                present.add(name)
            elif etype == "DELETED":
                assert name in present, f"{name} DELETED while absent"
                present.discard(name)
            elif etype == "MODIFIED":
                assert name in present, f"{name} MODIFIED while absent"
        return present

    async def wait_past(self, rv: int, timeout: float = 15.0) -> None:
        async def until() -> None:
            while self.rv < rv:
                self.progress.clear()
                await self.progress.wait()

        await asyncio.wait_for(until(), timeout)


async def _open_streams(c: httpx.AsyncClient, path: str) -> tuple[Stream, Stream]:
    """A stream per half, each starting from its own list."""
    lower = Stream(*await _names(c, path, LOWER))
    upper = Stream(*await _names(c, path, UPPER))
    return lower, upper


async def _follow(c: httpx.AsyncClient, path: str, selector: str, into: Stream) -> None:
    params = {
        "watch": "true",
        "resourceVersion": str(into.start),
        "shardSelector": selector,
        "allowWatchBookmarks": "true",
    }
    async with c.stream("GET", path, params=params, timeout=None) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line.strip():
                continue
            ev = orjson.loads(line)
            meta = ev["object"]["metadata"]
            assert ev["type"] in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"), ev
            into.events.append((ev["type"], meta.get("name", ""), int(meta["resourceVersion"])))
            into.progress.set()


def test_root_placement_follows_reparenting_with_one_event_per_move(
    root_proxy: ProxyProcess, local_apiserver: Any
) -> None:
    async def run() -> None:
        ns = f"root-{uuid.uuid4().hex[:6]}"
        async with (
            httpx.AsyncClient(base_url=local_apiserver.url, timeout=10) as up,
            httpx.AsyncClient(base_url=root_proxy.url, timeout=20) as c,
        ):
            tree = Tree(up, ns)
            await tree.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            lo_d, hi_d = await _deployments_on_both_sides(tree)
            for name, parent in (("rs-a", lo_d), ("rs-b", hi_d), ("rs-c", None)):
                rs = await tree.replicaset(name, parent)
                for j in range(3):
                    await tree.pod(f"{name}-{j}", _ref("ReplicaSet", rs))
            await tree.pod("orphan-0", None)
            await tree.pod("orphan-1", None)
            job = await tree.post(
                f"/apis/batch/v1/namespaces/{ns}/jobs",
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": "j"},
                    "spec": {
                        "template": {**_template({}), "spec": {**_template({})["spec"], "restartPolicy": "Never"}}
                    },
                },
            )
            await tree.pod("of-a-job", _ref("Job", job))  # jobs are not a via kind: the Job is the root
            path = f"/api/v1/namespaces/{ns}/pods"

            async def lists() -> tuple[set[str], set[str], int]:
                lo, rv_lo = await _names(c, path, LOWER)
                hi, _ = await _names(c, path, UPPER)
                return lo, hi, rv_lo

            lo, hi, _ = await lists()
            assert (lo, hi) == tree.expected()
            assert not lo & hi and lo | hi == set(tree.pods)
            # The pods of rs-a are on the lower half with lo_d, those of rs-b on the upper with hi_d.
            assert {"rs-a-0", "rs-a-1", "rs-a-2"} <= lo and {"rs-b-0", "rs-b-1", "rs-b-2"} <= hi

            streams = await _open_streams(c, path)
            tasks = [
                asyncio.create_task(_follow(c, path, sel, s)) for sel, s in zip((LOWER, UPPER), streams, strict=True)
            ]
            try:
                steps = [
                    ("orphan rs-a", tree.reparent("rs-a", None)),
                    ("adopt rs-a by the upper deployment", tree.reparent("rs-a", hi_d)),
                    ("adopt rs-c by the lower deployment", tree.reparent("rs-c", lo_d)),
                    ("re-parent rs-b to the lower deployment", tree.reparent("rs-b", lo_d)),
                    ("a new pod of rs-b", tree.pod("rs-b-new", _ref("ReplicaSet", tree.rs["rs-b"]))),
                    ("delete rs-a orphaning its pods", tree.delete_rs_orphaning("rs-a")),
                ]
                for what, step in steps:
                    await step
                    want = tree.expected()
                    deadline = asyncio.get_running_loop().time() + 15
                    while True:
                        lo, hi, rv = await lists()
                        if (lo, hi) == want:
                            break
                        assert asyncio.get_running_loop().time() < deadline, (what, lo, hi, want)
                        await asyncio.sleep(0.05)  # poll with a deadline
                    for s in streams:
                        await s.wait_past(rv)
                    assert streams[0].state(rv) == want[0], what
                    assert streams[1].state(rv) == want[1], what
                    if what.startswith(("orphan", "adopt", "re-parent")):
                        # A move is never a MODIFIED: no pod changed so far.
                        assert not [e for s in streams for e in s.events if e[0] == "MODIFIED"], what
                for s in streams:
                    rvs = [e[2] for e in s.events]
                    assert rvs == sorted(rvs), "a watch stream went back in resourceVersion"
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            metrics = (await c.get("/metrics")).text
            assert 'range_filter_proxy_root_moves_total{resource="pods"}' in metrics

    asyncio.run(asyncio.wait_for(run(), 120))


def test_list_at_rv_is_the_replay_of_the_watch_under_churn(root_proxy: ProxyProcess, local_apiserver: Any) -> None:
    rnd = random.Random(37)

    async def run() -> None:
        ns = f"churn-{uuid.uuid4().hex[:6]}"
        async with (
            httpx.AsyncClient(base_url=local_apiserver.url, timeout=10) as up,
            httpx.AsyncClient(base_url=root_proxy.url, timeout=20) as c,
        ):
            tree = Tree(up, ns)
            await tree.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            lo_d, hi_d = await _deployments_on_both_sides(tree)
            parents = [lo_d, hi_d, None]
            for i in range(4):
                rs = await tree.replicaset(f"rs-{i}", rnd.choice(parents))
                for j in range(2):
                    await tree.pod(f"rs-{i}-{j}", _ref("ReplicaSet", rs))
            path = f"/api/v1/namespaces/{ns}/pods"
            streams = await _open_streams(c, path)
            tasks = [
                asyncio.create_task(_follow(c, path, sel, s)) for sel, s in zip((LOWER, UPPER), streams, strict=True)
            ]
            seen: list[tuple[int, int, set[str]]] = []  # (half, list rv, names)
            try:
                serial = 0
                for _ in range(40):  # bounded churn
                    op = rnd.random()
                    if op < 0.5:
                        await tree.reparent(f"rs-{rnd.randrange(4)}", rnd.choice(parents))
                    elif op < 0.75 or len(tree.pods) < 4:
                        i = rnd.randrange(4)
                        serial += 1
                        await tree.pod(f"rs-{i}-n{serial}", _ref("ReplicaSet", tree.rs[f"rs-{i}"]))
                    else:
                        await tree.delete_pod(rnd.choice(sorted(tree.pods)))
                    if rnd.random() < 0.4:
                        half = rnd.randrange(2)
                        names, rv = await _names(c, path, (LOWER, UPPER)[half])
                        seen.append((half, rv, names))
                want = tree.expected()
                deadline = asyncio.get_running_loop().time() + 15
                while True:
                    lo, rv = await _names(c, path, LOWER)
                    hi, _ = await _names(c, path, UPPER)
                    if (lo, hi) == want:
                        break
                    assert asyncio.get_running_loop().time() < deadline, (lo, hi, want)
                    await asyncio.sleep(0.05)  # poll with a deadline
                seen.append((0, rv, lo))
                for s in streams:
                    await s.wait_past(rv)
                assert len(seen) >= 5
                for half, list_rv, names in seen:
                    assert streams[half].state(list_rv) == names, (half, list_rv)
                assert streams[0].state(rv) | streams[1].state(rv) == set(tree.pods)
                assert not streams[0].state(rv) & streams[1].state(rv)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(asyncio.wait_for(run(), 120))
