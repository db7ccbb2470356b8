"""External instances publish their real workload, and ``rebalance --by workload`` evens an external type.

Three managers run the unmodified official-client script of tests/e2e/external_child.py as an
``external:`` entry (ConfigMaps by uid). The endpoint counts the objects of the entry's main
resource it served the child, so each record's ``workloadNum`` and histogram describe exactly the
ConfigMaps in its range (checked against their own hashes); then ``rangeshard rebalance apply
--by workload`` moves boundaries through the handover protocol and the split becomes even.
"""

from __future__ import annotations

import bisect
import os
import signal
import subprocess
import sys
from pathlib import Path

from kubernetes import client as k8s

from hashing import hash_key
from registry.rebalance import max_over_mean, owned, segments
from tests.e2e.conftest import Cluster
from tests.e2e.kube import create_namespace
from tests.e2e.test_rebalance import cli
from tests.helpers import wait_until

CHILD = Path(__file__).with_name("external_child.py")
NS = "ext"
CTYPE = "ext"
N = 60


def _controllers() -> dict[str, object]:
    return {
        "ext": {
            "external": {
                "command": [sys.executable, str(CHILD), NS],
                "shard": [{"resource": "configmaps", "by": "uid", "main": True}],
                "drainSeconds": 0.5,
            }
        }
    }


def _hashes(api: object) -> list[int]:
    items = k8s.CoreV1Api(api).list_namespaced_config_map(NS, label_selector="app=ext").items
    return sorted(hash_key(cm.metadata.uid) for cm in items)


def _published(cluster: Cluster) -> bool:
    """Every record counts exactly the ConfigMaps of its range, per instance and per histogram segment."""
    snap = cluster.snapshot(CTYPE)
    hashes = _hashes(cluster.api)
    if len(hashes) != N or not all(m.record.histogram for m in snap):
        return False

    def count(lo: int, hi: int) -> int:
        return bisect.bisect_right(hashes, hi) - bisect.bisect_left(hashes, lo)

    return all(m.record.workload_num == count(m.range.lo, m.range.hi) for m in owned(snap) if m.range) and all(
        seg.count == count(seg.lo, seg.hi) for seg in segments(snap)
    )


def _active(cluster: Cluster, n: int) -> bool:
    snap = cluster.snapshot(CTYPE)
    return len(snap) == n and all(m.record.state.value == "active" and not m.record.is_locked for m in snap)


def test_external_instances_publish_their_workload_and_rebalance_evens_them(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    create_namespace(api, NS)
    v1 = k8s.CoreV1Api(api)
    for i in range(N):
        v1.create_namespaced_config_map(
            NS, {"metadata": {"name": f"cm{i}", "labels": {"app": "ext"}}, "data": {"want": "1"}}
        )
    for n in range(1, 4):
        cluster.start_manager(_controllers())
        wait_until(lambda n=n: _active(cluster, n), 60, f"{n} active instances")
    # Three instances split the space 1/2, 1/4, 1/4: an uneven split of the real objects.
    wait_until(lambda: _published(cluster), 60, "every record to count the ConfigMaps of its range")
    # (The uids are random: the split is uneven in expectation, 1.5 max/mean, not in every run.)
    before = max_over_mean([m.record.workload_num for m in owned(cluster.snapshot(CTYPE))])

    show = cli(cluster, "show", "--type", CTYPE)
    assert show.returncode == 0, show.stderr
    applied = cli(cluster, "apply", "--type", CTYPE, "--by", "workload", "--yes", timeout=180)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_until(lambda: _active(cluster, 3), 60, "three active instances after the moves")
    wait_until(lambda: _published(cluster), 60, "the records to count the new ranges")
    after = max_over_mean([m.record.workload_num for m in owned(cluster.snapshot(CTYPE))])
    assert after <= 1.2 and (after < before or before <= 1.2), (before, after)
    cost = cli(cluster, "plan", "--type", CTYPE, "--by", "cost")
    assert cost.returncode == 2 and "--by workload" in cost.stderr + cost.stdout, cost.stderr

    # The children are visible: pid, running/restarting, restarts and last exit in the records,
    # `registry list -o wide` and the managers' metrics (issue 41 item 6).
    record = cluster.snapshot(CTYPE).members[0].record
    assert record.child is not None and record.child.state == "running" and record.child.pid, record.child
    victim = record.child.pid
    manager = cluster.manager_of(record.instance_id)
    os.kill(victim, signal.SIGKILL)

    def restarted() -> bool:
        found = next(m for m in cluster.snapshot(CTYPE).members if m.instance_id == record.instance_id)
        child = found.record.child
        return child is not None and child.restarts >= 1 and child.last_exit == -9 and child.pid not in (None, victim)

    wait_until(restarted, 60, "the record to show the restarted child")
    assert manager.metric("rangeshard_external_child_restarts_total", type=CTYPE) >= 1
    wait_until(lambda: manager.metric("rangeshard_external_child_up", type=CTYPE) == 1, 30, "the child up again")
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "rangeshard.cli.main",
            "registry",
            "list",
            "-o",
            "wide",
            "--type",
            CTYPE,
            "--etcd",
            cluster.registry_etcd_url,
            "--prefix",
            cluster.registry_prefix,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert listed.returncode == 0, listed.stderr
    assert "CHILD" in listed.stdout and "last exit -9" in listed.stdout, listed.stdout
    cluster.assert_no_tracebacks()
