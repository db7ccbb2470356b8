"""External controllers: a real kopf operator sharded unmodified, 1 vs 3 instances, and the endpoint's cost.

Purpose
    Item 7 of issue 22. Two measurements on the benchmark cluster (etcd, the
    local API server, the proxy), with the kopf operator of
    ``examples/kopf-gadgets`` run by real controller-manager processes as an
    ``external`` controller (``kopf run --standalone --all-namespaces``):

    * **throughput**: ``objects`` Gadgets are created with ``spec.work = 0``;
      the managers start and handle them (cheap); then every Gadget's spec is
      patched to ``work`` ms of CPU (a CPU-bound handler, ``time.thread_time``)
      and a new size. Measured: handled events per second, from the first patch
      to the last ConfigMap showing the new size, with 1 and with 3 managers,
      and the CPU the proxy and the API server spent meanwhile (seconds and
      utilisation: the shared stack's ceiling, named).
      The same again with an I/O-bound handler (``sleepMs``: the handler waits)
      shows the scaling where the host's cores are not the limit.
    * **endpoint latency**: ``requests`` sequential GETs of one ConfigMap and
      of a one-item list of a sharded resource, straight to the proxy and
      through a manager's endpoint: p50/p99 of each, and the added latency.

    A CPU-bound handler runs on one core per kopf process (the GIL), so the
    1 -> 3 ratio cannot exceed ``min(3, cores available)``: the result carries
    ``cores`` and ``ratioPerCoreBound`` (ratio / that bound) beside the ratio.

Invariants
    * Every manager process (and, with it, its kopf child) is stopped in
      ``finally``; every wait is bounded.
    * Each run uses its own registry prefix and namespace; the Gadgets of one
      run are deleted at its end.

Concurrency model
    The caller's thread starts and stops processes and polls; a small thread
    pool sends the patches (the API server's write rate, not the client's,
    should bound the start of the measurement).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import BenchCluster, percentile, proc_cpu_seconds, settled, wait_for, wait_managers
from controller_manager.process import ManagerProcess
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from registry import Registry

log = logging.getLogger(__name__)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "kopf-gadgets"
GROUP, VERSION, PLURAL = "bars.example.org", "v1", "gadgets"
CONTROLLER_TYPE = "gadget"


def _config(cluster: BenchCluster, prefix: str) -> dict[str, Any]:
    if cluster.etcd is None or cluster.proxy is None:
        raise RuntimeError("the benchmark cluster is not started")
    command = [sys.executable, "-m", "kopf", "run", "--standalone", "--all-namespaces", "--quiet"]
    return {
        "etcd": {"endpoints": [cluster.etcd.url]},
        "proxy": {"url": cluster.proxy.url},
        "leaseTTLSeconds": 5,
        "registryPrefix": prefix,
        "controllers": {
            CONTROLLER_TYPE: {
                "external": {
                    "command": [*command, str(EXAMPLE / "operator.py")],
                    "shard": [
                        {"resource": f"{PLURAL}.{GROUP}", "by": "uid"},
                        {"resource": "configmaps", "by": "owner"},
                    ],
                    "drainSeconds": 1,
                }
            }
        },
    }


class _Run:
    """One namespace of Gadgets and the managers that handle them."""

    def __init__(self, cluster: BenchCluster, workdir: Path, objects: int) -> None:
        if cluster.apiserver is None or cluster.etcd is None:
            raise RuntimeError("the benchmark cluster is not started")
        self.cluster = cluster
        self.workdir = workdir
        self.objects = objects
        self.ns = f"bench-ext-{uuid.uuid4().hex[:6]}"
        self.prefix = f"/bench-ext-{uuid.uuid4().hex[:8]}"
        self.api = httpx.Client(base_url=cluster.apiserver.url, timeout=30)
        self.etcd = EtcdClient(EtcdConfig.from_urls(cluster.etcd.url))
        self.registry = Registry(self.etcd, self.prefix)
        self.procs: list[ManagerProcess] = []

    def gadgets_path(self) -> str:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{self.ns}/{PLURAL}"

    def setup(self) -> None:
        crd = yaml.safe_load((EXAMPLE / "crd.yaml").read_text())
        resp = self.api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
        if resp.status_code not in (201, 409):
            raise RuntimeError(f"cannot create the Gadget CRD: {resp.status_code} {resp.text[:200]}")
        wait_for(lambda: self.api.get(f"/apis/{GROUP}/{VERSION}").status_code == 200, 30, "the Gadget CRD served")
        self.api.post("/api/v1/namespaces", json={"metadata": {"name": self.ns}}).raise_for_status()

        def create(i: int) -> None:
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Gadget",
                "metadata": {"name": f"g{i}"},
                "spec": {"size": 0, "work": 0},
            }
            self.api.post(self.gadgets_path(), json=body).raise_for_status()

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(self.objects)))

    def start_managers(self, n: int) -> None:
        config = self.workdir / f"{self.ns}.yaml"
        config.write_text(yaml.safe_dump(_config(self.cluster, self.prefix)))
        for i in range(n):
            log_path = self.workdir / f"{self.ns}-m{i}.log"
            # Stops go to the process group: the external controller (kopf) is the manager's child.
            m = self.cluster.add_manager(f"m{i}", config, log=log_path, instance_prefix=f"m{i}", signal_group=True)
            self.procs.append(m)
        check = partial(settled, self.registry, CONTROLLER_TYPE, len(self.procs))
        wait_managers(check, self.procs, 90, f"{n} active gadget instances")

    def sizes(self) -> dict[str, str]:
        items = self.api.get(f"/api/v1/namespaces/{self.ns}/configmaps").json().get("items", [])
        return {cm["metadata"]["name"]: (cm.get("data") or {}).get("size", "") for cm in items}

    def converged(self, size: int) -> bool:
        sizes = self.sizes()
        return sum(1 for v in sizes.values() if v == str(size)) == self.objects

    def patch_all(self, spec: dict[str, int]) -> float:
        """Patch every Gadget's spec; the time of the first patch."""
        started = time.monotonic()

        def patch(i: int) -> None:
            self.api.patch(
                f"{self.gadgets_path()}/g{i}",
                json={"spec": spec},
                headers={"Content-Type": "application/merge-patch+json"},
            ).raise_for_status()

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(patch, range(self.objects)))
        return started

    def stop_managers(self) -> None:
        self.cluster.stop_managers(self.procs, timeout=30)
        self.procs.clear()

    def endpoint_url(self) -> str:
        for path in (m.log for m in self.procs):
            found = re.search(r"endpoint for the external controller on (http://\S+)", path.read_text())
            if found:
                return found.group(1)
        raise RuntimeError("no manager logged its endpoint")

    def close(self) -> None:
        self.stop_managers()
        path = f"/api/v1/namespaces/{self.ns}"
        self.api.delete(path)
        # The next run's kopf watches every namespace: it must not find this run's
        # Gadgets still being deleted (a full run's 2,000 kept the next one busy).
        wait_for(lambda: self.api.get(path).status_code == 404, 300, f"namespace {self.ns} deleted")
        self.api.close()
        self.etcd.close()


