"""The proxy's pass-through: CPU per relayed request against the CPU the upstream spends serving it (issue 47).

Purpose
    Every write and uncached read of every instance crosses the proxy's
    pass-through, so its CPU per request, set against the API server's, is
    the ceiling of every controller behind one proxy. In one run, on the
    benchmark cluster (etcd, the local API server, the proxy), ``requests``
    requests of each kind from ``clients`` concurrent keep-alive clients:

    * ``GET`` of one ConfigMap, merge ``PATCH`` of one, ``POST`` (create with
      ``generateName``) and ``DELETE`` of the created ones;
    * sent four ways: straight to the API server (**upstream**: its own
      cost), through ``bench.hop`` (a **bare byte relay** process: the floor
      of any relay), through the **proxy**, and through a second proxy with
      write fencing on (``--etcd``) reached through an external-only
      manager's endpoint, whose writes carry its owner token (**fenced**:
      every write checked), and the same for ConfigMaps whose controller
      owner is a ReplicaSet, sharded ``by: root`` via ``replicasets.apps``
      (**fenced-root**: the fence reads each write's owner from the upstream,
      so the API server serves one more list per write);
    * per way and kind: the relay's CPU ms per request (the proxy's, the
      hop's), the API server's CPU ms per request in the same window,
      their ratio (the issue's target: proxy / upstream <= 0.5 for GET and
      PATCH), and requests per relay CPU second. CPU is ``utime + stime`` of
      ``/proc/<pid>/stat``, minus each process's idle rate over the window.

Invariants
    * Every process this section starts (the hop, the fencing proxy, the
      manager) is stopped in ``finally``; every wait is bounded.
    * One namespace per run; its ConfigMaps and ReplicaSet are deleted by the run itself.

Concurrency model
    The caller's thread; the clients are coroutines of one event loop
    (``rangeshard.core.http1client``'s pool: cheap, so the host's cores go to the
    measured processes).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import BenchCluster, proc_cpu_seconds
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.http1client import ClientPool
from rangeshard.core.process import free_port, terminate

log = logging.getLogger(__name__)

KINDS = ("GET", "PATCH", "POST", "DELETE")
#: The issue's target: the proxy's CPU per relayed GET and PATCH at most this share of the upstream's.
TARGET_RATIO = 0.5
_IDLE_SECONDS = 1.0


def _idle_rates(pids: dict[str, int | None]) -> dict[str, float]:
    cpu0, t0 = {k: proc_cpu_seconds(p) for k, p in pids.items()}, time.monotonic()
    time.sleep(_IDLE_SECONDS)
    elapsed = time.monotonic() - t0
    return {k: (proc_cpu_seconds(p) - cpu0[k]) / elapsed for k, p in pids.items()}


async def _drive(base_url: str, requests: list[tuple[str, str, bytes]], clients: int, agent: str) -> list[bytes]:
    """Send ``requests`` (method, target, body) over ``clients`` concurrent keep-alive connections; the answers."""
    pool = ClientPool(base_url, max_idle=clients)
    answers: list[bytes] = [b""] * len(requests)
    queue = iter(range(len(requests)))

    async def client() -> None:
        for i in queue:
            method, target, body = requests[i]
            headers = [("Accept", "application/json"), ("User-Agent", agent)]
            if method == "PATCH":
                headers.append(("Content-Type", "application/merge-patch+json"))
            elif body:
                headers.append(("Content-Type", "application/json"))
            answer = await pool.request(method, target, headers, body)
            try:
                answers[i] = await answer.read()
                if not 200 <= answer.status < 300:
                    raise RuntimeError(f"{method} {target}: {answer.status} {answers[i][:300]!r}")
            finally:
                answer.close()

    try:
        await asyncio.gather(*(client() for _ in range(clients)))
    finally:
        pool.close()
    return answers


class _Run:
    """The ways requests go, the namespace they write in, and the processes this section started."""

    def __init__(self, cluster: BenchCluster, workdir: Path, clients: int) -> None:
        if cluster.apiserver is None or cluster.proxy is None or cluster.etcd is None:
            raise RuntimeError("the benchmark cluster is not started")
        self.cluster = cluster
        self.workdir = workdir
        self.clients = clients
        self.ns = f"bench-pass-{uuid.uuid4().hex[:6]}"
        self.apiserver = cluster.apiserver
        self.prefix = f"/bench-pass-{uuid.uuid4().hex[:8]}"
        self.hop: subprocess.Popen[bytes] | None = None
        self.fenced: ProxyProcess | None = None
        self.procs: list[Any] = []
        #: The controller ownerReferences of the fenced-root way's ConfigMaps (a ReplicaSet without an owner).
        self.owner: list[dict[str, Any]] = []

    def start(self) -> None:
        with httpx.Client(base_url=self.apiserver.url, timeout=30) as api:
            api.post("/api/v1/namespaces", json={"metadata": {"name": self.ns}}).raise_for_status()
            labels = {"app": "bench-root"}
            template = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "pause"}]}}
            rs = {"metadata": {"name": "owner"}, "spec": {"replicas": 0, "selector": {"matchLabels": labels}}}
            rs["spec"]["template"] = template
            answer = api.post(f"/apis/apps/v1/namespaces/{self.ns}/replicasets", json=rs)
            answer.raise_for_status()
            uid = answer.json()["metadata"]["uid"]
            self.owner = [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "owner", "uid": uid, "controller": True}
            ]
            for i in range(4):
                for name, meta in ((f"c{i}", {}), (f"r{i}", {"ownerReferences": self.owner})):
                    body = {"metadata": {"name": name, **meta}, "data": {"n": "0"}}
                    api.post(f"/api/v1/namespaces/{self.ns}/configmaps", json=body).raise_for_status()
        hop_port = free_port("127.0.0.1")
        command = [sys.executable, "-m", "bench.hop", str(hop_port), str(self.apiserver.port)]
        self.hop = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        self.hop_url = f"http://127.0.0.1:{hop_port}"
        self.fenced = ProxyProcess(
            self.apiserver.url,
            resources=["pods"],
            log_file=self.workdir / "fenced-proxy.log",
            extra_args=["--log-level", "warning", "--etcd", self.cluster.etcd_url, "--registry-prefix", self.prefix],
        )
        self.fenced.start(60)
        listen, root_listen, metrics = free_port("127.0.0.1"), free_port("127.0.0.1"), free_port("127.0.0.1")
        external = {"listen": f"127.0.0.1:{listen}", "shard": [{"resource": "configmaps", "by": "uid"}]}
        rooted = {"resource": "configmaps", "by": "root", "via": ["replicasets.apps"]}
        root_external = {"listen": f"127.0.0.1:{root_listen}", "shard": [rooted]}
        config = {
            "etcd": {"endpoints": [self.cluster.etcd_url]},
            "proxy": {"url": self.fenced.url},
            "registryPrefix": self.prefix,
            "metrics": {"host": "127.0.0.1", "port": metrics},
            "controllers": {"gadget": {"external": external}, "rooted": {"external": root_external}},
        }
        self.procs.append(self.cluster.add_manager("passthrough", config, instance_prefix="passthrough"))
        self.endpoint_url = f"http://127.0.0.1:{listen}"
        self.root_url = f"http://127.0.0.1:{root_listen}"
        deadline = time.monotonic() + 60
        while True:  # active, with a token: a write through the endpoint is fenced, and passes
            try:
                if httpx.get(f"http://127.0.0.1:{metrics}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the passthrough bench's manager did not get ready")
            time.sleep(0.05)
        # A list through the rooted endpoint gives the proxy its ConfigMap cache with the owner chain to fence by.
        httpx.get(f"{self.root_url}/api/v1/namespaces/{self.ns}/configmaps", timeout=30).raise_for_status()

    def requests(self, kind: str, n: int, created: list[str], root: bool = False) -> list[tuple[str, str, bytes]]:
        cm = f"/api/v1/namespaces/{self.ns}/configmaps"
        name = "r" if root else "c"
        if kind == "GET":
            return [("GET", f"{cm}/{name}{i % 4}", b"") for i in range(n)]
        if kind == "PATCH":
            return [("PATCH", f"{cm}/{name}{i % 4}", b'{"data":{"n":"%d"}}' % i) for i in range(n)]
        if kind == "POST":
            meta: dict[str, Any] = {"generateName": "p-", **({"ownerReferences": self.owner} if root else {})}
            body = orjson.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta})
            return [("POST", cm, body) for _ in range(n)]
        return [("DELETE", f"{cm}/{name}", b"") for name in created[:n]]

    def measure(
        self, way: str, base_url: str, relay_pid: int | None, n: int, root: bool = False
    ) -> list[dict[str, Any]]:
        """Each kind of request ``n`` times through ``base_url``: CPU per request of the relay and the API server."""
        pids = {"relay": relay_pid, "apiserver": self.apiserver.pid}
        agent = "rangeshard-bench/passthrough"
        rows = []
        created: list[str] = []
        for kind in ("GET", "PATCH"):  # warm the connections and every cache on the way
            asyncio.run(_drive(base_url, self.requests(kind, 20, created, root), self.clients, agent))
        for kind in KINDS:
            batch = self.requests(kind, n, created, root)
            idle = _idle_rates(pids)
            cpu0, t0 = {k: proc_cpu_seconds(p) for k, p in pids.items()}, time.monotonic()
            answers = asyncio.run(_drive(base_url, batch, self.clients, agent))
            seconds = time.monotonic() - t0
            cpu = {k: max(proc_cpu_seconds(p) - cpu0[k] - idle[k] * seconds, 1e-6) for k, p in pids.items()}
            if kind == "POST":
                created = [orjson.loads(a)["metadata"]["name"] for a in answers]
            relay_ms = cpu["relay"] * 1000 / len(batch) if relay_pid is not None else None
            api_ms = cpu["apiserver"] * 1000 / len(batch)
            rows.append(
                {
                    "way": way,
                    "kind": kind,
                    "requests": len(batch),
                    "perSecond": round(len(batch) / seconds, 1),
                    "relayCpuMsPerRequest": None if relay_ms is None else round(relay_ms, 3),
                    "apiserverCpuMsPerRequest": round(api_ms, 3),
                    "relayOverUpstream": None if relay_ms is None else round(relay_ms / api_ms, 2),
                    "requestsPerRelayCpuSecond": None if relay_ms is None else round(1000 / relay_ms, 1),
                }
            )
            log.info("passthrough %s %s: %s", way, kind, rows[-1])
        return rows

    def close(self) -> None:
        if self.procs:
            self.cluster.stop_managers(self.procs)
        if self.fenced is not None:
            self.fenced.stop()
        if self.hop is not None:
            terminate(self.hop, 5)
        try:
            with httpx.Client(base_url=self.apiserver.url, timeout=30) as api:
                api.delete(f"/api/v1/namespaces/{self.ns}")
        except httpx.HTTPError as e:
            log.warning("passthrough bench: deleting namespace %s failed: %s", self.ns, e)


def run(cluster: BenchCluster, workdir: Path, *, requests: int = 400, clients: int = 8) -> dict[str, Any]:
    """The four ways, every kind of request: see the module docstring."""
    workdir.mkdir(parents=True, exist_ok=True)
    run = _Run(cluster, workdir, clients)
    try:
        run.start()
        if cluster.proxy is None or run.fenced is None or run.hop is None:
            raise RuntimeError("the benchmark cluster is not started")
        rows = [
            *run.measure("upstream", cluster.apiserver.url if cluster.apiserver else "", None, requests),
            *run.measure("hop", run.hop_url, run.hop.pid, requests),
            *run.measure("proxy", cluster.proxy.url, cluster.proxy_pid, requests),
            *run.measure("fenced", run.endpoint_url, run.fenced.pid, requests),
            *run.measure("fenced-root", run.root_url, run.fenced.pid, requests, root=True),
        ]
    finally:
        run.close()
    proxy = {r["kind"]: r for r in rows if r["way"] == "proxy"}
    return {
        "clients": clients,
        "rows": rows,
        "targetRatio": TARGET_RATIO,
        "proxyOverUpstream": {k: proxy[k]["relayOverUpstream"] for k in KINDS},
        "meetsTarget": all((proxy[k]["relayOverUpstream"] or 99) <= TARGET_RATIO for k in ("GET", "PATCH")),
    }
