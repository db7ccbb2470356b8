"""Balance by measured cost: 4 managers, 400 objects of which 10 % cost ten times as much to reconcile.

Purpose
    The measured part of the ``balance`` section (the rest of it is pure
    computation). Managers are real processes (``python -m
    bench.scaleout_manager --period P``): every key is reconciled again ``P``
    seconds after its last reconcile, and a reconcile sleeps ``latency`` times
    the ConfigMap's ``data.cost`` (10 for a random 10 % of the objects, 1 for
    the rest), so each instance's demand is the sum of its keys' costs and no
    worker is saturated. After the managers joined (halving: equal key
    ranges), the reconcile time each instance spent in a window is read from
    the audit logs; then ``rebalance apply --by workload`` is applied (the
    planner of the CLI, through the handover) and measured, then ``--by cost``.
    Reported: max/mean of the measured reconcile time per instance in each
    phase (target after ``--by cost``: <= 1.15) and of the owned object counts.

Invariants
    * Every process is stopped in ``finally``; every wait is bounded.
    * Each run has its own registry prefix and namespace; objects and costs
      are seeded.

Concurrency model
    The caller's thread: spawns, polls, applies plans.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from pathlib import Path
from typing import Any

from bench import scaleout_manager
from bench.common import BenchCluster, settled, wait_managers
from bench.scaleout import RECONCILE_TIMEOUT, _create_configmaps
from bench.scaleout_manager import CONTROLLER_TYPE
from controller_manager.audit import read_records
from controller_manager.process import ManagerProcess
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from registry import Registry
from registry.apply import apply_plan
from registry.rebalance import make_plan, max_over_mean, owned

log = logging.getLogger(__name__)

NAMESPACE = "bench-cost"


def _create(api: str, objects: int, dear_share: float, dear_cost: int, seed: int) -> dict[str, int]:
    """ConfigMaps ``cm-i`` with ``data.cost``; returns name -> cost."""
    rnd = random.Random(seed)
    dear = set(rnd.sample(range(objects), int(objects * dear_share)))
    costs = {f"cm-{i}": (dear_cost if i in dear else 1) for i in range(objects)}
    _create_configmaps(api, objects, NAMESPACE, lambda i: {"cost": str(costs[f"cm-{i}"])})
    return costs


def run(
    cluster: BenchCluster,
    workdir: Path,
    *,
    managers: int = 4,
    objects: int = 400,
    window: float = 10.0,
    period: float = 2.0,
    latency: float = 0.005,
    seed: int = 26,
) -> dict[str, Any]:
    """Initial (halving), after ``apply --by workload``, after ``apply --by cost``: max/mean of measured time."""
    if cluster.etcd is None or cluster.proxy is None or cluster.apiserver is None:
        raise RuntimeError("the benchmark cluster is not started")
    workdir.mkdir(parents=True, exist_ok=True)
    costs = _create(cluster.apiserver.url, objects, 0.1, 10, seed)
    prefix = f"/bench-cost-{uuid.uuid4().hex[:8]}"
    client = EtcdClient(EtcdConfig.from_urls(cluster.etcd.url))
    registry = Registry(client, prefix)
    procs: list[ManagerProcess] = []
    audits: list[Path] = []
    phases: list[dict[str, Any]] = []

    def wait_settled(what: str) -> None:
        wait_managers(lambda: settled(registry, CONTROLLER_TYPE, len(procs)), procs, 60, f"cost balance: {what}")

    def measure(name: str) -> None:
        time.sleep(window / 2)  # the new layout's caches and requeues settle
        t_a = time.time()
        time.sleep(window)
        t_b = time.time()
        recs = [
            r
            for r in read_records([a for a in audits if a.exists()])
            if t_a <= r.end < t_b and r.key.startswith(NAMESPACE + "/")
        ]
        busy: dict[str, float] = {}
        for r in recs:
            busy[r.instance_id] = busy.get(r.instance_id, 0.0) + (r.end - r.start)
        snap = registry.snapshot(CONTROLLER_TYPE)
        ids = [m.instance_id for m in owned(snap)]
        seconds = [round(busy.get(i, 0.0), 3) for i in ids]
        counts = [m.record.workload_num for m in owned(snap)]
        phases.append(
            {
                "phase": name,
                "reconcileSecondsPerInstance": seconds,
                "measuredCostMaxOverMean": round(max_over_mean(seconds), 3),
                "objectsPerInstance": counts,
                "objectsMaxOverMean": round(max_over_mean(counts), 3),
            }
        )
        log.info("cost balance %s: %s", name, phases[-1])

    try:
        for i in range(managers):
            name = f"c{i}"
            audit = workdir / f"{name}.audit.jsonl"
            audits.append(audit)
            process = scaleout_manager.start(
                cluster, name, prefix, audit, workdir / f"{name}.log",
                "--workers", "4", "--latency", str(latency), "--namespace", NAMESPACE,
                "--lease-ttl", "5", "--reconcile-timeout", str(RECONCILE_TIMEOUT),
                "--period", str(period), "--cost-window", str(window), "--resync-seconds", "5",
            )  # fmt: skip
            procs.append(process)
            wait_settled(f"{i + 1} managers active")
        measure("halving (after joins)")
        for by in ("workload", "cost"):
            # The instances that received keys measure them from their first reconcile on: their decayed sums
            # reach ~95 % of the steady state after 3 windows (docs/rebalance.md).
            time.sleep(2.0 if by == "workload" else 2 * window)
            plan = make_plan(registry.snapshot(CONTROLLER_TYPE), by)
            moves = apply_plan(registry, plan, timeout=60)
            wait_settled(f"settled after apply --by {by}")
            measure(f"apply --by {by}")
            phases[-1]["moves"] = moves
    finally:
        cluster.stop_managers(procs)
        client.close()
    return {
        "managers": managers,
        "objects": objects,
        "expensiveShare": 0.1,
        "expensiveFactor": 10,
        "demandSecondsPerSecond": round(sum(costs.values()) * latency / period, 3),
        "windowSeconds": window,
        "phases": phases,
        "target": "measuredCostMaxOverMean <= 1.15 after apply --by cost",
    }
