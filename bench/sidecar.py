"""The sidecar's cost: what an external-only manager adds beside the controller it shards (issue 39).

Purpose
    A Go controller is sharded by running a manager with one ``external``
    entry beside each replica. Side by side in one run, three times:

    * **memory and start**: RSS (``VmRSS``, 2 s after ``/readyz`` said 200)
      and spawn -> ``/readyz`` 200 of an external-only manager (one entry,
      no ``command``: the sidecar), of a manager with the built-in
      controllers (replicaset, deployment), and of a second proxy
      (``--resources pods``) in front of the same API server;
    * **requests**: ``requests`` GETs of one ConfigMap and one-item LISTs
      of ConfigMaps (the sharded resource), sent straight to the proxy
      (the LIST with the selector the endpoint adds), through the endpoint
      and through ``bench.hop`` (a byte-for-byte relay process: the floor
      of any extra hop on this host), interleaved; p50/p99 of each and the
      differences to the proxy, and the manager's CPU per relayed request
      (over an idle baseline);
    * **watch events**: one watch through the endpoint, one through the hop
      and one straight to the proxy, all from the same resourceVersion;
      ``events`` patches of a ConfigMap; per event, the arrival through the
      endpoint (and the hop) minus the arrival straight from the proxy;
    * **100 watches**: the manager's RSS with ``watches`` open watches of one
      client through its endpoint, minus before;
    * **what the RSS is made of** (:func:`profile`): a fresh interpreter,
      then with the etcd client (gRPC) after one call, then with httpx,
      YAML and the config models.

    ``summary`` holds min/median/max of the runs for each number, with the
    issue's targets and the peers' published per-shard memory.

Invariants
    * Every process this section starts is stopped in ``finally``; every
      wait is bounded.
    * Each run uses its own registry prefix and namespace.

Concurrency model
    The caller's thread; two reader threads per watch measurement.
"""

from __future__ import annotations

import functools
import logging
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import BenchCluster, percentile, proc_cpu_seconds
from controller_manager.process import ManagerProcess
from hashing import MAX_HASH, HashRange, range_to_selector
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.process import free_port, terminate

log = logging.getLogger(__name__)

#: The issue's targets.
TARGETS = {
    "externalOnlyRssMiB": 55,
    "externalOnlyStartSeconds": 1.0,
    "addedP50Ms": 0.5,
    "addedP99Ms": 2.0,
    "watchEventAddedP50Ms": 0.2,
    "hundredWatchesMiB": 10,
}
#: Published per-shard memory of what the sidecar sits beside (MiB).
PEERS = {
    "timebertt/kubernetes-controller-sharding, one shard": "80-100",
    "a typical controller-runtime controller": "30-100",
}
SELECTOR = range_to_selector(HashRange(0, MAX_HASH), "object.metadata.uid")
SETTLE_SECONDS = 2.0


