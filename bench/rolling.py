"""Rolling restarts: keys moved and time unserved, with and without ``rejoinGraceSeconds``.

Purpose
    N managers (real processes, ``python -m bench.scaleout_manager``: the
    sharding framework running an I/O-bound reconcile that requeues every key
    at once, so each key is reconciled continuously) are restarted one at a
    time, each replaced by a process with the **same instance id** (a
    StatefulSet pod), under that steady load. Once with
    ``rejoinGraceSeconds: 0`` (a restart is a leave, the neighbour absorbs,
    then a join, the newcomer splits the largest range) and once with a grace
    (the stopped process parks its record, its replacement takes the same
    ``hashKey`` back). Measured, from the managers' audit logs and a registry
    poller (every 50 ms):

    * ``keyMoves``: times a key was reconciled by another instance than the
      one before it (an ownership change), ``keysMoved``: keys with at least one;
    * ``layoutChanges``: distinct ``(instance, hashKey)`` layouts the poller
      saw after the first, ``hashKeysChanged``: instances whose final key differs;
    * ``longestUnservedSeconds``: the longest gap between two reconciles of
      one key during the restart (a parked range waits for its owner);
    * ``convergedKeys``: keys reconciled, in the last second, by the instance
      whose final range holds them (out of ``objects``).

Invariants
    * Every process is stopped in ``finally``; every wait is bounded.
    * Each run uses its own registry prefix; the ConfigMaps are shared with
      the scale-out section (namespace ``bench-scale``).

Concurrency model
    The caller's thread spawns and stops processes; one poller thread reads
    the registry.
"""

from __future__ import annotations

import itertools
import logging
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench import scaleout_manager
from bench.common import BenchCluster, wait_managers
from bench.scaleout import NAMESPACE, RECONCILE_TIMEOUT, _create_configmaps, _read_audit
from bench.scaleout_manager import CONTROLLER_TYPE
from controller_manager.process import ManagerProcess
from hashing import hash_key
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from registry import Registry, State

log = logging.getLogger(__name__)


class _Rolling:
    def __init__(self, cluster: BenchCluster, workdir: Path, grace: float, workers: int, latency: float, ttl: int):
        if cluster.etcd is None or cluster.proxy is None:
            raise RuntimeError("the benchmark cluster is not started")
        self.etcd_url, self.proxy_url = cluster.etcd.url, cluster.proxy.url
        self.workdir = workdir
        self.grace, self.workers, self.latency, self.ttl = grace, workers, latency, ttl
        self.prefix = f"/bench-rolling-{uuid.uuid4().hex[:8]}"
        self.client = EtcdClient(EtcdConfig.from_urls(self.etcd_url))
        self.registry = Registry(self.client, self.prefix)
        self.cluster = cluster
        self.procs: dict[str, ManagerProcess] = {}
        self.hung_stops = 0
        self.audits: list[Path] = []
        self.layouts: list[tuple[tuple[str, int], ...]] = []
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="bench-rolling-poller", daemon=True)

    def spawn(self, name: str, incarnation: int) -> None:
        audit = self.workdir / f"{name}.{incarnation}.audit.jsonl"
        self.audits.append(audit)
        self.procs[name] = scaleout_manager.start(
            self.cluster, name, self.prefix, audit, self.workdir / f"{name}.{incarnation}.log",
            "--workers", str(self.workers), "--latency", str(self.latency),
            "--namespace", NAMESPACE, "--lease-ttl", str(self.ttl),
            "--reconcile-timeout", str(RECONCILE_TIMEOUT), "--rejoin-grace", str(self.grace),
        )  # fmt: skip

    def stop(self, name: str, timeout: float = 20.0) -> None:
        m = self.procs[name]
        m.send(signal.SIGTERM)
        if m.wait(timeout) is None:
            log.warning("manager %s did not stop within %ss: its threads' stacks go to its log", name, timeout)
            m.send(signal.SIGUSR1)
            time.sleep(0.5)  # let faulthandler write the stacks
            m.kill()
            self.hung_stops += 1

    def lease_of(self, name: str) -> int | None:
        member = self.registry.snapshot(CONTROLLER_TYPE).get(name)
        return member.lease_id if member is not None else None

    def wait_active(self, names: list[str], timeout: float, not_lease: dict[str, int | None] | None = None) -> None:
        """Every name registered, active and unlocked; a name in ``not_lease`` on another lease (a new process)."""
        stale = not_lease or {}

        def check() -> tuple[bool, str]:
            snap = self.registry.snapshot(CONTROLLER_TYPE)
            states = {m.instance_id: m.record for m in snap}
            leases = {m.instance_id: m.lease_id for m in snap}
            ready = (
                set(states) == set(names)
                and all(r.state is State.ACTIVE and not r.is_locked for r in states.values())
                and all(leases[n] != lease for n, lease in stale.items())
            )
            return ready, str({i: r.state.value for i, r in states.items()})

        wait_managers(check, [self.procs[n] for n in names], timeout, "all active")

    def _poll(self) -> None:
        while not self._stop.wait(0.05):
            try:
                snap = self.registry.snapshot(CONTROLLER_TYPE)
            except Exception:  # a transient etcd error: skip this read
                continue
            layout = tuple((m.instance_id, m.record.hash_key) for m in snap)
            if not self.layouts or self.layouts[-1] != layout:
                self.layouts.append(layout)

    def close(self) -> None:
        self._stop.set()
        if self._poller.is_alive():
            self._poller.join(5)
        self.cluster.stop_managers(list(self.procs.values()))
        self.client.close()


