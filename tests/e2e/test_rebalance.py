"""`rangeshard rebalance` against running managers: balance checked against the objects' own hashes."""

from __future__ import annotations

import bisect
import json
import os
import subprocess
import sys
import threading
from typing import Any

import pytest

from hashing import MAX_HASH, hash_key
from rangeshard.core.etcd import EtcdClient
from rangeshard.core.etcdserver import EtcdServer
from registry import Registry
from registry.rebalance import max_over_mean, owned, segments
from tests.e2e.conftest import Cluster
from tests.e2e.kube import create_namespace, create_replicaset, replicasets, scale_replicaset
from tests.e2e.test_manager import all_active
from tests.helpers import wait_until

RS_ONLY = {"replicaset": {"workers": 2}}


def cli(cluster: Cluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rangeshard.cli.main",
            "rebalance",
            *args,
            "--etcd",
            cluster.registry_etcd_url,
            "--prefix",
            cluster.registry_prefix,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )


def owned_by_hash(cluster: Cluster, ns: str) -> list[int]:
    """Objects per instance, from the registry keys and the replicasets' own uids."""
    keys = [m.record.hash_key for m in cluster.snapshot("replicaset")]
    counts = [0] * len(keys)
    for rs in replicasets(cluster.api, ns):
        h = hash_key(rs["metadata"]["uid"])
        idx = next(i for i, k in enumerate(keys) if h <= k or i == len(keys) - 1)
        counts[idx] += 1
    return counts


def start_managers(cluster: Cluster, n: int) -> None:
    for i in range(n):
        cluster.start_manager(RS_ONLY)
        wait_until(lambda i=i: all_active(cluster, "replicaset", i + 1), 40, f"{i + 1} active instances")


def published(cluster: Cluster, ns: str, total: int) -> bool:
    """``ns`` holds ``total`` replicasets and every record describes exactly those in its range.

    Checked per instance and per histogram bucket, not as a sum: a sum can match while a
    record is stale (a deleted object still counted by one instance, a new one not yet by
    another), and a plan made from such records is off by those objects.
    """
    snap = cluster.snapshot("replicaset")
    hashes = sorted(hash_key(rs["metadata"]["uid"]) for rs in replicasets(cluster.api, ns))
    if len(hashes) != total or not all(m.record.histogram for m in snap):
        return False

    def count(lo: int, hi: int) -> int:
        return bisect.bisect_right(hashes, hi) - bisect.bisect_left(hashes, lo)

    return all(m.record.workload_num == count(m.range.lo, m.range.hi) for m in owned(snap) if m.range) and all(
        seg.count == count(seg.lo, seg.hi) for seg in segments(snap)
    )


def unlocks(cluster: Cluster) -> float:
    """Receivers unlocked by their givers so far, over every running manager."""
    return sum(m.handover().get("unlocks", 0) for m in cluster.managers if m.alive)


def scaler(cluster: Cluster, ns: str, names: list[str], stop: threading.Event) -> None:
    """Keep reconciles going while boundaries move (bounded)."""
    for i in range(400):
        if stop.is_set():
            return
        scale_replicaset(cluster.api, ns, names[i % len(names)], i % 2)
        stop.wait(0.05)