def rss_mib(pid: int | None) -> float:
    """``VmRSS`` of a process in MiB (0 if gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


def _wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.01)
    raise TimeoutError(f"{url} not 200 after {timeout:g}s")


class _Run:
    """One run: a namespace of ConfigMaps, the managers, the measurements."""

    def __init__(self, cluster: BenchCluster, workdir: Path, index: int) -> None:
        if cluster.apiserver is None or cluster.etcd is None or cluster.proxy is None:
            raise RuntimeError("the benchmark cluster is not started")
        self.cluster = cluster
        self.workdir = workdir
        self.index = index
        self.ns = f"bench-sidecar-{uuid.uuid4().hex[:6]}"
        self.prefix = f"/bench-sidecar-{uuid.uuid4().hex[:8]}"
        self.api = httpx.Client(base_url=cluster.apiserver.url, timeout=30)
        self.proxy_url = cluster.proxy.url
        self.listen = free_port("127.0.0.1")
        self.endpoint = f"http://127.0.0.1:{self.listen}"
        self.procs: list[ManagerProcess] = []
        proxy_port = cluster.proxy.port
        hop_port = free_port("127.0.0.1")
        self.hop_url = f"http://127.0.0.1:{hop_port}"
        command = [sys.executable, "-m", "bench.hop", str(hop_port), str(proxy_port)]  # bench is not installed
        self.hop = subprocess.Popen(command, stdin=subprocess.DEVNULL)

    def setup(self) -> None:
        self.api.post("/api/v1/namespaces", json={"metadata": {"name": self.ns}}).raise_for_status()
        for i in range(4):
            body = {"metadata": {"name": f"c{i}"}, "data": {"n": "0"}}
            self.api.post(f"/api/v1/namespaces/{self.ns}/configmaps", json=body).raise_for_status()

    def _config(self, controllers: dict[str, Any], metrics_port: int) -> dict[str, Any]:
        return {
            "etcd": {"endpoints": [self.cluster.etcd_url]},
            "proxy": {"url": self.proxy_url},
            "registryPrefix": self.prefix,
            "metrics": {"host": "127.0.0.1", "port": metrics_port},
            "controllers": controllers,
        }

    def start_manager(self, name: str, controllers: dict[str, Any]) -> tuple[ManagerProcess, float]:
        """Start a manager; seconds from spawn to ``/readyz`` 200."""
        metrics = free_port("127.0.0.1")
        config = self._config(controllers, metrics)
        t0 = time.monotonic()
        proc = self.cluster.add_manager(f"{name}{self.index}", config, instance_prefix=f"{name}{self.index}")
        self.procs.append(proc)
        _wait_http(f"http://127.0.0.1:{metrics}/readyz", 60)
        return proc, round(time.monotonic() - t0, 3)

    def sidecar(self) -> tuple[ManagerProcess, float]:
        external = {"listen": f"127.0.0.1:{self.listen}", "shard": [{"resource": "configmaps", "by": "uid"}]}
        return self.start_manager("sidecar", {"gadget": {"external": external}})

    def builtin(self) -> dict[str, Any]:
        proc, seconds = self.start_manager("builtin", {"replicaset": {"workers": 2}, "deployment": {"workers": 2}})
        try:
            time.sleep(SETTLE_SECONDS)
            return {"rssMiB": rss_mib(proc.pid), "startSeconds": seconds}
        finally:
            self.cluster.stop_managers([proc])
            self.procs.remove(proc)

    def second_proxy(self) -> dict[str, Any]:
        apiserver = self.cluster.apiserver
        if apiserver is None:
            raise RuntimeError("no API server")
        proxy = ProxyProcess(
            apiserver.url,
            resources=["pods"],
            log_file=self.workdir / f"proxy{self.index}.log",
            extra_args=["--log-level", "warning"],
        )
        t0 = time.monotonic()
        try:
            proxy.start(60)
            seconds = round(time.monotonic() - t0, 3)
            time.sleep(SETTLE_SECONDS)
            return {"rssMiB": rss_mib(proxy.pid), "startSeconds": seconds}
        finally:
            proxy.stop()

    def requests(self, pid: int | None, n: int) -> dict[str, Any]:
        """GET and one-item LIST, straight to the proxy, through the endpoint and through the hop, interleaved."""
        cm = f"/api/v1/namespaces/{self.ns}/configmaps"
        paths = {"get": (f"{cm}/c0", f"{cm}/c0"), "list": (f"{cm}?limit=1&shardSelector={SELECTOR}", f"{cm}?limit=1")}
        out: dict[str, Any] = {"requests": n}
        with httpx.Client(timeout=10) as client:
            idle0, t_idle = proc_cpu_seconds(pid), time.monotonic()
            time.sleep(SETTLE_SECONDS)
            idle_rate = (proc_cpu_seconds(pid) - idle0) / (time.monotonic() - t_idle)
            for _ in range(20):  # warm every path (connections, caches)
                for direct, via in paths.values():
                    for url in (self.proxy_url + direct, self.endpoint + via, self.hop_url + direct):
                        client.get(url).raise_for_status()
            cpu0, t0 = proc_cpu_seconds(pid), time.monotonic()
            for what, (direct, via) in paths.items():
                sides = {"proxy": self.proxy_url + direct, "endpoint": self.endpoint + via}
                sides["hop"] = self.hop_url + direct
                times: dict[str, list[float]] = {side: [] for side in sides}
                for _ in range(n):
                    for side, url in sides.items():
                        start = time.perf_counter()
                        client.get(url).raise_for_status()
                        times[side].append((time.perf_counter() - start) * 1000)
                for q, name in ((0.5, "P50"), (0.99, "P99")):
                    proxy = percentile(times["proxy"], q)
                    out[f"{what}Proxy{name}Ms"] = round(proxy, 3)
                    out[f"{what}Endpoint{name}Ms"] = round(percentile(times["endpoint"], q), 3)
                    out[f"{what}Added{name}Ms"] = round(percentile(times["endpoint"], q) - proxy, 3)
                    out[f"{what}HopAdded{name}Ms"] = round(percentile(times["hop"], q) - proxy, 3)
            busy = proc_cpu_seconds(pid) - cpu0 - idle_rate * (time.monotonic() - t0)
        out["endpointCpuMsPerRequest"] = round(max(busy, 0.0) * 1000 / (2 * n), 3)
        return out

    def watch_events(self, events: int) -> dict[str, Any]:
        """Per event: arrival through the endpoint minus arrival straight from the proxy."""
        cm = f"/api/v1/namespaces/{self.ns}/configmaps"
        rv = httpx.get(f"{self.endpoint}{cm}", timeout=10).json()["metadata"]["resourceVersion"]
        direct = f"{cm}?watch=true&resourceVersion={rv}&shardSelector={SELECTOR}"
        urls = {
            "proxy": self.proxy_url + direct,
            "endpoint": f"{self.endpoint}{cm}?watch=true&resourceVersion={rv}",
            "hop": self.hop_url + direct,
        }
        arrivals: dict[str, dict[str, float]] = {side: {} for side in urls}
        opened = threading.Barrier(len(urls) + 1)
        stop = threading.Event()

        def read(side: str) -> None:
            with httpx.Client(timeout=httpx.Timeout(10, read=None)) as c, c.stream("GET", urls[side]) as resp:
                opened.wait(10)
                try:
                    for line in resp.iter_lines():
                        now = time.perf_counter()
                        event = orjson.loads(line) if line else {}
                        if event.get("type") == "MODIFIED":
                            arrivals[side][event["object"]["metadata"]["resourceVersion"]] = now
                        if stop.is_set() and len(arrivals[side]) >= events:
                            return
                except httpx.HTTPError:  # the manager stopped at the end of the run
                    return

        readers = [threading.Thread(target=read, args=(side,), daemon=True) for side in urls]
        for t in readers:
            t.start()
        opened.wait(10)
        time.sleep(0.5)
        merge = {"Content-Type": "application/merge-patch+json"}
        for i in range(events):
            self.api.patch(f"{cm}/c1", content=orjson.dumps({"data": {"n": str(i + 1)}}), headers=merge)
            time.sleep(0.02)
        stop.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and min(len(a) for a in arrivals.values()) < events:
            time.sleep(0.05)
        every = set.intersection(*(set(a) for a in arrivals.values()))
        out: dict[str, Any] = {"events": len(every)}
        for side, name in (("endpoint", "event"), ("hop", "hopEvent")):
            added = [(arrivals[side][v] - arrivals["proxy"][v]) * 1000 for v in every]
            out[f"{name}AddedP50Ms"] = round(percentile(added, 0.5), 3)
            out[f"{name}AddedP99Ms"] = round(percentile(added, 0.99), 3)
        return out

    def many_watches(self, pid: int | None, n: int) -> dict[str, Any]:
        """The manager's RSS with ``n`` open watches through the endpoint, minus before."""
        cm = f"/api/v1/namespaces/{self.ns}/configmaps"
        rv = httpx.get(f"{self.endpoint}{cm}", timeout=10).json()["metadata"]["resourceVersion"]
        time.sleep(SETTLE_SECONDS)
        before = rss_mib(pid)
        request = f"GET {cm}?watch=true&resourceVersion={rv} HTTP/1.1\r\nHost: endpoint\r\n\r\n".encode()
        socks: list[socket.socket] = []
        try:
            for _ in range(n):
                s = socket.create_connection(("127.0.0.1", self.listen), timeout=10)
                s.sendall(request)
                socks.append(s)
            for s in socks:
                if not s.recv(65536).startswith(b"HTTP/1.1 200"):
                    raise RuntimeError("a watch through the endpoint was refused")
            time.sleep(SETTLE_SECONDS)
            after = rss_mib(pid)
        finally:
            for s in socks:
                s.close()
        return {"watches": n, "rssBeforeMiB": before, "rssAfterMiB": after, "addedMiB": round(after - before, 1)}

    def close(self) -> None:
        terminate(self.hop, 5)
        self.cluster.stop_managers(self.procs)
        self.procs.clear()
        self.api.delete(f"/api/v1/namespaces/{self.ns}")
        self.api.close()


