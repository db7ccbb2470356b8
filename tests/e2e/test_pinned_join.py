"""A joiner never splits a pinned range: with only pinned ranges it says so in its log and waits, then joins.

One manager owns the whole space and is pinned; a second manager starts: it
registers nothing and logs why, retrying; once the first is unpinned it joins
by splitting that range, and the handover finishes.
"""

from __future__ import annotations

from tests.e2e.conftest import Cluster
from tests.e2e.test_manager import RS_ONLY, all_active
from tests.helpers import wait_until
from tests.registry.test_cli import run


def test_a_joiner_waits_while_only_pinned_ranges_exist(cluster: Cluster) -> None:
    cluster.start_manager(RS_ONLY, name="p1")
    wait_until(lambda: all_active(cluster, "replicaset", 1), 40, "p1 active")
    etcd = ("--etcd", cluster.registry_etcd_url, "--prefix", cluster.registry_prefix)
    pinned = run("rebalance", "pin", "--type", "replicaset", "--instance", "p1-replicaset", *etcd)
    assert pinned.returncode == 0, pinned.stderr
    second = cluster.start_manager(RS_ONLY, name="p2")
    wait_until(lambda: "only pinned ranges exist" in second.log.read_text(), 30, "the joiner to say why it waits")
    assert [m.instance_id for m in cluster.snapshot("replicaset")] == ["p1-replicaset"]
    assert "cannot join yet: replicaset: only pinned ranges exist" in second.log.read_text()
    unpinned = run("rebalance", "unpin", "--type", "replicaset", "--instance", "p1-replicaset", *etcd)
    assert unpinned.returncode == 0, unpinned.stderr
    wait_until(lambda: all_active(cluster, "replicaset", 2), 60, "p2 joined after the unpin")
    snap = cluster.snapshot("replicaset")
    assert snap.get("p2-replicaset").range.lo == 0  # type: ignore[union-attr]  # it split p1's range
    cluster.assert_no_tracebacks()