def test_apply_by_workload_three_instances_under_load(cluster: Cluster) -> None:
    ns = "bal3"
    create_namespace(cluster.api, ns)
    start_managers(cluster, 3)
    names = [f"rs{i}" for i in range(60)]
    for name in names:
        create_replicaset(cluster.api, ns, name, 0)
    # Exactly 20/20/20 (once in 2,200 runs) leaves the plan nothing to gain, and nothing would move.
    for extra in range(10):
        if max_over_mean(owned_by_hash(cluster, ns)) >= 1.1:
            break
        names.append(f"rs-extra{extra}")
        create_replicaset(cluster.api, ns, names[-1], 0)
    total = len(names)
    wait_until(lambda: published(cluster, ns, total), 30, "workloads and histograms published", interval=0.2)
    before = owned_by_hash(cluster, ns)
    show = cli(cluster, "show", "--type", "replicaset", "--json")
    assert show.returncode == 0, show.stderr
    data = json.loads(show.stdout)
    assert [i["workloadNum"] for i in data["instances"]] == before
    assert data["maxOverMean"] == pytest.approx(max_over_mean(before), abs=1e-3)
    # Measured reconcile cost is published with the histograms (issue 26) and shown next to the object share.
    for m in cluster.snapshot("replicaset"):
        hist = m.record.histogram
        assert hist is not None and isinstance(hist.cost, list) and len(hist.cost) == len(hist.objects or [])
        assert hist.cost_window_seconds == 300
    assert sum(i["costSeconds"] for i in data["instances"]) > 0
    assert sum(i["costShare"] for i in data["instances"]) == pytest.approx(1.0, abs=1e-3)
    assert sum(i["objectShare"] for i in data["instances"]) == pytest.approx(1.0, abs=1e-3)
    by_cost = cli(cluster, "plan", "--type", "replicaset", "--by", "cost", "--json")
    assert by_cost.returncode == 0, by_cost.stderr
    assert json.loads(by_cost.stdout)["by"] == "cost"

    plan = cli(cluster, "plan", "--type", "replicaset", "--by", "workload", "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["predictedMaxOverMean"] <= 1.10

    unlocks_before = unlocks(cluster)
    stop = threading.Event()
    load = threading.Thread(target=scaler, args=(cluster, ns, names[:10], stop))
    load.start()
    try:
        applied = cli(cluster, "apply", "--type", "replicaset", "--by", "workload")
    finally:
        stop.set()
        load.join(30)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "applied" in applied.stdout
    # The figure printed is of the new ranges: every instance heartbeated after the last handover.
    assert "(republished by every instance)" in applied.stdout, applied.stdout
    after = owned_by_hash(cluster, ns)
    assert sum(after) == total
    assert max_over_mean(after) <= 1.10, after
    wait_until(lambda: all_active(cluster, "replicaset", 3), 20, "everyone active after the plan")
    # The plan's moves went through the lock -> drain -> unlock handover, and keys changed hands
    # (a receiver reconciles what it got once its informer relisted: "active" does not wait for that).
    assert unlocks(cluster) > unlocks_before
    wait_until(cluster.handed_over, 20, "a moved key reconciled by its new owner")
    cluster.assert_safe_handover()

    # One more boundary by hand, during reconciles, through the handover protocol.
    snap = cluster.snapshot("replicaset")
    first = snap.members[0]
    assert first.range is not None
    new_key = first.range.lo + (first.range.hi - first.range.lo) // 2
    stop = threading.Event()
    load = threading.Thread(target=scaler, args=(cluster, ns, names[:10], stop))
    load.start()
    try:
        moved = cli(cluster, "set-key", "--type", "replicaset", "--instance", first.instance_id, "--key", str(new_key))
    finally:
        stop.set()
        load.join(30)
    assert moved.returncode == 0, moved.stderr
    assert "handover finished" in moved.stdout
    assert cluster.snapshot("replicaset").members[0].record.hash_key == new_key
    cluster.assert_safe_handover()


def test_apply_by_workload_five_instances_skewed(cluster: Cluster) -> None:
    ns = "bal5"
    create_namespace(cluster.api, ns)
    start_managers(cluster, 5)
    for i in range(150):
        create_replicaset(cluster.api, ns, f"rs{i}", 0)
    # Skew: keep every object in the lower half of the space, only a few in the upper half.
    apps = cluster.api
    from kubernetes import client as k8s  # noqa: PLC0415

    api: Any = k8s.AppsV1Api(apps)
    upper = [rs for rs in replicasets(apps, ns) if hash_key(rs["metadata"]["uid"]) > MAX_HASH // 2]
    for rs in upper[5:]:
        api.delete_namespaced_replica_set(rs["metadata"]["name"], ns)
    total = len(replicasets(apps, ns))
    wait_until(lambda: published(cluster, ns, total), 30, "workloads and histograms published", interval=0.2)
    assert max_over_mean(owned_by_hash(cluster, ns)) > 1.3
    applied = cli(cluster, "apply", "--type", "replicaset", "--by", "workload")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    after = owned_by_hash(cluster, ns)
    assert max_over_mean(after) <= 1.10, after
    idle = cluster.without_objects(ns)
    wait_until(lambda: cluster.handed_over(idle), 20, "a moved key reconciled by its new owner")
    cluster.assert_safe_handover(may_be_idle=idle)
    # The automatic mode agrees there is nothing left to do (no flapping after a plan).
    wait_until(lambda: published(cluster, ns, total), 30, "workloads republished after the moves", interval=0.2)
    auto = cli(cluster, "auto", "--type", "replicaset", "--threshold", "1.15", "--once")
    assert auto.returncode == 0, auto.stderr
    assert "balanced" in auto.stdout


def test_invalid_rebalance_input_exits_2(etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str) -> None:
    reg = Registry(etcd_client, key_prefix)
    lease = etcd_client.grant_lease(300)  # outlives a slow run of the cases below
    for name in ("a", "b", "c"):
        reg.join("replicaset", name, lease)
    keys = {m.instance_id: m.record.hash_key for m in reg.snapshot("replicaset")}
    reg.unlock("replicaset", "b", "a")
    reg.unlock("replicaset", "c", "a")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "rangeshard.cli.main",
                "rebalance",
                *args,
                "--etcd",
                etcd_server.url,
                "--prefix",
                key_prefix,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    cases = [
        (["set-key", "--type", "replicaset", "--instance", "nobody", "--key", "5"], "unknown instance"),
        (["set-key", "--type", "replicaset", "--instance", "c", "--key", str(keys["b"])], "empty range or collide"),
        (["set-key", "--type", "replicaset", "--instance", "c", "--key", "-1"], "outside"),
        (["set-key", "--type", "replicaset", "--instance", "c", "--key", str(MAX_HASH + 1)], "outside"),
        (["set-key", "--type", "replicaset", "--instance", "c", "--key", "twelve"], "not an integer"),
        (["set-key", "--type", "replicaset", "--instance", "a", "--key", "5"], "last instance"),
        (["plan", "--type", "replicaset", "--by", "vibes"], "--by"),
        (["show", "--type", "Not/A/Type"], "--type"),
        (["auto", "--type", "replicaset", "--threshold", "0.5", "--once"], "threshold"),
    ]
    for args, message in cases:
        result = run(*args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    dry = run("set-key", "--type", "replicaset", "--instance", "c", "--key", str(keys["c"] + 1), "--dry-run")
    assert dry.returncode == 0 and "would move" in dry.stdout
    assert reg.snapshot("replicaset").get("c").record.hash_key == keys["c"]  # type: ignore[union-attr]