#: What a sidecar's RSS is made of: each snippet adds to the one before, in a fresh interpreter.
_PROFILE = {
    "interpreter": "pass",
    "etcdClient": "from rangeshard.core.etcd import EtcdClient, EtcdConfig\n"
    "EtcdClient(EtcdConfig.from_urls([{url!r}])).revision()",
    "configStack": "import sys; sys.modules.setdefault('httpx._main', None)\n"
    "import httpx, yaml, controller_manager.config",
}


def profile(etcd_url: str) -> dict[str, float]:
    """RSS in MiB of a fresh interpreter, then with an etcd client (gRPC) that made one call, then with the
    httpx, YAML and pydantic (the config models) every manager needs: what the sidecar's memory is made of."""
    out: dict[str, float] = {}
    code = ""
    for name, snippet in _PROFILE.items():
        code += snippet.format(url=etcd_url) + "\n"
        report = "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])"
        done = subprocess.run(
            [sys.executable, "-P", "-c", code + report], capture_output=True, text=True, timeout=60, check=True
        )
        out[f"{name}RssMiB"] = round(int(done.stdout.strip()) / 1024, 1)
    return out


def _one(cluster: BenchCluster, workdir: Path, index: int, requests: int, events: int, watches: int) -> dict[str, Any]:
    run = _Run(cluster, workdir, index)
    try:
        run.setup()
        proc, seconds = run.sidecar()
        time.sleep(SETTLE_SECONDS)
        out: dict[str, Any] = {"externalOnly": {"rssMiB": rss_mib(proc.pid), "startSeconds": seconds}}
        out["latency"] = run.requests(proc.pid, requests)
        out["watch"] = run.watch_events(events)
        out["watches"] = run.many_watches(proc.pid, watches)
        out["profile"] = profile(cluster.etcd_url)
        out["builtIn"] = run.builtin()
        out["proxy"] = run.second_proxy()
        log.info("sidecar run %s: %s", index, out)
        return out
    finally:
        run.close()


