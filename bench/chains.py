"""Owner chains (issue 37): the deployment controller's pod cache per manager, and watch cost by root vs unsharded.

Purpose
    Issue 37 point 5. On a private cluster (etcd, the local API server, the
    proxy caching pods, ReplicaSets and Deployments) the benchmark writes
    ``deployments`` trees straight into the API server (no controller creates
    them): a Deployment (``spec.paused: true``, so the controller only writes
    its status), one ReplicaSet with a controller ownerReference to it (the
    Deployment's template plus ``pod-template-hash``, named as the controller
    names it) and ``pods_per_rs`` pods with a controller ownerReference to
    the ReplicaSet (no node; nothing runs them). Then:

    * **managers**: for N in ``counts``, N real ``rangeshard
      controller-manager`` processes running only the built-in ``deployment``
      controller against the proxy; once every instance is active and the
      managers' caches hold every Deployment and every pod exactly once, each
      manager's pod informer size (``rangeshard_informer_cache_objects
      {controller="deployment",informer="pods"}``: placed by root through
      ``replicasets.apps``) against the ideal ``pods / N`` (target: within
      10 %) and against "today", ``pods``: what an unsharded pod informer
      holds in every manager.
    * **streams**: simulated consumers on the proxy. For each N in ``counts``,
      N pod watches each with the root-path selector of one N-th of the hash
      space (``hashing.root_path(["replicasets.apps"])``), and ``max(counts)`` watches with
      no shardSelector (every manager's pod informer before ``by: root``).
      Every pod is touched once (a merge patch of an annotation, straight to
      the API server, concurrently, paced at ``rate`` per second: the proxy's
      CPU per event depends on how events arrive -- one at a time costs more
      than in bursts -- so every step gets the same pacing, and its achieved
      rate is recorded); per watch the ``MODIFIED`` events that
      arrive; the proxy's CPU seconds (``/proc/<pid>/stat``) over the churn,
      less its idle rate (measured for ``idle_seconds`` with the watches open
      just before) times the churn's duration, per pod event it received;
      root over unsharded (the mean of an unsharded step before and one after
      the root steps) at the same number of watches as a ratio.
    * **re-parenting**: with the N = 4 root watches open, ``reparent``
      ReplicaSets get another Deployment as controller owner; each pod whose
      root changed quarter must arrive as one ``DELETED`` in the watch it left
      and one ``ADDED`` in the one it entered (the expected count is computed
      from the uids' hash keys).

Invariants
    * Everything listens on loopback; every process started here is stopped
      in ``finally`` (the managers per N, the cluster at the end).
    * Every wait is bounded by a deadline, every loop by a count.
    * The root watches of one N partition the pods: their ``MODIFIED``
      events add up to exactly the pods touched (recorded, checked by the
      quick test), and the managers' pod caches add up to all pods.

Concurrency model
    The caller's thread starts processes and polls metrics; object writes and
    the watch clients run on a private asyncio loop per step (``asyncio.run``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from bench.common import BenchCluster, make_pod, metric_value, proc_cpu_seconds, scrape, settled, wait_managers
from bench.fanout import equal_ranges
from controller_manager.controllers.deployment import template_hash
from controller_manager.controllers.rollout import HASH_LABEL, REVISION
from controller_manager.process import ManagerProcess, ManagerProcessError
from hashing import HashRange, hash_key, range_to_selector, root_path
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from registry import Registry

log = logging.getLogger(__name__)

CONTROLLER = "deployment"
NAMESPACE = "bench-chains"
VIA = ("replicasets.apps",)
PATH = root_path(VIA)
TOUCH_ANNOTATION = "bench.rangeshard.io/touch"
MERGE = {"Content-Type": "application/merge-patch+json"}
TOLERANCE = 0.10


@dataclass
class Tree:
    """One Deployment -> ReplicaSet -> pods tree as created (names and uids)."""

    deployment: str
    deployment_uid: str
    rs: str
    rs_uid: str
    pods: list[str] = field(default_factory=list)


# ---- objects ------------------------------------------------------------------------------------


def _template(name: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": name}},
        "spec": {"containers": [{"name": "app", "image": "registry.example.com/bench/app:1.2.3"}]},
    }


def _deployment(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "paused": True,  # the controller only writes status: the benchmark is about its caches
            "selector": {"matchLabels": {"app": name}},
            "template": _template(name),
        },
    }


def _owner(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": True}


def _replicaset(d: dict[str, Any], replicas: int) -> dict[str, Any]:
    """The ReplicaSet the deployment controller would create for ``d`` (name, hash label, revision 1)."""
    meta, spec = d["metadata"], d["spec"]
    thash = template_hash(spec["template"])
    labels = {**spec["template"]["metadata"]["labels"], HASH_LABEL: thash}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": f"{meta['name']}-{thash}",
            "namespace": NAMESPACE,
            "labels": labels,
            "annotations": {REVISION: "1"},
            "ownerReferences": [_owner("Deployment", meta["name"], meta["uid"])],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {**spec["template"], "metadata": {"labels": labels}},
        },
    }


async def _post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    for attempt in range(5):  # bounded retries of a transient failure (the API server is busy on 2 cores)
        try:
            r = await client.post(path, json=body)
        except httpx.TransportError:
            if attempt == 4:
                raise
            await asyncio.sleep(0.2 * (attempt + 1))
            continue
        if r.status_code == 201:
            out: dict[str, Any] = r.json()
            return out
        raise RuntimeError(f"POST {path}: HTTP {r.status_code}: {r.text[:200]}")
    raise AssertionError("unreachable")


def create_trees(api: str, deployments: int, pods_per_rs: int, concurrency: int = 16) -> tuple[list[Tree], float]:
    """Namespace + ``deployments`` trees straight into the API server; the trees and the seconds taken."""
    t0 = time.monotonic()

    async def go() -> list[Tree]:
        limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
        async with httpx.AsyncClient(base_url=api, timeout=60, limits=limits) as client:
            r = await client.post("/api/v1/namespaces", json={"metadata": {"name": NAMESPACE}})
            if r.status_code not in (201, 409):
                raise RuntimeError(f"create namespace: HTTP {r.status_code}")
            sem = asyncio.Semaphore(concurrency)

            async def one(i: int) -> Tree:
                async with sem:
                    d = await _post(
                        client, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", _deployment(f"d-{i}", pods_per_rs)
                    )
                    rs = await _post(
                        client, f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets", _replicaset(d, pods_per_rs)
                    )
                    rs_meta = rs["metadata"]
                    tree = Tree(d["metadata"]["name"], d["metadata"]["uid"], rs_meta["name"], rs_meta["uid"])
                    bodies = []
                    for j in range(pods_per_rs):
                        pod = make_pod(f"{rs_meta['name']}-{j}", NAMESPACE, owner_uid=rs_meta["uid"])
                        pod["metadata"]["ownerReferences"][0]["name"] = rs_meta["name"]
                        pod["metadata"]["labels"] = rs_meta["labels"]
                        bodies.append(pod)
                    created = await asyncio.gather(
                        *(_post(client, f"/api/v1/namespaces/{NAMESPACE}/pods", b) for b in bodies)
                    )
                    tree.pods = [p["metadata"]["name"] for p in created]
                    return tree

            return list(await asyncio.gather(*(one(i) for i in range(deployments))))

    trees = asyncio.run(go())
    return trees, time.monotonic() - t0


async def _patch_all(
    api: str, paths: Sequence[str], body: dict[str, Any], concurrency: int = 16, rate: float = 0.0
) -> None:
    """Merge-patch every path with ``body`` (bounded retries of transport errors), ``rate`` per second at most."""
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=api, timeout=60, limits=limits) as client:
        sem = asyncio.Semaphore(concurrency)
        payload = orjson.dumps(body)

        async def one(i: int, path: str) -> None:
            if rate > 0:  # the i-th patch not before t0 + i / rate: the same pacing in every step
                await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            async with sem:
                for attempt in range(5):
                    try:
                        r = await client.patch(path, content=payload, headers=MERGE)
                    except httpx.TransportError:
                        if attempt == 4:
                            raise
                        await asyncio.sleep(0.2 * (attempt + 1))
                        continue
                    if r.status_code != 200:
                        raise RuntimeError(f"PATCH {path}: HTTP {r.status_code}: {r.text[:200]}")
                    return

        await asyncio.gather(*(one(i, p) for i, p in enumerate(paths)))


# ---- managers -----------------------------------------------------------------------------------


def _cached(text: str, informer: str) -> int:
    return int(metric_value(text, "rangeshard_informer_cache_objects", controller=CONTROLLER, informer=informer))


_METRICS_RE = re.compile(r"metrics on (http://127\.0\.0\.1:\d+)/metrics")


def _metrics_url(proc: ManagerProcess, timeout: float) -> str:
    """The metrics URL ``proc`` logged (it binds port 0: no port picked here can be taken meanwhile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = _METRICS_RE.search(proc.log.read_text(errors="replace")) if proc.log.exists() else None
        if m is not None:
            return f"{m.group(1)}/metrics"
        if not proc.alive:
            raise ManagerProcessError(f"manager {proc.name} exited: {proc.log_tail()}")
        time.sleep(0.1)
    raise TimeoutError(f"manager {proc.name} did not log its metrics URL within {timeout:.0f}s")


def managers_row(cluster: BenchCluster, workdir: Path, n: int, trees: list[Tree], timeout: float) -> dict[str, Any]:
    """N deployment-controller managers: until all are active and their caches partition the objects; cache sizes."""
    if cluster.etcd is None or cluster.proxy is None:
        raise RuntimeError("the benchmark cluster is not started")
    workdir.mkdir(parents=True, exist_ok=True)
    pods = sum(len(t.pods) for t in trees)
    prefix = f"/bench-chains-{uuid.uuid4().hex[:8]}"
    etcd_url, proxy_url = cluster.etcd.url, cluster.proxy.url
    etcd = EtcdClient(EtcdConfig.from_urls(etcd_url))
    registry = Registry(etcd, prefix)
    procs: list[ManagerProcess] = []
    try:
        t0 = time.monotonic()

        for i in range(n):
            config = {
                "etcd": {"endpoints": [etcd_url]},
                "proxy": {"url": proxy_url},
                "leaseTTLSeconds": 5,
                "registryPrefix": prefix,
                "metrics": {"host": "127.0.0.1", "port": 0},
                "controllers": {CONTROLLER: {"workers": 2}},
            }
            path = workdir / f"m{i}.yaml"
            path.write_text(yaml.safe_dump(config))
            proc = ManagerProcess.of_config(
                f"m{i}", path, workdir / f"m{i}.log", instance_prefix=f"m{i}", log_level="info"
            )
            procs.append(cluster.add(proc))
        urls = [_metrics_url(proc, 60.0) for proc in procs]

        def active() -> tuple[bool, str]:
            return settled(registry, CONTROLLER, n)

        wait_managers(active, procs, timeout, f"{n} deployment instances active")
        active_s = time.monotonic() - t0

        last: list[Any] = [None, 0.0]

        def partitioned() -> tuple[bool, str]:
            # Every pod and Deployment cached once, every manager holding some, and the same sizes for 1 s
            # (a manager that still holds a wider range and one that has not listed yet could add up too).
            texts = [scrape(u, timeout=10) for u in urls]
            sizes = [(_cached(t, "pods"), _cached(t, "deployments")) for t in texts]
            p, d = sum(x[0] for x in sizes), sum(x[1] for x in sizes)
            full = p == pods and d == len(trees) and all(x[0] > 0 for x in sizes)
            now = time.monotonic()
            if sizes != last[0]:
                last[:] = [sizes, now]
            return full and now - last[1] >= 1.0, f"{p} of {pods} pods, {d} of {len(trees)} Deployments: {sizes}"

        wait_managers(partitioned, procs, timeout, "the managers' caches to partition pods and Deployments")
        synced_s = time.monotonic() - t0
        texts = [scrape(u, timeout=10) for u in urls]
    finally:
        cluster.stop_managers(procs, timeout=20)
        etcd.close()
    per = [_cached(t, "pods") for t in texts]
    ideal = pods / n
    deviation = [round((c - ideal) / ideal * 100, 1) for c in per]
    return {
        "managers": n,
        "pods": pods,
        "podsPerManager": per,
        "deploymentsPerManager": [_cached(t, "deployments") for t in texts],
        "replicaSetsPerManager": [_cached(t, "replicasets") for t in texts],
        "idealPodsPerManager": round(ideal, 1),
        "deviationPercent": deviation,
        "maxAbsDeviationPercent": max(abs(x) for x in deviation),
        "withinTolerance": all(abs(c - ideal) <= TOLERANCE * ideal for c in per),
        "todayPodsPerManager": pods,
        "startToActiveSeconds": round(active_s, 2),
        "startToSyncedSeconds": round(synced_s, 2),
    }


# ---- streams ------------------------------------------------------------------------------------


@dataclass
class Stream:
    """What one simulated consumer's pod watch received (events by type, keys of DELETED/ADDED)."""

    selector: str | None
    types: Counter[str] = field(default_factory=Counter)
    added: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)
    error: str = ""


