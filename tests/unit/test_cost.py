"""Balancing by measured reconcile cost (issue 26): the decayed tracker, the published cost histogram, the planner."""

from __future__ import annotations

import math
import random

import pytest

from controller_manager.cost import ARRIVAL_RECONCILES, MIN_SPAN_WINDOWS, CostTracker
from hashing import MAX_HASH, HashRange
from rangeshard.core.errors import ConfigError, PlanError
from registry.histogram import COST_UNITS_PER_SECOND, add_cost, gap_histogram
from registry.models import InstanceRecord, Snapshot, State
from registry.rebalance import (
    Strategy,
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


def test_arrival_reconciles_count_their_cost_decayed_over_the_window() -> None:
    """Before a key's cadence is seen its cost counts as it is, fading with age (as in earlier versions)."""
    clock = Clock()
    t = CostTracker(window=10.0, clock=clock)
    t.record(1, 0.5)
    t.record(1, 0.25)  # the arrival's second reconcile: still no interval of the key's own cadence
    t.record(2, 2.0)
    assert t.snapshot() == pytest.approx({1: 0.75, 2: 2.0})
    clock.now += 10.0  # one window later: e^-1 of everything
    assert t.snapshot() == pytest.approx({1: 0.75 / math.e, 2: 2.0 / math.e})
    clock.now += 10.0 * 30  # long forgotten: dropped below the floor
    assert t.snapshot() == {}
    t.record(3, float("nan"))
    t.record(3, -1.0)
    t.record(3, float("inf"))
    assert t.snapshot() == {}
    with pytest.raises(ValueError, match="positive"):
        CostTracker(window=0)


def _reconcile_every(t: CostTracker, clock: Clock, key: int, seconds: float, interval: float, duration: float) -> None:
    """Reconcile ``key`` (``seconds`` each) every ``interval`` for ``duration``, starting now; ends at the last one."""
    for i in range(round(duration / interval)):
        if i:
            clock.now += interval
        t.record(key, seconds)


def test_a_key_seen_for_one_second_reports_the_rate_of_one_seen_for_ten_windows() -> None:
    """Warm-up free: after a move the new owner reports the key's full rate after a few reconciles."""
    clock = Clock()
    t = CostTracker(window=10.0, clock=clock)
    old, new = 1, 2
    # ``old`` is reconciled every 0.1 s for ten windows; ``new`` arrives for its last second only.
    for i in range(1000):
        if i:
            clock.now += 0.1
        t.record(old, 0.01)
        if i >= 990:
            t.record(new, 0.01)
    steady = 0.01 * 10.0 / 0.1  # seconds per window: cost x window / interval
    snap = t.snapshot()
    assert snap[old] == pytest.approx(steady, rel=0.01)
    assert snap[new] == pytest.approx(snap[old], rel=0.01)
    # Between reconciles (within the key's cadence) nothing decays: no saw-tooth in what is published.
    clock.now += 0.09
    assert t.snapshot()[new] == pytest.approx(steady, rel=0.01)


def test_the_rate_holds_with_uneven_intervals_and_costs() -> None:
    """Jittered cadence and costs: 20 keys seen for two seconds sum to what 20 seen for ten windows do."""
    rnd = random.Random(26)
    clock = Clock()
    t = CostTracker(window=5.0, clock=clock)
    until, joined = clock.now + 50.0, clock.now + 48.0
    events: list[tuple[float, int]] = []
    for key in range(40):
        at = clock.now if key < 20 else joined  # keys 20.. moved in two seconds before the end
        while at < until:
            events.append((at, key))
            at += rnd.uniform(0.05, 0.15)
    for at, key in sorted(events):
        clock.now = at
        t.record(key, rnd.uniform(0.008, 0.012))
    snap = t.snapshot()
    old = sum(snap[k] for k in range(20))
    new = sum(snap[k] for k in range(20, 40))
    assert old == pytest.approx(20 * 0.01 * 5.0 / 0.1, rel=0.05)
    assert new == pytest.approx(old, rel=0.05)


def test_a_key_that_stops_being_reconciled_decays_and_is_forgotten() -> None:
    clock = Clock()
    t = CostTracker(window=10.0, clock=clock)
    _reconcile_every(t, clock, 7, 0.02, 0.5, 30.0)
    steady = t.snapshot()[7]
    assert steady == pytest.approx(0.02 * 10.0 / 0.5, rel=0.01)
    clock.now += 0.5 + 10.0  # one mean interval (the next reconcile is due), then one window overdue
    assert t.snapshot()[7] == pytest.approx(steady / math.e, rel=1e-6)
    clock.now += 10.0 * 30
    assert t.snapshot() == {}


def test_a_burst_is_not_extrapolated_beyond_the_minimum_span() -> None:
    """Reconciles all at once are no cadence: at most 1 / (1 - e^-MIN_SPAN_WINDOWS) times their cost."""
    clock = Clock()
    t = CostTracker(window=10.0, clock=clock)
    for _ in range(ARRIVAL_RECONCILES + 1):
        t.record(3, 0.1)
    assert t.snapshot()[3] == pytest.approx(0.1 / -math.expm1(-MIN_SPAN_WINDOWS))
    assert t.snapshot()[3] < 0.1 * 21


@pytest.mark.parametrize(
    "arrival",
    [
        [0.0, 0.3],  # what the runtime does: the first reconcile, the retry of the key refused while locked
        [0.0],  # one arrival reconcile only
        [0.0, 0.01, 0.02, 0.03, 0.04],  # a longer burst (updates right after the arrival)
    ],
)
def test_the_reconciles_of_an_arrival_are_not_taken_for_the_cadence(arrival: list[float]) -> None:
    """Key 1 has been reconciled every 0.5 s for ten windows; key 2 arrives, then has three intervals of 0.5 s."""
    clock = Clock()
    t = CostTracker(window=4.0, clock=clock)
    arrived = 40.0
    cadence = [arrived + arrival[-1] + 0.5 * i for i in range(1, 4)]
    events = sorted(
        [(0.5 * i, 1) for i in range(round(cadence[-1] / 0.5) + 1)]
        + [(arrived + at, 2) for at in arrival]
        + [(at, 2) for at in cadence]
    )
    start = clock.now
    for at, key in events:
        clock.now = start + at
        t.record(key, 0.05)
    snap = t.snapshot()
    assert snap[1] == pytest.approx(0.05 / (2 * math.sinh(0.5 / (2 * 4.0))), rel=1e-3)
    assert snap[2] == pytest.approx(snap[1], rel=0.01)


def test_a_key_back_after_a_long_gap_is_measured_afresh() -> None:
    """A key that left and came back (a gap of many intervals) reports its rate, not the gap as cheap time."""
    clock = Clock()
    t = CostTracker(window=10.0, clock=clock)
    _reconcile_every(t, clock, 4, 0.01, 0.1, 20.0)
    steady = t.snapshot()[4]
    clock.now += 8.0  # on another instance meanwhile (80 of its intervals)
    _reconcile_every(t, clock, 4, 0.01, 0.1, 1.0)
    assert t.snapshot()[4] == pytest.approx(steady, rel=0.01)
    # A slower cadence is picked up at once too: the first long gap restarts, the next interval is the new one.
    for _ in range(3):  # arrives again (the gap restarts it), then one interval of the new cadence
        clock.now += 5.0
        t.record(4, 0.01)
    assert t.snapshot()[4] == pytest.approx(0.01 / (2 * math.sinh(5.0 / (2 * 10.0))), rel=1e-6)  # ~ c W / I


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
    unpublished = _snapshot([MAX_HASH // 2, MAX_HASH], [1, MAX_HASH - 1], {}, publish=False)
    with pytest.raises(PlanError, match=r"this controller type has no reconcile times.*--by workload"):
        plan_by_cost(unpublished)  # no instance publishes cost (an external controller's)
    idle = _snapshot([MAX_HASH // 2, MAX_HASH], [1, MAX_HASH - 1], {1: 0.0, MAX_HASH - 1: 0.0})
    with pytest.raises(PlanError, match=r"no reconcile cost has been measured yet: use --by workload"):
        plan_by_cost(idle)
    with pytest.raises(ConfigError, match="not one of workload, range, cost"):
        make_plan(idle, "time")
    assert make_plan(unpublished, Strategy.WORKLOAD).by is Strategy.WORKLOAD == "workload"


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
