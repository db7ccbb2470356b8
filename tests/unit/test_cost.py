"""Balancing by measured reconcile cost (issue 26): the decayed tracker, the published cost histogram, the planner."""

from __future__ import annotations

import math
import random

import pytest

from controller_manager.cost import CostTracker
from hashing import MAX_HASH, HashRange
from rangeshard.core.errors import ConfigError
from registry.models import InstanceRecord, Snapshot, State
from registry.rebalance import (
    COST_UNITS_PER_SECOND,
    add_cost,
    gap_histogram,
    loads_of,
    make_plan,
    max_over_mean,
    member_cost_units,
    plan_by_cost,
    plan_by_workload,
)

CT = "widget"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_tracker_sums_and_decays_over_the_window() -> None:
    clock = Clock()
    t = CostTracker(window=10.0, clock=clock)
    t.record(1, 0.5)
    t.record(1, 0.25)
    t.record(2, 2.0)
    assert t.snapshot() == pytest.approx({1: 0.75, 2: 2.0})
    clock.now += 10.0  # one window later: e^-1 of everything
    assert t.snapshot() == pytest.approx({1: 0.75 / math.e, 2: 2.0 / math.e})
    t.record(1, 1.0)  # decayed old value plus the new one
    assert t.snapshot()[1] == pytest.approx(0.75 / math.e + 1.0)
    clock.now += 10.0 * 30  # long forgotten: dropped below the floor
    assert t.snapshot() == {}
    t.record(3, float("nan"))
    t.record(3, -1.0)
    assert t.snapshot() == {}
    with pytest.raises(ValueError, match="positive"):
        CostTracker(window=0)


