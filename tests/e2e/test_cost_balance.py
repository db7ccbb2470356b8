"""``rangeshard rebalance apply --by cost`` against running managers evens out the reconcile time they measure.

Issue 26's end-to-end acceptance: 4 manager processes run
:class:`tests.e2e.cost_controller.CostSleepController` (the benchmark's
sleeping controller) over 400 ConfigMaps, a seeded 10 % of which cost ten
times the reconcile time of the rest (50 ms against 5 ms; large against
scheduler overshoot on a loaded machine), each key reconciled again 0.5 s
after its last reconcile (a steady, unsaturated load). The expensive objects
sit in the lower half of the hash space, so equal object counts are far from
equal work. After ``apply --by cost`` the reconcile time each instance spent
(its ``rangeshard_reconcile_seconds_total`` over a stretch of steady load)
has max/mean <= 1.15; after ``apply --by workload`` on the same cluster the
same figure is measured and reported beside it. What each instance publishes
in its record (``histogram.cost``, what ``--by cost`` plans on) is reported
too.

The cost window is 4 s: the estimate needs no warm-up (see
:mod:`controller_manager.cost`), so a plan is made a few heartbeats after the
last move instead of three windows later. Waits poll the registry and the
metrics with deadlines.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import httpx

from bench.scaleout import _create_configmaps
from hashing import HashRange, hash_key
from registry import Snapshot
from registry.apply import handover_done
from registry.rebalance import max_over_mean, owned
from tests.e2e.conftest import Cluster, Manager, dump_logs
from tests.e2e.cost_controller import CONTROLLER_TYPE, NAMESPACE
from tests.e2e.test_manager import all_active
from tests.e2e.test_rebalance import cli
from tests.helpers import wait_until

MANAGERS = 4
OBJECTS = 400
EXPENSIVE = 40  # 10 %
EXPENSIVE_FACTOR = 10
WINDOW = 4.0  # costWindowSeconds
TARGET = 1.15
#: Heartbeats an instance publishes for its current range before its costs are read (the first may
#: carry a moved key's first reconcile only).
WARM_BEATS = 3
COST_CONTROLLER = {CONTROLLER_TYPE: {"class": "tests.e2e.cost_controller:CostSleepController", "workers": 4}}


def _objects(cluster: Cluster) -> dict[str, int]:
    """400 ConfigMaps; a seeded 40 of the 200 with the lowest hashes cost ten times as much. Name -> hash."""
    _create_configmaps(cluster.apiserver.url, OBJECTS, NAMESPACE, lambda i: {"cost": "1"})
    with httpx.Client(base_url=cluster.apiserver.url, timeout=30) as c:
        items = c.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps").json()["items"]
        hashes = {cm["metadata"]["name"]: hash_key(cm["metadata"]["uid"]) for cm in items}
        assert len(hashes) == OBJECTS
        lower = sorted(hashes, key=hashes.__getitem__)[: OBJECTS // 2]
        for name in random.Random(26).sample(lower, EXPENSIVE):
            r = c.patch(
                f"/api/v1/namespaces/{NAMESPACE}/configmaps/{name}",
                json={"data": {"cost": str(EXPENSIVE_FACTOR)}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
            assert r.status_code == 200, r.text
    return hashes


@dataclass
class Follower:
    """Follows the records: an instance's costs are read once it published ``WARM_BEATS`` heartbeats for its range."""

    cluster: Cluster
    beats: dict[str, tuple[HashRange, set[float]]] = field(default_factory=dict)

    def warm(self) -> Snapshot | None:
        snap = self.cluster.snapshot(CONTROLLER_TYPE)
        members = owned(snap)
        if len(members) != MANAGERS or not handover_done(snap):
            return None
        ready = sum(m.record.workload_num for m in members) == OBJECTS
        for m in members:
            hist, rng, beat = m.record.histogram, m.range, m.record.heartbeat_at
            if hist is None or rng is None or beat is None or (hist.lo, hist.hi) != (rng.lo, rng.hi):
                ready = False  # nothing published for this range yet
                continue
            seen_range, seen = self.beats.get(m.instance_id, (rng, set()))
            if seen_range != rng:
                seen = set()
            seen.add(beat)
            self.beats[m.instance_id] = (rng, seen)
            ready = ready and len(seen) >= WARM_BEATS and isinstance(hist.cost, list)
        return snap if ready else None

    def wait(self, what: str) -> Snapshot:
        snap = wait_until(self.warm, 40, f"costs published for the current ranges ({what})", interval=0.2)
        assert snap is not None
        return snap