def _throughput(cluster: BenchCluster, workdir: Path, n: int, objects: int, spec: dict[str, int]) -> dict[str, Any]:
    run = _Run(cluster, workdir, objects)
    try:
        run.setup()
        run.start_managers(n)
        wait_for(lambda: run.converged(0), 120 + objects / 10, "the initial (cheap) handling")
        pids = {"proxy": cluster.proxy_pid, "apiserver": cluster.apiserver.pid if cluster.apiserver else None}
        cpu0 = {k: proc_cpu_seconds(pid) for k, pid in pids.items()}
        started = run.patch_all({**spec, "size": 1})
        deadline = 600.0
        wait_for(lambda: run.converged(1), deadline, f"every Gadget handled with {n} instance(s)", interval=0.2)
        seconds = time.monotonic() - started
        cpu = {k: proc_cpu_seconds(pid) - cpu0[k] for k, pid in pids.items()}
        return {
            "instances": n,
            "objects": objects,
            "seconds": round(seconds, 2),
            "perSecond": round(objects / seconds, 1),
            # The shared stack's share: a core-second each of these can give caps every instance behind them.
            "proxyCpuSeconds": round(cpu["proxy"], 2),
            "apiserverCpuSeconds": round(cpu["apiserver"], 2),
            "proxyCpuUtilisation": round(cpu["proxy"] / seconds, 2),
            "apiserverCpuUtilisation": round(cpu["apiserver"] / seconds, 2),
        }
    finally:
        run.close()


