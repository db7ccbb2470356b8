"""Scale: memory and throughput per manager as N grows, and the proxy at a million objects.

Purpose
    Issue 27. Two measurements, each with its object counts as parameters:

    * **managers** (:func:`run_managers`): ``objects`` ReplicaSets with
      ``replicas: 0`` (no pods; their status is written by the benchmark
      first, so a reconcile finds nothing to write) on a private cluster
      (etcd, the local API server, the proxy), reconciled by the built-in
      ``replicaset`` controller in N = 1, 2, 4, ... real ``rangeshard
      controller-manager`` processes (:class:`controller_manager.process.ManagerProcess`).
      Per N: seconds from spawn to every instance ``active`` (synced, unlocked),
      per-manager RSS (``VmRSS``) and peak RSS (``VmHWM``) from
      ``/proc/<pid>/status``, the informer cache sizes
      (``rangeshard_informer_cache_objects``), and reconciles/s over a window
      while every manager still has a backlog (the resync of its whole range
      after it became active: demand above capacity). ``reconcileDelaySeconds``
      (the built-in fault injection: each reconcile waits that long, an I/O-bound
      reconcile) makes the capacity ``workers / delay`` per manager; with 0 the
      reconcile is CPU-bound and N managers on C cores cannot exceed C x one.
      An idle manager (the same config, no ReplicaSets yet) gives ``RSS(idle)``.
      Targets (ratios of one run): ``throughput(N) >= 0.9 N throughput(1)``;
      ``RSS(N) - RSS(idle) <= (1/N + 0.1) (RSS(1) - RSS(idle))``. For N > 1
      the managers are then restarted one at a time (graceful stop: the range
      is parked; the same id takes it back, ``rejoinGraceSeconds``) and their
      RSS measured again once their caches hold every ReplicaSet
      (``afterRollingRestartRssMiB``): processes that never held a wider range
      than their own, against those that did while the others joined.
    * **proxy** (:func:`run_proxy`): the unmodified ``rangeshard proxy``
      process caching ``objects`` pods (~1.2 KiB of JSON each) from
      :mod:`bench.upstream_server` (a synthetic API server: a million pods
      through the local API server into etcd would take hours and exceed
      etcd's default 2 GiB quota). Measured: seconds to the first sync, RSS per
      cached object over its raw JSON size (RSS after sync minus the RSS of the
      same proxy over one pod), p50/max of consistent LISTs of 1/64 ranges, and
      events delivered per proxy CPU second with ``small`` (16) and ``large``
      (1,000) concurrent range watchers, each on its own equal slice (every
      event reaches exactly one of them). Targets: memory ratio <= 2, LIST p50
      <= 200 ms, per-CPU ratio large/small >= 0.5.

    :func:`bare_loop` times a fixed pure-Python loop at the start of a run:
    the machine's load at that moment, published beside each run.

Invariants
    * Every process started here is stopped in ``finally``; every wait is
      bounded by a deadline.
    * ``--quick`` sizes only check behaviour: every ReplicaSet is in exactly
      one manager's cache, every event reaches exactly one watcher, the 64
      LISTs partition the cache.

Concurrency model
    The caller's thread starts processes and polls; object creation and the
    watch clients run on a private asyncio loop (``asyncio.run``).
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
import threading
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from bench import reconcile_profile
from bench.common import (
    BenchCluster,
    metric_value,
    percentile,
    proc_cpu_seconds,
    real_pod,
    scrape,
    settled,
    stored_pod,
    wait_managers,
)
from bench.fanout import equal_ranges
from bench.feed import NAMESPACE as FEED_NAMESPACE
from bench.feed import SENT_ANNOTATION
from bench.throughput import _Client, _run_loop, _spawn_printing_port, _watch
from controller_manager.process import ManagerProcess
from hashing import UID_PATH, range_to_selector
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.process import free_port
from registry import Registry

CONTROLLER = "replicaset"
RS_NAMESPACE = "bench-scale-rs"
BARE_LOOP_ITERATIONS = 3_000_000


def bare_loop(iterations: int = BARE_LOOP_ITERATIONS) -> dict[str, Any]:
    """Time a fixed pure-Python loop (integer arithmetic, no allocation): the machine's speed right now."""
    t0 = time.perf_counter()
    acc = 0
    for i in range(iterations):
        acc = (acc + i * 7) & 0xFFFF
    seconds = time.perf_counter() - t0
    return {"iterations": iterations, "seconds": round(seconds, 3), "loopsPerSecond": round(iterations / seconds)}