def _counters(managers: list[Manager]) -> list[tuple[float, float]]:
    """(reconcile seconds, reconciles) so far, per manager."""
    out = []
    for m in managers:
        seconds = m.metric("rangeshard_reconcile_seconds_total", controller=CONTROLLER_TYPE)
        count = sum(
            m.metric("rangeshard_reconciles_total", controller=CONTROLLER_TYPE, result=r) for r in ("ok", "requeue")
        )
        out.append((seconds, count))
    return out


@dataclass(frozen=True)
class Measured:
    """One layout: reconcile seconds per instance (metrics), the costs the instances publish, the objects."""

    phase: str
    busy: list[float]
    published: list[float]
    objects: list[int]

    @property
    def ratio(self) -> float:
        return max_over_mean(self.busy)

    def line(self) -> str:
        return (
            f"{self.phase}: measured reconcile time max/mean {self.ratio:.3f} {[round(b, 2) for b in self.busy]}; "
            f"published cost max/mean {max_over_mean(self.published):.3f} {[round(p, 2) for p in self.published]}; "
            f"objects max/mean {max_over_mean(self.objects):.3f} {self.objects}"
        )


def _measure(cluster: Cluster, follower: Follower, phase: str) -> Measured:
    """Steady load on the current layout: what the instances publish, then their reconcile seconds over ~8 rounds."""
    snap = follower.wait(phase)
    members = owned(snap)
    managers = [cluster.manager_of(m.instance_id) for m in members]
    published = [sum(m.record.histogram.cost) for m in members if m.record.histogram is not None]
    before = _counters(managers)
    wait_until(
        lambda: sum(c for _, c in _counters(managers)) - sum(c for _, c in before) >= 8 * OBJECTS,
        40,
        f"eight rounds of reconciles ({phase})",
        interval=0.2,
    )
    after = _counters(managers)
    busy = [a - b for (a, _), (b, _) in zip(after, before, strict=True)]
    assert [m.instance_id for m in owned(cluster.snapshot(CONTROLLER_TYPE))] == [m.instance_id for m in members]
    return Measured(phase, busy, published, [m.record.workload_num for m in members])


def test_apply_by_cost_evens_out_measured_reconcile_time(cluster: Cluster) -> None:
    started = time.monotonic()
    _objects(cluster)
    for _ in range(MANAGERS):
        cluster.start_manager(COST_CONTROLLER, config_extra={"costWindowSeconds": WINDOW})
    wait_until(lambda: all_active(cluster, CONTROLLER_TYPE, MANAGERS), 60, f"{MANAGERS} active instances")
    follower = Follower(cluster)
    follower.wait("after the joins")

    by_cost = cli(cluster, "apply", "--type", CONTROLLER_TYPE, "--by", "cost", timeout=90)
    assert by_cost.returncode == 0, by_cost.stdout + by_cost.stderr + dump_logs(cluster)
    cost = _measure(cluster, follower, "apply --by cost")

    by_workload = cli(cluster, "apply", "--type", CONTROLLER_TYPE, "--by", "workload", timeout=90)
    assert by_workload.returncode == 0, by_workload.stdout + by_workload.stderr + dump_logs(cluster)
    workload = _measure(cluster, follower, "apply --by workload")

    print(f"\n{cost.line()}\n{workload.line()}\nwall time {time.monotonic() - started:.1f}s")
    assert len(cost.busy) == MANAGERS and min(cost.busy) > 0, cost
    assert cost.ratio <= TARGET, cost.line()
    assert len(workload.busy) == MANAGERS and min(workload.busy) > 0, workload  # measured and reported, not judged
    assert sum(workload.objects) == sum(cost.objects) == OBJECTS
