"""External instances publish their real workload, and ``rebalance --by workload`` evens an external type.

Three managers run the unmodified official-client script of tests/e2e/external_child.py as an
``external:`` entry (ConfigMaps by uid). The endpoint counts the objects of the entry's main
resource it served the child, so each record's ``workloadNum`` and histogram describe exactly the
ConfigMaps in its range (checked against their own hashes); then ``rangeshard rebalance apply
--by workload`` moves boundaries through the handover protocol and the split becomes even.
"""

from __future__ import annotations

import bisect
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
    before = max_over_mean([m.record.workload_num for m in owned(cluster.snapshot(CTYPE))])
    assert before > 1.2, before

    show = cli(cluster, "show", "--type", CTYPE)
    assert show.returncode == 0, show.stderr
    applied = cli(cluster, "apply", "--type", CTYPE, "--by", "workload", "--yes", timeout=180)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_until(lambda: _active(cluster, 3), 60, "three active instances after the moves")
    wait_until(lambda: _published(cluster), 60, "the records to count the new ranges")
    after = max_over_mean([m.record.workload_num for m in owned(cluster.snapshot(CTYPE))])
    assert after < before and after <= 1.2, (before, after)
    cost = cli(cluster, "plan", "--type", CTYPE, "--by", "cost")
    assert cost.returncode == 2 and "--by workload" in cost.stderr + cost.stdout, cost.stderr
    cluster.assert_no_tracebacks()