async def _watch(proxy: str, rv: str, stream: Stream) -> None:
    params = {"watch": "true", "resourceVersion": rv, "allowWatchBookmarks": "true"}
    if stream.selector is not None:
        params["shardSelector"] = stream.selector
    try:
        async with (
            httpx.AsyncClient(base_url=proxy, timeout=httpx.Timeout(30, read=None)) as client,
            client.stream("GET", "/api/v1/pods", params=params) as resp,
        ):
            if resp.status_code != 200:
                stream.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return
            async for line in resp.aiter_lines():
                if not line:
                    continue
                ev = orjson.loads(line)
                kind = ev.get("type", "")
                stream.types[kind] += 1
                if kind in ("ADDED", "DELETED"):
                    name = ((ev.get("object") or {}).get("metadata") or {}).get("name", "")
                    (stream.added if kind == "ADDED" else stream.deleted).add(name)
        stream.error = stream.error or "stream ended"
    except (httpx.HTTPError, OSError) as e:
        stream.error = f"{type(e).__name__}: {e}"


def _pod_events(resp: httpx.Response) -> tuple[float, float]:
    """The proxy's pod watch events received from the upstream and delivered to watchers (counters)."""
    text = resp.text
    return (
        metric_value(text, "range_filter_proxy_events_received_total", resource="pods"),
        metric_value(text, "range_filter_proxy_events_delivered_total", resource="pods"),
    )