def proc_memory(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of a process in KiB, from ``/proc/<pid>/status`` (0 if gone)."""
    out = {"rssKiB": 0, "peakRssKiB": 0}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            out["rssKiB"] = int(line.split()[1])
        elif line.startswith("VmHWM:"):
            out["peakRssKiB"] = int(line.split()[1])
    return out


def _stop(procs: list[subprocess.Popen[bytes]], timeout: float = 20.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


# ---- managers -----------------------------------------------------------------------------------


def _replicaset(i: int) -> dict[str, Any]:
    labels = {"app": "bench-scale", "rs": f"rs-{i}"}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": f"rs-{i}", "labels": {"app": "bench-scale"}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "app", "image": "registry.example.com/bench/app:1.2.3"}]},
            },
        },
    }


def create_replicasets(api: str, n: int, namespace: str = RS_NAMESPACE, concurrency: int = 8) -> float:
    """Namespace + ``n`` ReplicaSets with ``replicas: 0`` and their status already right; returns seconds taken."""
    t0 = time.monotonic()

    async def go() -> None:
        async with httpx.AsyncClient(base_url=api, timeout=60) as client:
            resp = await client.post("/api/v1/namespaces", json={"metadata": {"name": namespace}})
            if resp.status_code not in (201, 409):
                raise RuntimeError(f"create namespace: HTTP {resp.status_code}")
            path = f"/apis/apps/v1/namespaces/{namespace}/replicasets"
            sem = asyncio.Semaphore(concurrency)

            async def one(i: int) -> None:
                async with sem:
                    r = await client.post(path, json=_replicaset(i))
                    if r.status_code != 201:
                        raise RuntimeError(f"create replicaset: HTTP {r.status_code}: {r.text[:200]}")
                    rs = r.json()
                    meta = rs["metadata"]
                    rs["status"] = {
                        "replicas": 0,
                        "fullyLabeledReplicas": 0,
                        "readyReplicas": 0,
                        "availableReplicas": 0,
                        "observedGeneration": meta.get("generation", 1),
                    }
                    r = await client.put(f"{path}/{meta['name']}/status", json=rs)
                    if r.status_code != 200:
                        raise RuntimeError(f"write replicaset status: HTTP {r.status_code}: {r.text[:200]}")

            await asyncio.gather(*(one(i) for i in range(n)))

    asyncio.run(go())
    return time.monotonic() - t0


def _pod_for(rs: dict[str, Any], j: int) -> dict[str, Any]:
    """Pod ``j`` of ``rs``, as its controller would create it (the template's labels, a controller owner)."""
    meta = rs["metadata"]
    template = rs["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{meta['name']}-{j}",
            "labels": dict(template["metadata"]["labels"]),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": template["spec"],
    }


def add_pods(api: str, per_rs: int, namespace: str = RS_NAMESPACE, concurrency: int = 8) -> float:
    """Give every ReplicaSet of ``namespace`` ``per_rs`` pods and the status that counts them; seconds taken.

    ``spec.replicas`` becomes ``per_rs``, the pods are created with the ReplicaSet as controller owner (none
    is ready: no kubelet), and the status says ``replicas``/``fullyLabeledReplicas`` = ``per_rs``: a
    reconcile then finds everything right and writes nothing, as in the no-pod case, but reads its pods.
    """
    t0 = time.monotonic()

    async def go() -> None:
        async with httpx.AsyncClient(base_url=api, timeout=60) as client:
            path = f"/apis/apps/v1/namespaces/{namespace}/replicasets"
            listed = (await client.get(path)).json()["items"]
            sem = asyncio.Semaphore(concurrency)

            async def one(rs: dict[str, Any]) -> None:
                async with sem:
                    name = rs["metadata"]["name"]
                    r = await client.patch(
                        f"{path}/{name}",
                        json={"spec": {"replicas": per_rs}},
                        headers={"Content-Type": "application/merge-patch+json"},
                    )
                    if r.status_code != 200:
                        raise RuntimeError(f"scale replicaset: HTTP {r.status_code}: {r.text[:200]}")
                    rs = r.json()
                    for j in range(per_rs):
                        r = await client.post(f"/api/v1/namespaces/{namespace}/pods", json=_pod_for(rs, j))
                        if r.status_code != 201:
                            raise RuntimeError(f"create pod: HTTP {r.status_code}: {r.text[:200]}")
                    rs["status"] = {
                        "replicas": per_rs,
                        "fullyLabeledReplicas": per_rs,
                        "readyReplicas": 0,
                        "availableReplicas": 0,
                        "observedGeneration": rs["metadata"].get("generation", 1),
                    }
                    r = await client.put(f"{path}/{name}/status", json=rs)
                    if r.status_code != 200:
                        raise RuntimeError(f"write replicaset status: HTTP {r.status_code}: {r.text[:200]}")

            await asyncio.gather(*(one(rs) for rs in listed))

    asyncio.run(go())
    return time.monotonic() - t0


class _Managers:
    """N manager processes of the built-in replicaset controller on one registry prefix."""

    def __init__(self, cluster: BenchCluster, workdir: Path, *, workers: int, delay: float) -> None:
        if cluster.etcd is None or cluster.proxy is None:
            raise RuntimeError("the benchmark cluster is not started")
        self.cluster = cluster
        self.etcd_url, self.proxy_url = cluster.etcd.url, cluster.proxy.url
        self.workdir = workdir
        self.workers, self.delay = workers, delay
        self.prefix = f"/bench-scale-{uuid.uuid4().hex[:8]}"
        self.etcd = EtcdClient(EtcdConfig.from_urls(cluster.etcd.url))
        self.registry = Registry(self.etcd, self.prefix)
        self.procs: list[ManagerProcess] = []
        self.metrics_urls: list[str] = []

    def spawn(self, n: int) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            port = free_port()
            config = {
                "etcd": {"endpoints": [self.etcd_url]},
                "proxy": {"url": self.proxy_url},
                "leaseTTLSeconds": 5,
                # A graceful stop parks the range; the same id started again takes it back (rolling restart).
                "rejoinGraceSeconds": 120,
                "registryPrefix": self.prefix,
                "metrics": {"host": "127.0.0.1", "port": port},
                "controllers": {CONTROLLER: {"workers": self.workers, "reconcileDelaySeconds": self.delay}},
            }
            path = self.workdir / f"m{i}.yaml"
            path.write_text(yaml.safe_dump(config))
            self.metrics_urls.append(f"http://127.0.0.1:{port}/metrics")
            self.procs.append(self._process(i).start())

    def _process(self, i: int) -> ManagerProcess:
        """Manager ``i`` (instance id prefix ``m<i>``) on its config file, not started yet."""
        path, log = self.workdir / f"m{i}.yaml", self.workdir / f"m{i}.log"
        return ManagerProcess.of_config(f"m{i}", path, log, instance_prefix=f"m{i}", log_level="warning")

    def restart_one(self, i: int, timeout: float) -> None:
        """Stop manager ``i`` gracefully (it parks its range) and start the same id again, until all are active."""
        self.procs[i].terminate(timeout=20)
        self.procs[i] = self._process(i).start()
        self.wait_active(len(self.procs), timeout)

    def wait_cached(self, objects: int, timeout: float, pods: int = 0) -> None:
        """Until the managers' caches hold ``objects`` ReplicaSets and ``pods`` pods in all (each its range)."""

        def cached() -> tuple[bool, str]:
            name = "rangeshard_informer_cache_objects"
            texts = self.scrape_all()
            total = sum(int(metric_value(t, name, informer="replicasets")) for t in texts)
            in_pods = sum(int(metric_value(t, name, informer="pods")) for t in texts)
            ok = total == objects and in_pods == pods
            return ok, f"{total} of {objects} ReplicaSets, {in_pods} of {pods} pods cached"

        wait_managers(cached, self.procs, timeout, "the managers' caches to hold every ReplicaSet")

    def wait_active(self, n: int, timeout: float) -> None:
        """Every one of the ``n`` instances registered, active and unlocked (a manager that exits raises)."""
        wait_managers(partial(settled, self.registry, CONTROLLER, n), self.procs, timeout, f"{n} replicaset instances")

    def scrape_all(self) -> list[str]:
        return [scrape(u, timeout=10) for u in self.metrics_urls]

    def close(self) -> None:
        self.cluster.stop_managers(self.procs, timeout=20)
        self.etcd.close()


def _manager_row(ms: _Managers, texts: list[str]) -> list[dict[str, Any]]:
    rows = []
    for i, (p, text) in enumerate(zip(ms.procs, texts, strict=True)):
        rows.append(
            {
                "manager": f"m{i}",
                **proc_memory(p.pid or 0),
                "cacheObjects": {
                    inf: int(metric_value(text, "rangeshard_informer_cache_objects", informer=inf))
                    for inf in ("replicasets", "pods")
                },
                "reconciles": int(metric_value(text, "rangeshard_reconciles_total", controller=CONTROLLER)),
                "cpuSeconds": round(proc_cpu_seconds(p.pid), 2),
            }
        )
    return rows


class _Sampler:
    """Samples every manager's counters every ``interval`` seconds on a named thread, from spawn to stop.

    Per sample and manager: time, ``rangeshard_reconciles_total``, ``rangeshard_reconcile_cpu_seconds_total``,
    ``rangeshard_workqueue_depth``, whether the instance is ``active`` and the process's CPU seconds.
    """

    def __init__(self, ms: _Managers, interval: float = 0.5) -> None:
        self.ms = ms
        self.interval = interval
        self.samples: list[list[tuple[float, float, float, float, bool, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-scale-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            procs, urls = list(self.ms.procs), list(self.ms.metrics_urls)
            row = []
            for p, url in zip(procs, urls, strict=True):
                try:
                    text = scrape(url, timeout=5)
                except Exception:  # not listening yet, or restarting: no sample of it this time
                    text = ""
                t = time.monotonic()
                active = metric_value(text, "rangeshard_instance_state", controller=CONTROLLER, state="active")
                row.append(
                    (
                        t,
                        metric_value(text, "rangeshard_reconciles_total", controller=CONTROLLER),
                        metric_value(text, "rangeshard_reconcile_cpu_seconds_total", controller=CONTROLLER),
                        metric_value(text, "rangeshard_workqueue_depth", controller=CONTROLLER),
                        active > 0,
                        proc_cpu_seconds(p.pid),
                    )
                )
            self.samples.append(row)


def backlog_rates(samples: list[list[tuple[float, float, float, float, bool, float]]]) -> list[dict[str, float]]:
    """Per manager: reconciles, seconds and CPU over the sample intervals in which it was active with a backlog
    (active and a non-empty queue at both ends): what it does while demand exceeds its capacity."""
    managers = max((len(row) for row in samples), default=0)
    out = []
    for m in range(managers):
        series = [row[m] for row in samples if len(row) > m]
        done = seconds = pcpu = rcpu = 0.0
        for a, b in itertools.pairwise(series):
            if a[4] and b[4] and a[3] > 0 and b[3] > 0 and b[1] >= a[1]:
                done += b[1] - a[1]
                seconds += b[0] - a[0]
                rcpu += b[2] - a[2]
                pcpu += b[5] - a[5]
        out.append({"reconciles": done, "seconds": seconds, "reconcileCpu": rcpu, "processCpu": pcpu})
    return out


def _one_count(
    cluster: BenchCluster,
    workdir: Path,
    n: int,
    *,
    workers: int,
    delay: float,
    window: float,
    timeout: float,
    objects: int = 0,
    pods: int = 0,
    restart: bool = True,
) -> dict[str, Any]:
    ms = _Managers(cluster, workdir, workers=workers, delay=delay)
    sampler = _Sampler(ms)
    try:
        t0 = time.monotonic()
        ms.spawn(n)
        sampler.start()
        ms.wait_active(n, timeout)
        synced = time.monotonic() - t0
        # Reconciles/s while every manager still works through the resync of its range.
        before = ms.scrape_all()
        cpu_before = [proc_cpu_seconds(p.pid) for p in ms.procs]
        t1 = time.monotonic()
        time.sleep(window)  # the measurement window itself, not synchronisation
        after = ms.scrape_all()
        cpu_after = [proc_cpu_seconds(p.pid) for p in ms.procs]
        elapsed = time.monotonic() - t1
        sampler.stop()
        backlog = backlog_rates(sampler.samples)

        def delta(name: str) -> list[float]:
            return [
                metric_value(a, name, controller=CONTROLLER) - metric_value(b, name, controller=CONTROLLER)
                for a, b in zip(after, before, strict=True)
            ]

        done = delta("rangeshard_reconciles_total")
        reconcile_cpu = delta("rangeshard_reconcile_cpu_seconds_total")
        process_cpu = [a - b for a, b in zip(cpu_after, cpu_before, strict=True)]
        depth = [metric_value(a, "rangeshard_workqueue_depth", controller=CONTROLLER) for a in after]
        rows = _manager_row(ms, after)
        restarted: list[int] | None = None
        if objects and n > 1 and restart:
            # A rolling restart (each id parks and takes its range back): every process then lists only
            # its own range, never having held a wider one while the others joined.
            for i in range(n):
                ms.restart_one(i, timeout)
            ms.wait_cached(objects, timeout, pods)
            restarted = [proc_memory(p.pid or 0)["rssKiB"] for p in ms.procs]
    finally:
        sampler.stop()
        ms.close()
    rss = [r["rssKiB"] for r in rows]
    busy = [b for b in backlog if b["seconds"] > 0 and b["reconciles"] > 0]
    busy_done = sum(b["reconciles"] for b in busy)
    return {
        "managers": n,
        "startToSyncedSeconds": round(synced, 2),
        "reconcilesPerSecond": round(sum(done) / elapsed, 1),
        # Capacity: the sum over managers of each one's rate while it was active with a backlog
        # (sampled every 0.5 s from spawn), whether or not the backlogs overlapped in time; and the
        # CPU per reconcile over the same intervals (the reconciling threads' own thread_time, and the
        # whole processes': informers, HTTP, metrics too).
        "backlogReconcilesPerSecond": round(sum(b["reconciles"] / b["seconds"] for b in busy), 1) if busy else None,
        "managersWithBacklog": len(busy),
        "backlogSeconds": [round(b["seconds"], 1) for b in backlog],
        "reconcileCpuMsPerReconcile": _per_reconcile(
            [b["reconcileCpu"] for b in busy], busy_done, reconcile_cpu, sum(done)
        ),
        "processCpuMsPerReconcile": _per_reconcile([b["processCpu"] for b in busy], busy_done, process_cpu, sum(done)),
        # Where the two figures above come from: the backlog intervals, or (no manager ever had a backlog
        # in a sample interval: too few objects) the fixed window after all were active.
        "cpuMeasuredOver": "backlog" if busy_done else "window",
        # The same over the fixed window after all were active (a manager may have drained by then).
        "windowReconcileCpuMsPerReconcile": round(sum(reconcile_cpu) / sum(done) * 1000, 3) if sum(done) else None,
        "windowProcessCpuMsPerReconcile": round(sum(process_cpu) / sum(done) * 1000, 3) if sum(done) else None,
        "processCpuSeconds": round(sum(process_cpu), 2),
        "saturated": all(d > 0 for d in depth),
        "queueDepthAtEnd": [int(d) for d in depth],
        "maxRssMiB": round(max(rss) / 1024, 1),
        "meanRssMiB": round(sum(rss) / len(rss) / 1024, 1),
        "maxPeakRssMiB": round(max(r["peakRssKiB"] for r in rows) / 1024, 1),
        "cachedReplicaSets": sum(r["cacheObjects"]["replicasets"] for r in rows),
        "cachedPods": sum(r["cacheObjects"]["pods"] for r in rows),
        "reconcilesTotal": sum(r["reconciles"] for r in rows),
        "perManager": rows,
        "afterRollingRestartRssMiB": [round(k / 1024, 1) for k in restarted] if restarted else None,
    }


def _per_reconcile(
    busy_cpu: list[float], busy_done: float, window_cpu: list[float], window_done: float
) -> float | None:
    """CPU ms per reconcile over the backlog intervals, else over the window (``None``: no reconcile at all)."""
    if busy_done:
        return round(sum(busy_cpu) / busy_done * 1000, 3)
    return round(sum(window_cpu) / window_done * 1000, 3) if window_done else None


def _rates(rows: list[dict[str, Any]], idle_mib: float) -> None:
    """Speedup, memory share and their targets of each row, against the first row (N = 1)."""
    base = rows[0]
    base_rate = base["reconcilesPerSecond"]
    base_backlog = base.get("backlogReconcilesPerSecond")
    base_mem = base["maxRssMiB"] - idle_mib
    for r in rows:
        n = r["managers"] / base["managers"]
        r["speedup"] = round(r["reconcilesPerSecond"] / base_rate, 2) if base_rate else None
        backlog = r.get("backlogReconcilesPerSecond")
        r["backlogSpeedup"] = round(backlog / base_backlog, 2) if backlog and base_backlog else None
        r["throughputTarget"] = round(0.9 * n, 2)
        r["memoryOverIdleMiB"] = round(r["maxRssMiB"] - idle_mib, 1)
        r["memoryShare"] = round((r["maxRssMiB"] - idle_mib) / base_mem, 3) if base_mem > 0 else None
        r["memoryTarget"] = round(1 / n + 0.1, 3)
        after = r.get("afterRollingRestartRssMiB")
        if after and base_mem > 0:
            r["afterRollingRestartMemoryShare"] = round((max(after) - idle_mib) / base_mem, 3)


def run_managers(
    workdir: Path,
    *,
    objects: int,
    counts: list[int],
    workers: int = 4,
    delay: float = 0.02,
    window: float = 5.0,
    pods_per_rs: int = 0,
    restart_without_pods: bool = True,
) -> dict[str, Any]:
    """The managers part (see module docstring); its own cluster, stopped at the end.

    With ``pods_per_rs`` > 0 the same ReplicaSets are measured twice in one run: first with no pods
    (``rows``), then each with ``pods_per_rs`` pods it controls (``rowsWithPods``); ``podsOverNoPods``
    compares the two per N (CPU per reconcile, reconciles/s, RSS).
    """
    cluster = BenchCluster(workdir / "cluster", proxy_resources=("pods", "replicasets.apps"))
    cluster.start()
    try:
        if cluster.apiserver is None:
            raise RuntimeError("the benchmark cluster is not started")
        # The idle manager: the same controller with nothing to cache yet.
        idle = _one_count(cluster, workdir / "idle", 1, workers=workers, delay=delay, window=0.5, timeout=90)
        created = create_replicasets(cluster.apiserver.url, objects)
        timeout = 120 + objects / 200

        def measure(tag: str, pods: int, restart: bool = True) -> list[dict[str, Any]]:
            return [
                _one_count(
                    cluster,
                    workdir / f"{tag}n{n}",
                    n,
                    workers=workers,
                    delay=delay,
                    window=window,
                    timeout=timeout + pods / 200,
                    objects=objects,
                    pods=pods,
                    restart=restart,
                )
                for n in counts
            ]

        rows = measure("", 0, restart=restart_without_pods or not pods_per_rs)
        pod_rows: list[dict[str, Any]] = []
        pods_created = 0.0
        if pods_per_rs > 0:
            pods_created = add_pods(cluster.apiserver.url, pods_per_rs)
            pod_rows = measure("pods-", objects * pods_per_rs)
    finally:
        cluster.stop()
    idle_mib = idle["maxRssMiB"]
    _rates(rows, idle_mib)
    out: dict[str, Any] = {
        "objects": objects,
        "workersPerManager": workers,
        "reconcileDelaySeconds": delay,
        "idealPerManagerPerSecond": round(workers / delay, 1) if delay > 0 else None,
        "windowSeconds": window,
        "createSeconds": round(created, 1),
        "idleRssMiB": idle_mib,
        "idlePeakRssMiB": idle["maxPeakRssMiB"],
        "rows": rows,
    }
    if pod_rows:
        _rates(pod_rows, idle_mib)
        out |= {
            "podsPerReplicaSet": pods_per_rs,
            "pods": objects * pods_per_rs,
            "addPodsSeconds": round(pods_created, 1),
            "rowsWithPods": pod_rows,
            "podsOverNoPods": [_compare(a, b) for a, b in zip(rows, pod_rows, strict=True)],
            "cpuPerReconcileTarget": 1.5,
        }
    return out


def _compare(none: dict[str, Any], pods: dict[str, Any]) -> dict[str, Any]:
    """One N with pods against the same N without (ratios; target: CPU per reconcile <= 1.5x)."""

    def ratio(key: str) -> float | None:
        a, b = none.get(key), pods.get(key)
        return round(b / a, 2) if a and b is not None else None

    return {
        "managers": none["managers"],
        "reconcileCpuPerReconcile": ratio("reconcileCpuMsPerReconcile"),
        "processCpuPerReconcile": ratio("processCpuMsPerReconcile"),
        "reconcilesPerSecond": ratio("reconcilesPerSecond"),
        "backlogReconcilesPerSecond": ratio("backlogReconcilesPerSecond"),
        "maxRss": ratio("maxRssMiB"),
    }


# ---- proxy --------------------------------------------------------------------------------------


def raw_json_bytes(samples: int = 200, shape: str = "synthetic") -> float:
    """Mean JSON size of the pods :mod:`bench.upstream_server` serves (the same generator)."""
    make = real_pod if shape == "real" else stored_pod
    total = 0
    for i in range(samples):
        pod = make(f"pod-{i}", FEED_NAMESPACE, 1000)
        pod["metadata"]["annotations"][SENT_ANNOTATION] = "0"
        total += len(orjson.dumps(pod))
    return total / samples


def _proxy_over(
    objects: int, workdir: Path, name: str, *, shape: str = "synthetic", extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], ProxyProcess, str, float]:
    """The synthetic upstream with ``objects`` pods and a `rangeshard proxy` synced from it; seconds to sync."""
    upstream, port = _spawn_printing_port(
        ["bench.upstream_server", "--objects", str(objects), "--max-seconds", "3600", "--shape", shape]
    )
    url = f"http://127.0.0.1:{port}"
    proxy = ProxyProcess(
        url, resources=["pods"], log_file=workdir / f"{name}.log", extra_args=["--log-level", "warning", *extra]
    )
    t0 = time.monotonic()
    try:
        proxy.start(timeout=120 + objects / 2000)
    except BaseException:
        _stop([upstream])
        raise
    return upstream, proxy, url, time.monotonic() - t0


async def _timed_lists(url: str, parts: int, sample: list[int]) -> tuple[list[float], list[int]]:
    times, counts = [], []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for i in sample:
            sel = range_to_selector(equal_ranges(parts)[i], UID_PATH)
            t0 = time.perf_counter()
            r = await client.get("/api/v1/pods", params={"shardSelector": sel})
            times.append(time.perf_counter() - t0)
            r.raise_for_status()
            counts.append(len(orjson.loads(r.content)["items"]))
    return times, counts


async def _fan(proxy_url: str, upstream_url: str, pid: int, watchers: int, events: int, rate: int) -> dict[str, Any]:
    """``watchers`` range watchers on equal slices; one burst of ``events``; delivered per proxy CPU second."""
    clients = [_Client() for _ in range(watchers)]
    async with httpx.AsyncClient(base_url=proxy_url, timeout=30) as client:
        # Watch from the current resourceVersion: no initial ADDED events, only the burst.
        rv = (await client.get("/api/v1/pods", params={"limit": "1"})).json()["metadata"]["resourceVersion"]
    tasks = [
        asyncio.create_task(
            _watch(
                f"{proxy_url}/api/v1/pods",
                {"watch": "true", "resourceVersion": rv, "shardSelector": range_to_selector(rng)},
                c,
            )
        )
        for rng, c in zip(equal_ranges(watchers), clients, strict=True)
    ]
    try:
        async with httpx.AsyncClient(base_url=proxy_url, timeout=30) as client:
            deadline = time.monotonic() + 60 + watchers / 20
            while True:
                text = (await client.get("/metrics")).text
                if metric_value(text, "range_filter_proxy_downstream_watches") >= watchers:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {metric_value(text, 'range_filter_proxy_downstream_watches')} watches")
                await asyncio.sleep(0.1)
        cpu0, t0 = proc_cpu_seconds(pid), time.monotonic()
        async with httpx.AsyncClient(base_url=upstream_url, timeout=30) as up:
            (await up.post("/bench/feed", params={"rate": rate, "count": events})).raise_for_status()
        deadline = t0 + events / rate * 3 + 30
        while sum(c.events for c in clients) < events and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        elapsed, cpu = time.monotonic() - t0, proc_cpu_seconds(pid) - cpu0
        async with httpx.AsyncClient(base_url=upstream_url, timeout=30) as up:
            while not (await up.get("/bench/feed")).json().get("done") and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # the burst's end, before the next one may start
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    delivered = sum(c.events for c in clients)
    lat = [x for c in clients for x in c.latencies]
    return {
        "watchers": watchers,
        "events": events,
        "offeredPerSecond": rate,
        "delivered": delivered,
        "watchersWithEvents": sum(1 for c in clients if c.events),
        "seconds": round(elapsed, 2),
        "proxyCpuSeconds": round(cpu, 2),
        "eventsPerProxyCpuSecond": round(delivered / cpu) if cpu > 0 else None,
        "p50LatencyMs": round(percentile(lat, 0.5) * 1000, 1),
        "p99LatencyMs": round(percentile(lat, 0.99) * 1000, 1),
        "cutOff": sum(1 for c in clients if c.error and c.error != "stream ended" and "Cancel" not in c.error),
    }


def run_proxy(
    workdir: Path,
    *,
    objects: int,
    small: int = 16,
    large: int = 1000,
    events: int = 20_000,
    rate: int = 2_000,
    list_sample: int = 16,
) -> dict[str, Any]:
    """The proxy part (see module docstring)."""
    workdir.mkdir(parents=True, exist_ok=True)
    raw = raw_json_bytes()
    # The same proxy over a single pod: the RSS of everything but the cached objects.
    up0, idle, _, _ = _proxy_over(1, workdir, "proxy-idle")
    try:
        idle_rss = proc_memory(idle.pid or 0)["rssKiB"]
    finally:
        idle.stop()
        _stop([up0])
    upstream, proxy, upstream_url, sync = _proxy_over(objects, workdir, "proxy")
    try:
        pid = proxy.pid or 0
        mem = proc_memory(pid)
        parts = 64
        step = max(1, parts // list_sample)
        sample = list(range(0, parts, step))[:list_sample]
        times, counts = _run_loop(_timed_lists(proxy.url, parts, sample))
        mem_listed = proc_memory(pid)  # with the store index the range LISTs use
        full = sample == list(range(parts))
        fans = [_run_loop(_fan(proxy.url, upstream_url, pid, w, events, rate)) for w in (small, large)]
        mem_end = proc_memory(pid)
    finally:
        proxy.stop()
        _stop([upstream])
    per_object = (mem["rssKiB"] - idle_rss) * 1024 / objects
    per_object_listed = (mem_listed["rssKiB"] - idle_rss) * 1024 / objects
    small_r, large_r = fans
    ratio = (
        round(large_r["eventsPerProxyCpuSecond"] / small_r["eventsPerProxyCpuSecond"], 2)
        if large_r["eventsPerProxyCpuSecond"] and small_r["eventsPerProxyCpuSecond"]
        else None
    )
    return {
        "objects": objects,
        "upstream": "bench.upstream_server (synthetic API server: discovery, paged pod lists, chunked watch)",
        "firstSyncSeconds": round(sync, 2),
        "rawJsonBytes": round(raw),
        "idleRssMiB": round(idle_rss / 1024, 1),
        "rssAfterSyncMiB": round(mem["rssKiB"] / 1024, 1),
        "peakRssMiB": round(mem_end["peakRssKiB"] / 1024, 1),
        "rssAtEndMiB": round(mem_end["rssKiB"] / 1024, 1),
        "bytesPerObject": round(per_object),
        "memoryRatioToRawJson": round(per_object / raw, 2),
        "rssAfterListsMiB": round(mem_listed["rssKiB"] / 1024, 1),
        "bytesPerObjectAfterLists": round(per_object_listed),
        "memoryRatioToRawJsonAfterLists": round(per_object_listed / raw, 2),
        "memoryTarget": 2.0,
        "list": {
            "parts": parts,
            "lists": len(times),
            "itemsPerList": round(sum(counts) / len(counts)) if counts else 0,
            "itemsTotal": sum(counts),
            "partitionChecked": full,
            "p50Ms": round(percentile(times, 0.5) * 1000, 1),
            "maxMs": round(max(times) * 1000, 1) if times else None,
            "targetP50Ms": 200,
        },
        "watchers": fans,
        "perCpuLargeOverSmall": ratio,
        "perCpuTarget": 0.5,
    }


# ---- proxy on real-shaped objects (issue 49) -----------------------------------------------------

#: A bound no run reaches: the history kept by the two minimums alone (10,000 events or 300 s).
NO_BYTE_BOUND = 1 << 40


def _churn(proxy_url: str, upstream_url: str, pid: int, rate: int, seconds: float) -> dict[str, Any]:
    """Status churn: ``rate`` MODIFIED events/s for ``seconds`` (each a new version of a cached pod); the history
    then, from the proxy's gauges, and RSS sampled every second (the peak of the samples)."""
    count = max(1, int(rate * seconds))
    samples: list[int] = []

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=upstream_url, timeout=30) as up:
            (await up.post("/bench/feed", params={"rate": rate, "count": count})).raise_for_status()
            deadline = time.monotonic() + seconds * 3 + 60
            while not (await up.get("/bench/feed")).json().get("done"):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the churn of {count} events did not end")
                samples.append(proc_memory(pid)["rssKiB"])
                await asyncio.sleep(1.0)
        async with httpx.AsyncClient(base_url=proxy_url, timeout=30) as client:
            deadline = time.monotonic() + 30
            while True:  # every event received (the proxy may lag the upstream's send a little)
                text = (await client.get("/metrics")).text
                if metric_value(text, "range_filter_proxy_events_received_total", resource="pods") >= count:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("the proxy did not receive every churn event")
                await asyncio.sleep(0.2)
        return {
            "events": count,
            "historyEvents": int(metric_value(text, "range_filter_proxy_history_events", resource="pods")),
            "historyBytes": int(metric_value(text, "range_filter_proxy_history_bytes", resource="pods")),
        }

    out = _run_loop(go())
    out["rssSamplesMaxKiB"] = max(samples, default=0)
    return out


def run_proxy_real(
    workdir: Path,
    *,
    objects: int,
    rate: int,
    seconds: float,
    bounds: tuple[int, ...] = (64 * 1024 * 1024, NO_BYTE_BOUND),
) -> dict[str, Any]:
    """The proxy caching ``objects`` real-shaped pods under ``rate``/s status churn for ``seconds``, once per
    history byte bound: RSS after sync (objects) and after the churn (plus history), from ``/proc``; the
    history's events and bytes from its gauges. Target: RSS over idle <= 2 x raw JSON of the objects + bound."""
    workdir.mkdir(parents=True, exist_ok=True)
    raw = raw_json_bytes(shape="real")
    up0, idle, _, _ = _proxy_over(1, workdir, "proxy-real-idle", shape="real")
    try:
        idle_rss = proc_memory(idle.pid or 0)["rssKiB"]
    finally:
        idle.stop()
        _stop([up0])
    rows = []
    for bound in bounds:
        name = f"proxy-real-{bound}"
        upstream, proxy, upstream_url, sync = _proxy_over(
            objects, workdir, name, shape="real", extra=("--history-max-bytes", str(bound))
        )
        try:
            pid = proxy.pid or 0
            synced = proc_memory(pid)
            churn = _churn(proxy.url, upstream_url, pid, rate, seconds)
            end = proc_memory(pid)
        finally:
            proxy.stop()
            _stop([upstream])
        objects_kib = synced["rssKiB"] - idle_rss
        history_kib = end["rssKiB"] - synced["rssKiB"]
        raw_objects = raw * objects
        limit = 2 * raw_objects + (bound if bound < NO_BYTE_BOUND else churn["historyBytes"])
        rows.append(
            {
                "historyMaxBytes": bound if bound < NO_BYTE_BOUND else None,
                "firstSyncSeconds": round(sync, 2),
                "rssAfterSyncMiB": round(synced["rssKiB"] / 1024, 1),
                "rssAfterChurnMiB": round(end["rssKiB"] / 1024, 1),
                "peakRssMiB": round(end["peakRssKiB"] / 1024, 1),
                "objectsRssMiB": round(objects_kib / 1024, 1),
                "objectsRssOverRawJson": round(objects_kib * 1024 / raw_objects, 2),
                "historyRssMiB": round(history_kib / 1024, 1),
                **churn,
                "historyMiB": round(churn["historyBytes"] / 2**20, 1),
                "historyRssOverBytes": round(history_kib * 1024 / churn["historyBytes"], 2)
                if churn["historyBytes"]
                else None,
                "historyWindowSeconds": round(churn["historyEvents"] / rate, 1),
                "rssOverIdleMiB": round((end["rssKiB"] - idle_rss) / 1024, 1),
                "targetMiB": round(limit / 2**20, 1),
                "targetMet": (end["rssKiB"] - idle_rss) * 1024 <= limit,
            }
        )
    return {
        "objects": objects,
        "upstream": "bench.upstream_server --shape real (managedFields, full status, 5 labels, 3 annotations)",
        "rawJsonBytes": round(raw),
        "rawJsonMiB": round(raw * objects / 2**20, 1),
        "churnPerSecond": rate,
        "churnSeconds": seconds,
        "idleRssMiB": round(idle_rss / 1024, 1),
        "rows": rows,
    }


#: The parts of the section, in the order they run (``--scale-parts``).
PARTS = ("profile", "managers", "pods", "proxy", "proxyReal")


def run(
    workdir: Path,
    *,
    quick: bool,
    rs_objects: int | None = None,
    pod_objects: int | None = None,
    pod_replicasets: int | None = None,
    pods_per_rs: int | None = None,
    parts: tuple[str, ...] = PARTS,
) -> dict[str, Any]:
    """The parts asked for: quick sizes check behaviour only; the full sizes are issue 27's (20,000 ReplicaSets,
    1,000,000 pods) and issue 49's (5,000 ReplicaSets x 4 pods, over N = 1, 2, 4, 8)."""
    result: dict[str, Any] = {"bareLoop": bare_loop()}
    counts = [1, 2] if quick else [1, 2, 4, 8]
    if "profile" in parts:
        result["reconcileProfile"] = reconcile_profile.run(
            replicasets=pod_replicasets or (200 if quick else 5_000),
            pods_per_rs=pods_per_rs or (2 if quick else 4),
            sample=50 if quick else 500,
        )
    if "managers" in parts:
        result["managers"] = run_managers(
            workdir / "managers",
            objects=rs_objects or (40 if quick else 20_000),
            counts=counts,
            window=1.0 if quick else 5.0,
            delay=0.02,
        )
    if "pods" in parts:
        result["managersWithPods"] = run_managers(
            workdir / "managers-pods",
            objects=pod_replicasets or (20 if quick else 5_000),
            counts=counts,
            window=1.0 if quick else 5.0,
            delay=0.02,
            pods_per_rs=pods_per_rs or (2 if quick else 4),
            restart_without_pods=not quick,  # quick: the rolling restart of the rows with pods only
        )
    if "proxy" in parts:
        if quick:
            result["proxy"] = run_proxy(
                workdir / "proxy", objects=pod_objects or 2000, small=4, large=32, events=400, rate=1000, list_sample=64
            )
        else:
            result["proxy"] = run_proxy(workdir / "proxy", objects=pod_objects or 1_000_000)
    if "proxyReal" in parts:
        if quick:
            result["proxyReal"] = run_proxy_real(
                workdir / "proxy-real", objects=300, rate=200, seconds=2.0, bounds=(256 * 1024, NO_BYTE_BOUND)
            )
        else:
            result["proxyReal"] = run_proxy_real(workdir / "proxy-real", objects=20_000, rate=100, seconds=150.0)
    result["bareLoopAtEnd"] = bare_loop()
    return result