def _one(cluster: BenchCluster, workdir: Path, n: int, grace: float, objects: int, workers: int) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    r = _Rolling(cluster, workdir, grace, workers, latency=0.05, ttl=3)
    names = [f"r{i}" for i in range(n)]
    try:
        for i, name in enumerate(names):
            r.spawn(name, 0)
            r.wait_active(names[: i + 1], 60)
        time.sleep(1.0)  # steady state: every key requeued continuously
        before = {m.instance_id: m.record.hash_key for m in r.registry.snapshot(CONTROLLER_TYPE)}
        r._poller.start()
        t_start = time.time()
        for name in names:
            old_lease = r.lease_of(name)
            r.stop(name)
            r.spawn(name, 1)
            r.wait_active(names, 60, not_lease={name: old_lease})
        t_end = time.time()
        time.sleep(2.0)  # settle: the last restarted instance serves its keys again
        t_settled = time.time()
        final = r.registry.snapshot(CONTROLLER_TYPE)
        after = {m.instance_id: m.record.hash_key for m in final}
    finally:
        r.close()
    records = [x for x in _read_audit(r.audits) if t_start - 1.0 <= x["end"] <= t_settled]
    by_key: dict[str, list[dict[str, Any]]] = {}
    for x in records:
        by_key.setdefault(x["key"], []).append(x)
    moves, keys_moved, longest = 0, 0, 0.0
    for recs in by_key.values():
        recs.sort(key=lambda x: x["start"])
        changes = sum(1 for a, b in itertools.pairwise(recs) if a["instanceId"] != b["instanceId"])
        moves += changes
        keys_moved += 1 if changes else 0
        inside = [x for x in recs if t_start <= x["end"] <= t_end + 2.0]
        for a, b in itertools.pairwise(inside):
            longest = max(longest, b["start"] - a["end"])
    uids = _configmap_uids(cluster)
    owner_of = {}
    for key in uids:
        m = final.owner_of(hash_key(uids[key]))
        owner_of[key] = m.instance_id if m is not None else None
    converged = sum(
        1
        for key, recs in by_key.items()
        if any(x["instanceId"] == owner_of.get(key) and x["end"] >= t_settled - 1.0 for x in recs)
    )
    return {
        "managers": n,
        "rejoinGraceSeconds": grace,
        "objects": objects,
        "restartSeconds": round(t_end - t_start, 2),
        "keyMoves": moves,
        "keysMoved": keys_moved,
        "layoutChanges": max(0, len(r.layouts) - 1),
        "hashKeysChanged": sum(1 for i, k in before.items() if after.get(i) != k),
        "longestUnservedSeconds": round(longest, 2),
        "convergedKeys": converged,
        "hungStops": r.hung_stops,
    }


def _configmap_uids(cluster: BenchCluster) -> dict[str, str]:
    """``namespace/name -> uid`` of the benchmark's ConfigMaps (the keys the managers reconcile)."""
    import httpx  # noqa: PLC0415

    if cluster.apiserver is None:
        return {}
    with httpx.Client(base_url=cluster.apiserver.url, timeout=30) as c:
        items = c.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps").json().get("items", [])
    return {f"{NAMESPACE}/{i['metadata']['name']}": i["metadata"]["uid"] for i in items}


def run(
    cluster: BenchCluster, workdir: Path, *, counts: list[int], grace: float, objects: int, workers: int = 2
) -> dict[str, Any]:
    """A rolling restart of each count of managers, without and with ``rejoinGraceSeconds``; rows and ratios."""
    if cluster.apiserver is None:
        raise RuntimeError("the benchmark cluster is not started")
    _create_configmaps(cluster.apiserver.url, objects)
    objects = len(_configmap_uids(cluster))
    rows = []
    for n in counts:
        for g in (0.0, grace):
            row = _one(cluster, workdir / f"n{n}-grace{g:g}", n, g, objects, workers)
            log.info("rolling restart: %s", row)
            rows.append(row)
    return {"rows": rows}
