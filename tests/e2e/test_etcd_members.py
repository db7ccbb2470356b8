"""Managers and the proxy's fencing on a 3-member etcd registry: one member down costs nothing.

Three managers (replicaset controller, ``leaseTTLSeconds: 4``) and the
proxy's write fencing use all three members; a steady scale load runs while,
in turn, the leader is SIGKILLed, a follower is SIGKILLed, a member is
SIGSTOPped for longer than the TTL, and every member is restarted once (a
rolling etcd upgrade). Throughout: no instance's lease changes (no lease
lost, no self-fencing), objects converge, no reconcile overlaps, and the API
server's audit log shows no stale-owner write.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time

from rangeshard.core.etcdserver import EtcdCluster
from tests.e2e.conftest import Cluster
from tests.e2e.kube import create_namespace, create_replicaset, replicasets_converged, scale_replicaset
from tests.helpers import wait_until

RS_ONLY = {"replicaset": {"workers": 2}}
TTL = 4


def _leases(cluster: Cluster) -> dict[str, int]:
    return {m.record.instance_id: m.lease_id for m in cluster.snapshot("replicaset")}


def test_one_member_down_at_a_time_costs_no_lease(members_cluster: Cluster, etcd_members: EtcdCluster) -> None:
    cluster = members_cluster
    api = cluster.api
    ns = "members"
    create_namespace(api, ns)
    names = [f"rs{i}" for i in range(9)]
    for name in names:
        create_replicaset(api, ns, name, 1)
    managers = [cluster.start_manager(RS_ONLY, lease_ttl=TTL) for _ in range(3)]
    wait_until(lambda: len(cluster.snapshot("replicaset")) == 3, 60, "three instances")
    wait_until(lambda: replicasets_converged(api, ns), 60, "first convergence")
    leases = _leases(cluster)

    stop = threading.Event()
    rng = random.Random(28)

    def load() -> None:
        for _ in range(10_000):  # bounded; stopped long before
            if stop.wait(0.3):
                return
            try:
                scale_replicaset(api, ns, rng.choice(names), rng.randint(1, 3))
            except Exception:  # the API server is not what is under test; keep the load going
                continue

    loader = threading.Thread(target=load, name="scale-load", daemon=True)
    loader.start()
    try:
        members = etcd_members.members
        leader = etcd_members.leader()
        leader.kill()
        time.sleep(3)  # the fault lasts (scenario time, not synchronisation)
        leader.start(timeout=30)
        etcd_members.leader()
        follower = next(m for m in members if m is not etcd_members.leader())
        follower.kill()
        time.sleep(3)  # the fault lasts
        follower.start(timeout=30)
        hung = next(m for m in members if m is not etcd_members.leader())
        hung.pause()
        time.sleep(TTL + 2)  # longer than the TTL
        hung.resume()
        for m in members:  # a rolling upgrade
            m.stop()
            m.start(timeout=30)
            etcd_members.leader()
    finally:
        stop.set()
        loader.join(10)
    assert all(m.alive for m in managers)
    wait_until(lambda: replicasets_converged(api, ns), 60, "converged after the faults")
    assert _leases(cluster) == leases, "an instance lost its lease (or re-registered)"
    for m in managers:
        text = m.log.read_text()
        assert "fenced (" not in text, text[-3000:]
    # 9 replicasets over 3 ranges: a range may hold none (0.75^9 ~ 7 % for a quarter), and rightly idle.
    assert cluster.overlaps(may_be_idle=cluster.without_objects(ns)) == []
    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "controller_manager.audit",
            "--apiserver-audit",
            str(cluster.workdir / "apiserver-audit.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert " 0 stale-owner write(s)" in check.stdout, check.stdout
    cluster.assert_no_tracebacks()
