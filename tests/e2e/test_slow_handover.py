"""Handovers while moved keys are in flight: every reconcile takes 0.5 s (``reconcileDelaySeconds``).

With millisecond reconciles a giver that unlocked its receiver without
draining would go unnoticed: its reconciles end long before the receiver has
relisted. Here every reconcile holds its key for ``DELAY`` seconds while a
load thread keeps changing objects, so joins, ``rebalance set-key`` moves and
graceful leaves happen with keys of the moving range mid-reconcile. Each
scenario asserts zero audit overlaps, that keys really changed hands, and the
path it claims was taken (read from each manager's
``rangeshard_handover_events_total`` counters): the receiver stayed locked
while its giver drained (``drain_waits > 0``) and the giver then unlocked it
(``unlocks > 0``).
"""

from __future__ import annotations

from hashing import MAX_HASH
from registry import State
from tests.e2e.conftest import Cluster, Load, Manager
from tests.e2e.kube import create_namespace, create_replicaset, replicasets_converged
from tests.e2e.test_manager import all_active
from tests.e2e.test_rebalance import cli
from tests.helpers import wait_until

DELAY = 0.5
SLOW = {"replicaset": {"workers": 6}}
KEYS = 16


def slow_cluster(cluster: Cluster, ns: str) -> list[str]:
    create_namespace(cluster.api, ns)
    names = [f"rs{i}" for i in range(KEYS)]
    for name in names:
        create_replicaset(cluster.api, ns, name, 0)
    return names


def counters(m: Manager) -> dict[str, float]:
    return m.handover("replicaset")


def test_joins_and_a_leave_while_moved_keys_are_in_flight(cluster: Cluster) -> None:
    ns = "slowjoin"
    names = slow_cluster(cluster, ns)
    a = cluster.start_manager(SLOW, reconcile_delay=DELAY)
    wait_until(lambda: all_active(cluster, "replicaset", 1), 40, "the first instance active")
    with Load(cluster, ns, names) as load:
        wait_until(lambda: load.patches >= 10, 20, "load running")
        b = cluster.start_manager(SLOW, reconcile_delay=DELAY)
        wait_until(lambda: all_active(cluster, "replicaset", 2), 40, "the second instance active")
        given = counters(a)
        # a gave half its range to b while reconciling keys of that half: it waited, then unlocked.
        assert given.get("drain_waits", 0) > 0, given
        assert given.get("unlocks", 0) >= 1, given
        c = cluster.start_manager(SLOW, reconcile_delay=DELAY)
        wait_until(lambda: all_active(cluster, "replicaset", 3), 40, "the third instance active")
        unlocks = sum(counters(m).get("unlocks", 0) for m in (a, b))
        assert unlocks >= 2, "each join must have been unlocked by its giver"
        assert counters(c).get("self_unlocks", 0) == 0  # its giver was alive: it did the unlocking
        # A graceful leave with keys in flight: b drains, then revokes; its neighbour inherits.
        assert b.terminate() == 0
        wait_until(lambda: all_active(cluster, "replicaset", 2), 40, "the two remaining instances active")
    assert "left the registry" in b.log.read_text()
    wait_until(lambda: replicasets_converged(cluster.api, ns), 40, "converged after the load")
    cluster.assert_safe_handover(may_be_idle=cluster.without_objects(ns))
    moved_twice = [k for k, ids in cluster.handed_over(cluster.without_objects(ns)).items() if len(ids) >= 2]
    assert moved_twice


def test_set_key_moves_both_ways_while_moved_keys_are_in_flight(cluster: Cluster) -> None:
    ns = "slowmove"
    names = slow_cluster(cluster, ns)
    first = cluster.start_manager(SLOW, reconcile_delay=DELAY)
    wait_until(lambda: all_active(cluster, "replicaset", 1), 40, "the first instance active")
    cluster.start_manager(SLOW, reconcile_delay=DELAY)
    wait_until(lambda: all_active(cluster, "replicaset", 2), 40, "two active instances")
    lower = cluster.snapshot("replicaset").members[0]
    assert lower.range is not None and lower.range.lo == 0
    lower_m = cluster.manager_of(lower.instance_id)
    upper_m = next(m for m in cluster.managers if m is not lower_m)
    assert first in (lower_m, upper_m)
    before = {m.name: counters(m) for m in (lower_m, upper_m)}
    with Load(cluster, ns, names) as load:
        wait_until(lambda: load.patches >= 10, 20, "load running")
        # Shrink the lower range to a quarter: the lower instance gives, the upper one receives.
        moved = cli(
            cluster, "set-key", "--type", "replicaset", "--instance", lower.instance_id, "--key", str(MAX_HASH // 4)
        )
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert "handover finished" in moved.stdout
        wait_until(lambda: all_active(cluster, "replicaset", 2), 40, "both active after the first move")
        gave = counters(lower_m)
        assert gave.get("unlocks", 0) > before[lower_m.name].get("unlocks", 0), gave
        assert gave.get("drain_waits", 0) > before[lower_m.name].get("drain_waits", 0), gave
        # And back past the middle: now the upper instance gives, the lower one receives.
        middle = cli(
            cluster, "set-key", "--type", "replicaset", "--instance", lower.instance_id, "--key", str(MAX_HASH // 4 * 3)
        )
        assert middle.returncode == 0, middle.stdout + middle.stderr
        wait_until(lambda: all_active(cluster, "replicaset", 2), 40, "both active after the second move")
        gave = counters(upper_m)
        assert gave.get("unlocks", 0) > before[upper_m.name].get("unlocks", 0), gave
        assert gave.get("drain_waits", 0) > before[upper_m.name].get("drain_waits", 0), gave
    snap = cluster.snapshot("replicaset")
    assert snap.members[0].record.hash_key == MAX_HASH // 4 * 3
    assert all(m.record.state is State.ACTIVE for m in snap)
    wait_until(lambda: replicasets_converged(cluster.api, ns), 40, "converged after the load")
    cluster.assert_safe_handover()
