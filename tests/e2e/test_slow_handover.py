"""Handovers while moved keys are in flight, created deterministically.

With millisecond reconciles a giver that unlocked its receiver without
draining would go unnoticed: its reconciles end long before the receiver has
relisted. Here the giver's reconciles are *held* (``reconcileHoldFile``:
while the test keeps the file, every reconcile holds its claimed key, up to
its deadline) and every object of its range is touched, so all of its keys
are in flight -- seen on ``rangeshard_reconciles_in_flight`` -- *before* the
join or ``rebalance set-key`` move happens. The test then waits until the
giver has counted a drain wait (``drain_waits``), releases the hold, and
checks the giver unlocked its receiver (``unlocks``). Nothing depends on
timing luck: a moved key is in flight because the test put it there (the
object set is built so every quarter of the hash space holds objects).
Each scenario also runs a load thread and asserts zero audit overlaps and
that keys really changed hands.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

from kubernetes import client as k8s

from hashing import MAX_HASH, HashRange, hash_key
from rangeshard.core.process import popen
from registry import State
from tests.e2e.conftest import Cluster, Load, Manager
from tests.e2e.kube import create_namespace, create_replicaset, replicasets, replicasets_converged
from tests.e2e.test_manager import all_active
from tests.helpers import wait_until

#: More workers than objects: a held giver has every key of its range in flight at once.
WORKERS = 48
SLOW = {"replicaset": {"workers": WORKERS}}
#: A held reconcile lasts until its deadline at most: long enough for a CLI to start and a join to happen.
HOLD_TIMEOUT = 8.0
HOLD_TTL = 20  # reconcileTimeoutSeconds must stay below leaseTTLSeconds / 2
PER_QUARTER = 2
QUARTERS = [HashRange(q * (MAX_HASH // 4) + min(q, 1), (q + 1) * (MAX_HASH // 4)) for q in range(3)] + [
    HashRange(3 * (MAX_HASH // 4) + 1, MAX_HASH)
]


def start(cluster: Cluster) -> Manager:
    return cluster.start_manager(SLOW, hold=True, reconcile_timeout=HOLD_TIMEOUT, lease_ttl=HOLD_TTL)


def quartered_replicasets(cluster: Cluster, ns: str) -> dict[str, int]:
    """Create replicasets (0 replicas) until every quarter of the hash space holds ``PER_QUARTER``; name -> hash."""
    create_namespace(cluster.api, ns)
    for i in range(4 * WORKERS // 2):
        counts = [0, 0, 0, 0]
        for rs in replicasets(cluster.api, ns):
            h = hash_key(rs["metadata"]["uid"])
            counts[next(q for q, r in enumerate(QUARTERS) if r.contains(h))] += 1
        if min(counts) >= PER_QUARTER:
            break
        create_replicaset(cluster.api, ns, f"rs{i}", 0)
    else:
        raise AssertionError(f"random uids left a quarter of the hash space short: {counts}")
    return {rs["metadata"]["name"]: hash_key(rs["metadata"]["uid"]) for rs in replicasets(cluster.api, ns)}


def in_flight(m: Manager) -> float:
    return m.metric("rangeshard_reconciles_in_flight", controller="replicaset")


def counters(m: Manager) -> dict[str, float]:
    return m.handover("replicaset")


def hold_every_key(cluster: Cluster, giver: Manager, ns: str, objects: dict[str, int]) -> None:
    """Hold ``giver``'s reconciles and put every key of its range in flight (each object touched)."""
    assert giver.hold_file is not None
    me = next(m for m in cluster.snapshot("replicaset") if cluster.manager_of(m.instance_id) is giver)
    assert me.range is not None
    mine = [name for name, h in objects.items() if me.range.contains(h)]
    assert mine and len(mine) <= WORKERS
    giver.hold_file.touch()
    apps = k8s.AppsV1Api(cluster.api)
    for name in mine:
        apps.patch_namespaced_replica_set(name, ns, {"metadata": {"annotations": {"touch": uuid.uuid4().hex}}})
    wait_until(lambda: in_flight(giver) >= len(mine), 20, f"{giver.name}'s {len(mine)} keys in flight")


def release(giver: Manager) -> None:
    assert giver.hold_file is not None
    giver.hold_file.unlink()


