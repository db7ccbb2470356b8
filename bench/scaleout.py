"""Controller scale-out: reconcile throughput with 1, 2, 4 managers, join-to-active and SIGKILL-to-takeover times.

Purpose
    Managers are real processes (``python -m bench.scaleout_manager``: the
    controller_manager framework running :class:`~bench.scaleout_manager.SleepController`,
    an I/O-bound reconcile that sleeps ``latency`` seconds and requeues
    itself), registered in etcd, listing/watching ConfigMaps through the
    range filter proxy. Managers are added one at a time to reach each count
    in ``counts``; after every addition the benchmark waits until every
    instance is ``active`` (none locked) and then counts, from the audit logs,
    the reconciles that *finished* in a fixed window. The ideal is linear:
    ``N x workers / latency``. Measured as well:

    * join to active: from spawning the process to its registry record
      appearing, and from the record appearing to ``active`` (for the first
      manager: cache sync; for later ones: locked until the giver drained);
    * SIGKILL to takeover: after killing the newest manager, until its record
      is gone (lease expiry), until the survivors are all active again, and
      until the first reconcile, by a survivor, of a key the victim had been
      reconciling.

Invariants
    * Every manager is terminated (SIGTERM, then SIGKILL) in ``finally``; each
      also exits by itself after ``--max-seconds``.
    * Each run uses a fresh registry prefix, so runs never see each other.
    * Every wait is bounded (start-up, activation, window, takeover).

Concurrency model
    Synchronous: the caller's thread spawns processes and polls the registry
    (every 50 ms) and the audit files.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench import scaleout_manager
from bench.common import BenchCluster, settled, wait_managers
from bench.scaleout_manager import CONTROLLER_TYPE
from controller_manager.process import ManagerProcess
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from registry import Registry, State

log = logging.getLogger(__name__)

NAMESPACE = "bench-scale"
#: Bound of one reconcile (10x the sleep). A worker only starts a reconcile if it can end before the
#: lease fencing deadline (last keepalive + TTL - max(30 % TTL, 1 s)); with TTL 3 s and keepalives every
#: second, a 1 s bound leaves no slack for keepalive jitter and keys get refused (and dropped until resync).
RECONCILE_TIMEOUT = 0.5


@dataclass
class ManagerProc:
    process: ManagerProcess
    spawned: float
    registered: float | None = None
    active: float | None = None

    @property
    def name(self) -> str:
        return self.process.name

    @property
    def audit(self) -> Path:
        return self.process.audit or Path(f"{self.name}.audit.jsonl")


def _create_configmaps(
    api: str, n: int, namespace: str = NAMESPACE, data: Callable[[int], dict[str, str]] | None = None
) -> None:
    """Namespace ``namespace`` and ConfigMaps ``cm-0`` .. ``cm-{n-1}`` (``data(i)``, default ``{"i": i}``)."""

    async def go() -> None:
        async with httpx.AsyncClient(base_url=api, timeout=30) as client:
            resp = await client.post(
                "/api/v1/namespaces",
                json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            )
            if resp.status_code not in (201, 409):
                raise RuntimeError(f"create namespace: HTTP {resp.status_code}")
            sem = asyncio.Semaphore(4)

            async def one(i: int) -> None:
                async with sem:
                    body = {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {"name": f"cm-{i}"},
                        "data": data(i) if data is not None else {"i": str(i)},
                    }
                    r = await client.post(f"/api/v1/namespaces/{namespace}/configmaps", json=body)
                    if r.status_code not in (201, 409):
                        raise RuntimeError(f"create configmap: HTTP {r.status_code}: {r.text[:200]}")

            await asyncio.gather(*(one(i) for i in range(n)))

    asyncio.run(go())


def _read_audit(paths: list[Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in paths:
        if not p.exists():
            continue
        for line in p.read_bytes().splitlines():
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a line being written right now
            if isinstance(rec, dict) and str(rec.get("key", "")).startswith(NAMESPACE + "/"):
                out.append(rec)
    return out


class _Run:
    def __init__(self, cluster: BenchCluster, workdir: Path, latency: float, workers: int, lease_ttl: int) -> None:
        assert cluster.etcd is not None and cluster.proxy is not None
        self.cluster = cluster
        self.workdir = workdir
        self.latency = latency
        self.workers = workers
        self.lease_ttl = lease_ttl
        self.prefix = f"/bench-{uuid.uuid4().hex[:8]}"
        self.etcd_url = cluster.etcd.url
        self.proxy_url = cluster.proxy.url
        self.client = EtcdClient(EtcdConfig.from_urls(self.etcd_url))
        self.registry = Registry(self.client, self.prefix)
        self.managers: list[ManagerProc] = []

    def spawn(self) -> ManagerProc:
        name = f"bench-m{len(self.managers) + 1}"
        process = scaleout_manager.start(
            self.cluster, name, self.prefix, self.workdir / f"{name}.audit.jsonl", self.workdir / f"{name}.log",
            "--workers", str(self.workers), "--latency", str(self.latency),
            "--namespace", NAMESPACE, "--lease-ttl", str(self.lease_ttl),
            "--reconcile-timeout", str(RECONCILE_TIMEOUT),
        )  # fmt: skip
        m = ManagerProc(process, time.time())
        self.managers.append(m)
        return m

    def wait_all_active(self, timeout: float) -> None:
        """Poll the registry until every live manager is registered and active (none locked), noting when each was."""
        live = [m for m in self.managers if m.process.alive]

        def check() -> tuple[bool, str]:
            snap = self.registry.snapshot(CONTROLLER_TYPE)
            now = time.time()
            for m in live:
                member = snap.get(m.name)
                if member is not None and m.registered is None:
                    m.registered = now
                if member is not None and member.record.state == State.ACTIVE and not member.record.is_locked:
                    m.active = m.active or now
            return settled(self.registry, CONTROLLER_TYPE, len(live))

        wait_managers(check, [m.process for m in live], timeout, "all managers active")

    def window(self, seconds: float) -> dict[str, Any]:
        time.sleep(1.0)  # let the newest instance's relist and queue fill settle
        t_a = time.time()
        time.sleep(seconds)
        t_b = time.time()
        recs = [r for r in _read_audit([m.audit for m in self.managers]) if t_a <= r["end"] < t_b]
        per: dict[str, int] = {}
        keys: dict[str, set[str]] = {}
        for r in recs:
            per[r["instanceId"]] = per.get(r["instanceId"], 0) + 1
            keys.setdefault(r["instanceId"], set()).add(r["key"])
        live = [m.name for m in self.managers if m.process.alive]
        return {
            "managers": len(live),
            "reconciles": len(recs),
            "reconcilesPerSecond": round(len(recs) / (t_b - t_a), 1),
            "perManager": {name: per.get(name, 0) for name in live},
            "keysPerManager": {name: len(keys.get(name, ())) for name in live},
            "windowSeconds": round(t_b - t_a, 2),
            "idealPerSecond": round(len(live) * self.workers / self.latency, 1),
        }

    def takeover(self, timeout: float) -> dict[str, Any]:
        victim = self.managers[-1]
        since = time.time() - 2.0
        victim_keys = {r["key"] for r in _read_audit([victim.audit]) if r["end"] >= since}
        t_kill = time.time()
        victim.process.kill()
        gone = stable = first = None
        deadline = time.monotonic() + timeout
        others = [m for m in self.managers if m is not victim and m.process.alive]
        while time.monotonic() < deadline and (gone is None or stable is None or first is None):
            now = time.time()
            snap = self.registry.snapshot(CONTROLLER_TYPE)
            if gone is None and snap.get(victim.name) is None:
                gone = now
            if (
                gone is not None
                and stable is None
                and all(
                    (mm := snap.get(m.name)) is not None and mm.record.state == State.ACTIVE and not mm.record.is_locked
                    for m in others
                )
            ):
                stable = now
            if first is None:
                hits = [
                    r["start"]
                    for r in _read_audit([m.audit for m in others])
                    if r["start"] > t_kill and r["key"] in victim_keys
                ]
                if hits:
                    first = min(hits)
            time.sleep(0.05)
        return {
            "leaseTTLSeconds": self.lease_ttl,
            "victimKeys": len(victim_keys),
            "recordGoneSeconds": round(gone - t_kill, 2) if gone else None,
            "survivorsActiveSeconds": round(stable - t_kill, 2) if stable else None,
            "firstReconcileOfVictimKeySeconds": round(first - t_kill, 2) if first else None,
        }

    def close(self) -> None:
        self.cluster.stop_managers([m.process for m in self.managers], timeout=15)
        self.client.close()


def run(
    cluster: BenchCluster,
    workdir: Path,
    *,
    counts: list[int],
    window: float,
    latency: float,
    workers: int,
    objects: int,
    lease_ttl: int = 3,
) -> dict[str, Any]:
    """Add managers up to each count, measure throughput, then SIGKILL the newest and time the takeover."""
    assert cluster.apiserver is not None
    _create_configmaps(cluster.apiserver.url, objects)
    r = _Run(cluster, workdir, latency, workers, lease_ttl)
    windows: list[dict[str, Any]] = []
    try:
        for target in counts:
            while len(r.managers) < target:
                r.spawn()
                r.wait_all_active(60)
            row = r.window(window)
            log.info("scale-out %d managers: %s", target, row)
            windows.append(row)
        takeover = r.takeover(r.lease_ttl + 20.0) if len(r.managers) >= 2 else None
        log.info("takeover: %s", takeover)
    finally:
        r.close()
    base = windows[0]["reconcilesPerSecond"] if windows else 0.0
    for w in windows:
        w["speedup"] = round(w["reconcilesPerSecond"] / base, 2) if base else None
        w["efficiency"] = round(w["speedup"] / w["managers"], 2) if w["speedup"] is not None else None
        w["ofIdeal"] = round(w["reconcilesPerSecond"] / w["idealPerSecond"], 2)
    joins = [
        {
            "manager": m.name,
            "spawnToRegisteredSeconds": round(m.registered - m.spawned, 2) if m.registered else None,
            "registeredToActiveSeconds": round(m.active - m.registered, 2) if m.active and m.registered else None,
        }
        for m in r.managers
    ]
    return {
        "what": (
            "real manager processes (controller_manager framework, bench.scaleout_manager.SleepController: "
            "reconcile = sleep(latency) + requeue) over the proxy; reconciles finished in the window, from audit logs"
        ),
        "latencySeconds": latency,
        "workersPerManager": workers,
        "objects": objects,
        "throughput": windows,
        "joins": joins,
        "takeover": takeover,
        "target": "speedup >= 0.8 x managers",
    }