def test_add_cost_puts_each_key_in_its_gap_bucket() -> None:
    rng = HashRange(0, MAX_HASH)
    rnd = random.Random(1)
    keys = sorted({rnd.randrange(MAX_HASH) for _ in range(40)})
    assert len(keys) == 40
    hist = gap_histogram(keys, rng, max_buckets=8)
    costs = {k: (10.0 if i % 10 == 0 else 1.0) for i, k in enumerate(keys)}
    costs[MAX_HASH // 2 + 12345] = 0.0  # a zero cost adds nothing
    add_cost(hist, costs)
    assert len(hist["cost"]) == len(hist["objects"])
    assert sum(hist["cost"]) == pytest.approx(sum(costs.values()))
    # Each bucket's cost is the sum over the keys the bucket's objects count.
    starts = [0, *hist["ends"][:-1]]
    for j, (lo_cell, hi_cell) in enumerate(zip(starts, hist["ends"], strict=True)):
        inside = [k for k in keys if lo_cell <= (k * hist["cells"]) // (MAX_HASH + 1) < hi_cell]
        assert len(inside) == hist["objects"][j]
        assert hist["cost"][j] == pytest.approx(sum(costs[k] for k in inside))
    outside = add_cost(gap_histogram([1, 2], HashRange(0, 100)), {10**12: 5.0})
    assert outside["cost"] == [0.0] * len(outside["objects"])  # keys outside the range are left out


def _snapshot(keys: list[int], objects: list[int], cost_of: dict[int, float], *, publish: bool = True) -> Snapshot:
    items = []
    prev = -1
    for i, k in enumerate(sorted(keys)):
        hi = MAX_HASH if i == len(keys) - 1 else k
        rng = HashRange(prev + 1, hi)
        mine = [o for o in objects if rng.contains(o)]
        hist = gap_histogram(mine, rng)
        if publish:
            add_cost(hist, {o: cost_of[o] for o in mine})
        rec = InstanceRecord.model_validate(
            {
                "instanceId": f"i{i}",
                "controllerType": CT,
                "hashKey": k,
                "workloadNum": len(mine),
                "state": State.ACTIVE,
                "histogram": hist,
            }
        )
        items.append((rec, f"/k/{i}", 1, 1, 0))
        prev = hi
    return Snapshot.build(CT, 1, items)


def _measured(snap_targets: tuple[int, ...], objects: list[int], cost_of: dict[int, float]) -> list[float]:
    loads = [0.0] * len(snap_targets)
    for o in objects:
        i = next(i for i, k in enumerate(snap_targets) if o <= k)
        loads[i] += cost_of[o]
    return loads


def test_plan_by_cost_evens_out_measured_time_where_counts_do_not() -> None:
    """400 objects, 10 % of them 10x as expensive and clustered: by cost max/mean <= 1.15, by count it is not."""
    rnd = random.Random(5)
    cheap = [rnd.randrange(MAX_HASH) for _ in range(360)]
    dear = [rnd.randrange(MAX_HASH // 4) for _ in range(40)]  # the expensive ones sit in one quarter
    objects = cheap + dear
    cost_of = {o: 0.01 for o in cheap} | {o: 0.1 for o in dear}
    keys = [MAX_HASH // 4 * (i + 1) - 1 for i in range(3)] + [MAX_HASH]
    snap = _snapshot(keys, objects, cost_of)
    by_cost = plan_by_cost(snap)
    by_count = plan_by_workload(snap)
    cost_ratio = max_over_mean(_measured(by_cost.targets, objects, cost_of))
    count_ratio = max_over_mean(_measured(by_count.targets, objects, cost_of))
    assert cost_ratio <= 1.15, (cost_ratio, by_cost.targets)
    assert count_ratio > 1.3, count_ratio  # equal counts leave the expensive quarter's owner saturated
    assert by_cost.by == "cost" and make_plan(snap, "cost").targets == by_cost.targets
    # Loads are in microseconds of measured time.
    assert sum(by_cost.current_loads) == pytest.approx(sum(cost_of.values()) * COST_UNITS_PER_SECOND, rel=1e-3)
    assert loads_of(snap, "cost") == list(by_cost.current_loads)
    assert loads_of(snap, "workload") == [m.record.workload_num for m in snap]


def test_nothing_measured_is_a_clear_error() -> None:
    snap = _snapshot([MAX_HASH // 2, MAX_HASH], [1, MAX_HASH - 1], {}, publish=False)
    with pytest.raises(ConfigError, match=r"no reconcile cost has been measured yet.*--by workload"):
        plan_by_cost(snap)
    with pytest.raises(ConfigError, match="not one of workload, range, cost"):
        make_plan(snap, "time")


@pytest.mark.parametrize(
    "bad",
    [["x"], [-1.0], [float("inf")], [True], "not a list", [], None],
)
def test_a_malformed_cost_histogram_is_ignored_not_fatal(bad: object) -> None:
    """The record stays readable; that instance counts as one segment with no cost."""
    rnd = random.Random(2)
    objects = [rnd.randrange(MAX_HASH) for _ in range(50)]
    cost_of = dict.fromkeys(objects, 0.02)
    snap = _snapshot([MAX_HASH // 2, MAX_HASH], objects, cost_of)
    first = snap.members[0]
    hist = first.record.histogram
    assert hist is not None
    broken = first.record.model_dump(by_alias=True)
    broken["histogram"] = {**hist.model_dump(by_alias=True), "cost": bad}
    rec = InstanceRecord.model_validate(broken)
    assert member_cost_units(type(first)(rec, first.range, first.key, 1, 1, 0)) == 0
    items = [(rec, first.key, 1, 1, 0), (snap.members[1].record, snap.members[1].key, 1, 1, 0)]
    plan = plan_by_cost(Snapshot.build(CT, 1, items))
    assert plan.current_loads[0] == 0 and plan.current_loads[1] > 0


def test_a_cost_list_of_the_wrong_length_is_ignored() -> None:
    objects = [5, MAX_HASH // 3, MAX_HASH - 5]
    snap = _snapshot([MAX_HASH], objects, dict.fromkeys(objects, 1.0))
    m = snap.members[0]
    data = m.record.model_dump(by_alias=True)
    data["histogram"]["cost"] = [1.0] * (len(data["histogram"]["objects"]) + 1)
    rec = InstanceRecord.model_validate(data)
    # Whole range, total cost still counted from the list: a mis-sized list cannot be placed, so by cost
    # the instance is one segment.
    plan = plan_by_cost(Snapshot.build(CT, 1, [(rec, m.key, 1, 1, 0)]))
    assert plan.targets == (MAX_HASH,)