async def _wait(predicate: Any, timeout: float, what: str, detail: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            more = f": {detail()}" if detail is not None else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{more}")
        await asyncio.sleep(0.05)


async def _streams_step(
    cluster: BenchCluster,
    selectors: list[str | None],
    trees: list[Tree],
    round_: int,
    reparent: int,
    timeout: float,
    idle_seconds: float,
    rate: float,
) -> dict[str, Any]:
    """Open one watch per selector at the current RV, touch every pod once, count; optionally re-parent."""
    assert cluster.proxy is not None and cluster.apiserver is not None
    proxy, api, pid = cluster.proxy.url, cluster.apiserver.url, cluster.proxy_pid
    async with httpx.AsyncClient(base_url=proxy, timeout=30) as client:
        rv = (await client.get("/api/v1/pods", params={"limit": "1"})).json()["metadata"]["resourceVersion"]
        base = metric_value((await client.get("/metrics")).text, "range_filter_proxy_downstream_watches")
    streams = [Stream(s) for s in selectors]
    tasks = [asyncio.create_task(_watch(proxy, rv, s)) for s in streams]
    pod_paths = [f"/api/v1/namespaces/{NAMESPACE}/pods/{p}" for t in trees for p in t.pods]
    pods = len(pod_paths)
    want = pods if selectors[0] is not None else pods * len(selectors)
    try:
        async with httpx.AsyncClient(base_url=proxy, timeout=30) as client:

            async def opened() -> bool:
                text = (await client.get("/metrics")).text
                return metric_value(text, "range_filter_proxy_downstream_watches") >= base + len(selectors)

            for _ in range(int(timeout / 0.1)):
                if await opened():
                    break
                await asyncio.sleep(0.1)
            else:
                raise TimeoutError("the watches did not open")
            counts0 = _pod_events(await client.get("/metrics"))
        # The proxy's own CPU with the watches open and nothing changing (probes, bookmarks, the heap keeper):
        # subtracted from the churn's at the same rate, so a slower churn (a busier host) does not count as cost.
        idle0, i0 = proc_cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(idle_seconds)
        idle_rate = (proc_cpu_seconds(pid) - idle0) / (time.monotonic() - i0)
        cpu0, t0 = proc_cpu_seconds(pid), time.monotonic()
        await _patch_all(api, pod_paths, {"metadata": {"annotations": {TOUCH_ANNOTATION: str(round_)}}}, rate=rate)
        patched = time.monotonic() - t0
        await _wait(
            lambda: sum(s.types["MODIFIED"] for s in streams) >= want,
            timeout,
            f"{want} MODIFIED events",
            lambda: f"per watch {[dict(s.types) for s in streams]}, errors {[s.error for s in streams]}",
        )
        elapsed, cpu = time.monotonic() - t0, proc_cpu_seconds(pid) - cpu0
        async with httpx.AsyncClient(base_url=proxy, timeout=30) as client:
            counts1 = _pod_events(await client.get("/metrics"))
        received, delivered = (b - a for a, b in zip(counts0, counts1, strict=True))
        modified = [s.types["MODIFIED"] for s in streams]
        if reparent:
            await _reparent(trees, streams, reparent, api, timeout)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    row: dict[str, Any] = {
        "watches": len(selectors),
        "mode": "root" if selectors[0] is not None else "unsharded",
        "podsTouched": pods,
        "modifiedPerWatch": modified,
        "modifiedTotal": sum(modified),
        "idealPerWatch": round(pods / len(selectors), 1) if selectors[0] is not None else pods,
        "patchSeconds": round(patched, 2),
        "churnSeconds": round(elapsed, 2),
        "pacedPerSecond": rate or None,
        "podEventsPerSecond": round(pods / elapsed, 1),
        "proxyEventsReceived": int(received),
        "proxyEventsDelivered": int(delivered),
        "proxyCpuSeconds": round(cpu, 3),
        "proxyIdleCpuPerSecond": round(idle_rate, 4),
        "proxyCpuSecondsOverIdle": round(max(cpu - idle_rate * elapsed, 0.0), 3),
        "proxyCpuMsPerPodEventRaw": round(cpu / max(received, 1) * 1000, 4),
        "proxyCpuMsPerPodEvent": round(max(cpu - idle_rate * elapsed, 0.0) / max(received, 1) * 1000, 4),
        "errors": [s.error for s in streams if s.error and "Cancel" not in s.error],
    }
    if reparent:
        row["reparent"] = _moves_summary(streams, trees, reparent)
    return row


def _quarter(key: int, ranges: list[HashRange]) -> int:
    return next(i for i, r in enumerate(ranges) if r.contains(key))


def _reparent_plan(trees: list[Tree], count: int) -> list[tuple[Tree, Tree]]:
    """ReplicaSet of tree ``i`` -> the Deployment of tree ``i + len/2`` (so old and new roots differ)."""
    half = len(trees) // 2
    return [(trees[i], trees[(i + half) % len(trees)]) for i in range(min(count, half))]


def _expected_moves(trees: list[Tree], count: int, watches: int) -> int:
    ranges = equal_ranges(watches)
    return sum(
        len(rs.pods)
        for rs, d in _reparent_plan(trees, count)
        if _quarter(hash_key(rs.deployment_uid), ranges) != _quarter(hash_key(d.deployment_uid), ranges)
    )


async def _reparent(trees: list[Tree], streams: list[Stream], count: int, api: str, timeout: float) -> None:
    """Give ``count`` ReplicaSets another Deployment as controller owner; wait for the pods' moves."""
    plan = _reparent_plan(trees, count)
    want = _expected_moves(trees, count, len(streams))
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
    async with httpx.AsyncClient(base_url=api, timeout=60, limits=limits) as client:
        sem = asyncio.Semaphore(16)

        async def one(rs: Tree, d: Tree) -> None:
            body = {"metadata": {"ownerReferences": [_owner("Deployment", d.deployment, d.deployment_uid)]}}
            async with sem:
                r = await client.patch(
                    f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets/{rs.rs}",
                    content=orjson.dumps(body),
                    headers=MERGE,
                )
                if r.status_code != 200:
                    raise RuntimeError(f"re-parent {rs.rs}: HTTP {r.status_code}: {r.text[:200]}")

        await asyncio.gather(*(one(rs, d) for rs, d in plan))

    def arrived() -> bool:
        return sum(s.types["DELETED"] for s in streams) >= want and sum(s.types["ADDED"] for s in streams) >= want

    await _wait(arrived, timeout, f"{want} DELETED/ADDED moves")
    await asyncio.sleep(1.5)  # past the proxy's hold (1 s): any extra (doubled) move would show now


def _moves_summary(streams: list[Stream], trees: list[Tree], count: int) -> dict[str, Any]:
    moved = {p for rs, _ in _reparent_plan(trees, count) for p in rs.pods}
    deleted = sum(s.types["DELETED"] for s in streams)
    added = sum(s.types["ADDED"] for s in streams)
    expected = _expected_moves(trees, count, len(streams))
    return {
        "replicaSetsReparented": len(_reparent_plan(trees, count)),
        "podsUnderThem": len(moved),
        "expectedMoves": expected,
        "deleted": deleted,
        "added": added,
        "exact": deleted == added == expected
        and all(s.added == s.added & moved and s.deleted == s.deleted & moved for s in streams),
    }


def run(
    workdir: Path,
    *,
    deployments: int,
    counts: Sequence[int] = (1, 2, 4),
    pods_per_rs: int = 3,
    reparent: int = 100,
    idle_seconds: float = 5.0,
    rate: float = 75.0,
) -> dict[str, Any]:
    """The whole section on its own cluster (see module docstring), stopped at the end."""
    cluster = BenchCluster(workdir / "cluster", proxy_resources=("pods", "replicasets.apps", "deployments.apps"))
    cluster.start()
    try:
        if cluster.apiserver is None:
            raise RuntimeError("the benchmark cluster is not started")
        trees, created = create_trees(cluster.apiserver.url, deployments, pods_per_rs)
        pods = sum(len(t.pods) for t in trees)
        log.info("chains: %d trees, %d pods in %.1fs", len(trees), pods, created)
        timeout = 120 + pods / 50
        managers = [managers_row(cluster, workdir / f"n{n}", n, trees, timeout) for n in counts]
        log.info("chains managers: %s", managers)
        rounds = 0

        def step(selectors: list[str | None], moves: int = 0) -> dict[str, Any]:
            nonlocal rounds
            rounds += 1
            return asyncio.run(_streams_step(cluster, selectors, trees, rounds, moves, timeout, idle_seconds, rate))

        unsharded = step([None] * max(counts))
        rooted = [
            step([range_to_selector(r, PATH) for r in equal_ranges(n)], reparent if n == max(counts) else 0)
            for n in counts
        ]
        # Unsharded again after the root steps: the host's drift shows as the spread of the two.
        unsharded_after = step([None] * max(counts))
        root_cpu = rooted[-1]["proxyCpuMsPerPodEvent"]
        base = (unsharded["proxyCpuMsPerPodEvent"] + unsharded_after["proxyCpuMsPerPodEvent"]) / 2
        base_raw = (unsharded["proxyCpuMsPerPodEventRaw"] + unsharded_after["proxyCpuMsPerPodEventRaw"]) / 2
        events = {
            "unsharded": unsharded,
            "root": rooted,
            "unshardedAfter": unsharded_after,
            "cpuPerEventRootOverUnsharded": round(root_cpu / base, 3) if base else None,
            "cpuPerEventRootOverUnshardedRaw": round(rooted[-1]["proxyCpuMsPerPodEventRaw"] / base_raw, 3)
            if base_raw
            else None,
            "comparedAtWatches": rooted[-1]["watches"],
        }
    finally:
        cluster.stop()
    return {
        "deployments": deployments,
        "podsPerReplicaSet": pods_per_rs,
        "pods": pods,
        "createSeconds": round(created, 1),
        "touchPacedPerSecond": rate or None,
        "selectorPath": PATH,
        "target": f"pods per manager within {int(TOLERANCE * 100)} % of pods / N",
        "managers": managers,
        "events": events,
    }