def set_key(cluster: Cluster, instance_id: str, key: int) -> subprocess.Popen[str]:
    return popen(
        [
            *(sys.executable, "-m", "rangeshard.cli.main", "rebalance", "set-key", "--type", "replicaset"),
            *("--instance", instance_id, "--key", str(key)),
            *("--etcd", cluster.registry_etcd_url, "--prefix", cluster.registry_prefix),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def finished(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out
    assert "handover finished" in out, out
    return out


def test_joins_and_a_leave_while_moved_keys_are_in_flight(cluster: Cluster) -> None:
    ns = "slowjoin"
    objects = quartered_replicasets(cluster, ns)
    a = start(cluster)
    wait_until(lambda: all_active(cluster, "replicaset", 1), 40, "the first instance active")
    hold_every_key(cluster, a, ns, objects)
    with Load(cluster, ns, sorted(objects)) as load:
        b = start(cluster)
        # a gives half its range to b while every key of that half is in flight: it must wait ...
        wait_until(lambda: counters(a).get("drain_waits", 0) > 0, 40, "a waiting for its moved keys")
        assert not all_active(cluster, "replicaset", 2)  # ... and b stays locked meanwhile
        release(a)
        wait_until(lambda: all_active(cluster, "replicaset", 2), 40, "the second instance active")
        assert counters(a).get("unlocks", 0) >= 1  # ... then unlock b itself
        assert counters(b).get("self_unlocks", 0) == 0
        wait_until(lambda: load.patches >= 10, 20, "load running")
        c = start(cluster)
        wait_until(lambda: all_active(cluster, "replicaset", 3), 40, "the third instance active")
        unlocks = sum(counters(m).get("unlocks", 0) for m in (a, b))
        assert unlocks >= 2, "each join must have been unlocked by its giver"
        assert counters(c).get("self_unlocks", 0) == 0  # its giver was alive: it did the unlocking
        # A graceful leave with keys in flight: b drains, then revokes; its neighbour inherits.
        hold_every_key(cluster, b, ns, objects)
        b.hold_file.unlink()  # type: ignore[union-attr]  # in flight now; the leave waits for them
        assert b.terminate() == 0
        wait_until(lambda: all_active(cluster, "replicaset", 2), 40, "the two remaining instances active")
    assert "left the registry" in b.log.read_text()
    wait_until(lambda: replicasets_converged(cluster.api, ns), 40, "converged after the load")
    cluster.assert_safe_handover(may_be_idle=cluster.without_objects(ns))
    moved_twice = [k for k, ids in cluster.handed_over(cluster.without_objects(ns)).items() if len(ids) >= 2]
    assert moved_twice
    cluster.assert_no_tracebacks()


def move(cluster: Cluster, giver: Manager, ns: str, objects: dict[str, int], instance_id: str, key: int) -> None:
    """``rebalance set-key`` while every key of ``giver`` is held in flight; the giver must drain, then unlock."""
    before = counters(giver)
    hold_every_key(cluster, giver, ns, objects)
    proc = set_key(cluster, instance_id, key)
    try:
        wait_until(
            lambda: counters(giver).get("drain_waits", 0) > before.get("drain_waits", 0),
            40,
            f"{giver.name} waiting for its moved keys",
        )
        assert proc.poll() is None  # set-key waits for the handover, which waits for the drain
    finally:
        release(giver)
    finished(proc)
    wait_until(lambda: all_active(cluster, "replicaset", 2), 40, "both active after the move")
    gave = counters(giver)
    assert gave.get("unlocks", 0) > before.get("unlocks", 0), gave


def test_set_key_moves_both_ways_while_moved_keys_are_in_flight(cluster: Cluster) -> None:
    ns = "slowmove"
    objects = quartered_replicasets(cluster, ns)
    start(cluster)
    wait_until(lambda: all_active(cluster, "replicaset", 1), 40, "the first instance active")
    start(cluster)
    wait_until(lambda: all_active(cluster, "replicaset", 2), 40, "two active instances")
    lower = cluster.snapshot("replicaset").members[0]
    assert lower.range is not None and lower.range.lo == 0
    lower_m = cluster.manager_of(lower.instance_id)
    upper_m = next(m for m in cluster.managers if m is not lower_m)
    with Load(cluster, ns, sorted(objects)) as load:
        wait_until(lambda: load.patches >= 10, 20, "load running")
        # Shrink the lower range to a quarter: the lower instance gives, the upper one receives.
        move(cluster, lower_m, ns, objects, lower.instance_id, MAX_HASH // 4)
        # And back past the middle: now the upper instance gives, the lower one receives.
        move(cluster, upper_m, ns, objects, lower.instance_id, MAX_HASH // 4 * 3)
    snap = cluster.snapshot("replicaset")
    assert snap.members[0].record.hash_key == MAX_HASH // 4 * 3
    assert all(m.record.state is State.ACTIVE for m in snap)
    wait_until(lambda: replicasets_converged(cluster.api, ns), 40, "converged after the load")
    cluster.assert_safe_handover()
    cluster.assert_no_tracebacks()