def _spread(rows: list[dict[str, Any]], get: Callable[[dict[str, Any]], float]) -> list[float]:
    values = [get(r) for r in rows]
    return [min(values), statistics.median(values), max(values)]


def _latency(row: dict[str, Any], key: str) -> float:
    return float(row["latency"][key])


def summary(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """min / median / max over the runs of each published number."""
    picks: dict[str, Callable[[dict[str, Any]], float]] = {
        "externalOnlyRssMiB": lambda r: r["externalOnly"]["rssMiB"],
        "externalOnlyStartSeconds": lambda r: r["externalOnly"]["startSeconds"],
        "builtInRssMiB": lambda r: r["builtIn"]["rssMiB"],
        "builtInStartSeconds": lambda r: r["builtIn"]["startSeconds"],
        "proxyRssMiB": lambda r: r["proxy"]["rssMiB"],
        "proxyStartSeconds": lambda r: r["proxy"]["startSeconds"],
        "endpointCpuMsPerRequest": lambda r: r["latency"]["endpointCpuMsPerRequest"],
        "watchEventAddedP50Ms": lambda r: r["watch"]["eventAddedP50Ms"],
        "watchEventAddedP99Ms": lambda r: r["watch"]["eventAddedP99Ms"],
        "hopWatchEventAddedP50Ms": lambda r: r["watch"]["hopEventAddedP50Ms"],
        "hundredWatchesMiB": lambda r: r["watches"]["addedMiB"],
        "interpreterRssMiB": lambda r: r["profile"]["interpreterRssMiB"],
        "withEtcdClientRssMiB": lambda r: r["profile"]["etcdClientRssMiB"],
        "withConfigStackRssMiB": lambda r: r["profile"]["configStackRssMiB"],
    }
    for what in ("get", "list"):
        for q in ("P50", "P99"):
            for side in ("Proxy", "Endpoint", "Added", "HopAdded"):
                key = f"{what}{side}{q}Ms"
                picks[key] = functools.partial(_latency, key=key)
    return {name: _spread(rows, get) for name, get in picks.items()}


def run(
    cluster: BenchCluster, workdir: Path, *, runs: int = 3, requests: int = 500, events: int = 200, watches: int = 100
) -> dict[str, Any]:
    """``runs`` runs of every measurement (see module docstring) and their min/median/max."""
    workdir.mkdir(parents=True, exist_ok=True)
    rows = [_one(cluster, workdir, i, requests, events, watches) for i in range(runs)]
    return {"runs": rows, "summary": summary(rows), "targets": TARGETS, "peersMiB": PEERS}