def _latency(cluster: BenchCluster, workdir: Path, requests: int) -> dict[str, Any]:
    if cluster.proxy is None:
        raise RuntimeError("the benchmark cluster is not started")
    run = _Run(cluster, workdir, 8)
    try:
        run.setup()
        run.start_managers(1)
        wait_for(lambda: run.converged(0), 60, "the ConfigMaps of the latency run")
        endpoint = run.endpoint_url()
        name = sorted(run.sizes())[0]
        paths = {
            "get": f"/api/v1/namespaces/{run.ns}/configmaps/{name}",
            "list": f"{run.gadgets_path()}?limit=1",
        }
        out: dict[str, Any] = {"requests": requests}
        vias = (("proxy", cluster.proxy.url), ("endpoint", endpoint))
        with httpx.Client(timeout=10) as client:
            for what, path in paths.items():
                # Interleaved (proxy, endpoint, proxy, ...): a busy moment of the
                # host costs both sides alike instead of whichever ran then.
                times: dict[str, list[float]] = {via: [] for via, _ in vias}
                for _ in range(requests):
                    for via, base in vias:
                        t0 = time.perf_counter()
                        client.get(base + path).raise_for_status()
                        times[via].append((time.perf_counter() - t0) * 1000)
                for via, samples in times.items():
                    out[f"{what}{via.title()}P50Ms"] = round(percentile(samples, 0.5), 3)
                    out[f"{what}{via.title()}P99Ms"] = round(percentile(samples, 0.99), 3)
                for q in ("P50", "P99"):
                    added = out[f"{what}Endpoint{q}Ms"] - out[f"{what}Proxy{q}Ms"]
                    out[f"{what}Added{q}Ms"] = round(added, 3)
        return out
    finally:
        run.close()


def run(
    cluster: BenchCluster,
    workdir: Path,
    *,
    objects: int = 2000,
    work_ms: int = 20,
    requests: int = 500,
    io_bound: bool = True,
    sleep_ms: int = 400,
) -> dict[str, Any]:
    """1 vs 3 instances (CPU-bound, and I/O-bound unless ``io_bound=False``) and the endpoint's added latency.

    The I/O-bound handler waits ``sleep_ms``: long enough that kopf's handler
    threads, not the API server and proxy sharing the host's cores, bound one
    instance (with 20 ms waits a single kopf already outran them on 2 cores).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0))
    result: dict[str, Any] = {"cores": cores, "workMs": work_ms, "sleepMs": sleep_ms}
    variants: list[tuple[str, dict[str, int]]] = [("cpuBound", {"work": work_ms})]
    if io_bound:
        variants.append(("ioBound", {"work": 0, "sleepMs": sleep_ms}))
    for label, spec in variants:
        one = _throughput(cluster, workdir, 1, objects, spec)
        three = _throughput(cluster, workdir, 3, objects, spec)
        ratio = three["perSecond"] / one["perSecond"]
        result[label] = {"one": one, "three": three, "ratio": round(ratio, 2)}
        if label == "cpuBound":
            result[label]["ratioPerCoreBound"] = round(ratio / min(3, cores), 2)
        log.info("external %s: %s", label, result[label])
    result["latency"] = _latency(cluster, workdir, requests)
    return result
