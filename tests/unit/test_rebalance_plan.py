"""The rebalance planner on synthetic snapshots (pure: no etcd)."""

from __future__ import annotations

import random
import uuid

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hashing import MAX_HASH, HashRange, hash_key
from rangeshard.core.errors import ConfigError
from registry.apply import AutoPolicy, next_move
from registry.histogram import HISTOGRAM_BUCKETS, HISTOGRAM_CELLS, bucket_of, bucket_start, gap_histogram, histogram
from registry.models import InstanceRecord, Snapshot, State
from registry.rebalance import (
    Segment,
    loads_for,
    make_plan,
    max_over_mean,
    min_max_load,
    plan_by_range,
    plan_by_workload,
    segments,
)

CT = "replicaset"


def published(objects: list[int], rng: HashRange, layout: str) -> dict[str, object]:
    """The ``histogram`` field: ``gap`` as managers publish it now, ``equal`` as earlier versions did."""
    if layout == "gap":
        return gap_histogram(objects, rng)
    return {"lo": rng.lo, "hi": rng.hi, "counts": histogram(objects, rng)}


def snapshot(keys: list[int], objects: list[int], layout: str = "gap") -> Snapshot:
    """Instances with ``keys`` publishing exact histograms of ``objects`` (see :func:`published`)."""
    items = []
    prev = -1
    for i, k in enumerate(sorted(keys)):
        hi = MAX_HASH if i == len(keys) - 1 else k
        rng = HashRange(prev + 1, hi)
        rec = InstanceRecord.model_validate(
            {
                "instanceId": f"i{i}",
                "controllerType": CT,
                "hashKey": k,
                "workloadNum": sum(1 for o in objects if rng.contains(o)),
                "state": State.ACTIVE,
                "histogram": published(objects, rng, layout),
            }
        )
        items.append((rec, f"/k/{i}", 1, 1, 0))
        prev = hi
    return Snapshot.build(CT, 1, items)


def halving_keys(n: int) -> list[int]:
    keys = [MAX_HASH]
    for _ in range(n - 1):
        ranges = sorted(zip([-1, *sorted(keys)[:-1]], sorted(keys), strict=True), key=lambda r: (-(r[1] - r[0]), r[0]))
        lo, hi = ranges[0]
        keys.append(HashRange(lo + 1, hi).split()[0].hi)
    return sorted(keys)


def owned_counts(keys: list[int], objects: list[int]) -> list[int]:
    counts = [0] * len(keys)
    for o in objects:
        for i, k in enumerate(sorted(keys)):
            if o <= k or i == len(keys) - 1:
                counts[i] += 1
                break
    return counts


def test_bucket_arithmetic_is_exact() -> None:
    rng = HashRange(10, MAX_HASH)
    for j in (0, 1, 100, 255):
        start = bucket_start(j, rng, 256)
        assert bucket_of(start, rng, 256) == j
        if start > rng.lo:
            assert bucket_of(start - 1, rng, 256) == j - 1
    assert bucket_start(256, rng, 256) == MAX_HASH + 1


@pytest.mark.parametrize("n", [3, 5, 7])
@pytest.mark.parametrize("skewed", [False, True])
@pytest.mark.parametrize("layout", ["gap", "equal"])
def test_plan_by_workload_balances(n: int, skewed: bool, layout: str) -> None:
    rnd = random.Random(n * 10 + skewed)
    uids = [f"uid-{rnd.random()}" for _ in range(20 * n)]
    objects = [hash_key(u) for u in uids]
    if skewed:
        # Owner-hashed dependents: lumpy counts per owner key.
        objects = [o for o in objects for _ in range(1 + (o % 5 == 0) * 6)]
    keys = halving_keys(n)
    snap = snapshot(keys, objects, layout)
    plan = plan_by_workload(snap)
    actual = owned_counts(list(plan.targets), objects)
    assert list(plan.predicted_loads) == actual
    assert plan.predicted_ratio == pytest.approx(max_over_mean(actual), abs=1e-3)
    assert plan.predicted_ratio <= (1.10 if not skewed else 1.35)
    assert max_over_mean(actual) <= (1.10 if not skewed else 1.35)
    assert max_over_mean(actual) < max_over_mean(owned_counts(keys, objects))
    assert plan.targets[-1] == MAX_HASH and list(plan.targets) == sorted(set(plan.targets))


def test_clustered_objects_get_the_optimal_maximum() -> None:
    # Short strings hash into a few tight clusters of 60 | 20 | 10 objects.
    objects = [hash_key(str(i)) for i in range(90)]
    # Earlier records: 256 equal-width buckets cannot split a cluster, so 60 is the best they allow.
    coarse = plan_by_workload(snapshot(halving_keys(3), objects, "equal"))
    assert max(coarse.predicted_loads) == 60
    assert sorted(coarse.predicted_loads) == [10, 20, 60]
    assert owned_counts(list(coarse.targets), objects) == list(coarse.predicted_loads)
    # Cut at the gaps, the clusters split between any two objects: the true optimum.
    plan = plan_by_workload(snapshot(halving_keys(3), objects))
    assert list(plan.predicted_loads) == [30, 30, 30] == owned_counts(list(plan.targets), objects)


def e2e_objects(seed: int) -> list[int]:
    """The objects of e2e ``test_apply_by_workload_five_instances_skewed``: 150 uid4s, then all but
    five of those in the upper half of the space deleted."""
    rnd = random.Random(seed)
    hashes = [hash_key(str(uuid.UUID(int=rnd.getrandbits(128), version=4))) for _ in range(150)]
    return [h for h in hashes if h <= MAX_HASH // 2] + [h for h in hashes if h > MAX_HASH // 2][:5]


def optimum(objects: list[int], n: int) -> int:
    """The smallest maximum load any boundaries can give (objects with one hash stay together)."""
    runs: dict[int, int] = {}
    for o in objects:
        runs[o] = runs.get(o, 0) + 1
    return min_max_load([runs[h] for h in sorted(runs)], n)


def test_gap_histogram_balances_a_skew_the_256_equal_width_buckets_missed() -> None:
    # Seed 2409 of the e2e scenario's draw, with the dense lower half owned by one instance
    # (four boundaries must go between its 76 objects): 256 equal-width buckets cannot separate
    # some neighbours, so their best plan is 18 of 81 (max/mean 1.111 > 1.10, as once seen in
    # CI); the histogram cut at gaps reaches the optimum, 17 (1.049).
    objects = e2e_objects(2409)
    eighth = (MAX_HASH + 1) // 8
    keys = [4 * eighth - 1, 5 * eighth - 1, 6 * eighth - 1, 7 * eighth - 1, MAX_HASH]
    assert len(objects) == 81 and max_over_mean(owned_counts(keys, objects)) > 4

    coarse = plan_by_workload(snapshot(keys, objects, "equal"))
    assert owned_counts(list(coarse.targets), objects) == list(coarse.predicted_loads)
    assert max(coarse.predicted_loads) == 18 and max_over_mean(coarse.predicted_loads) > 1.10

    plan = plan_by_workload(snapshot(keys, objects, "gap"))
    actual = owned_counts(list(plan.targets), objects)
    assert actual == list(plan.predicted_loads)
    assert max(actual) == optimum(objects, 5) == 17
    assert max_over_mean(actual) <= 1.10


@pytest.mark.parametrize("n", [3, 5, 7])
def test_gap_histogram_plans_reach_the_optimum(n: int) -> None:
    # Random layouts and draws (e2e-like skew, plus owner-hashed lumps): never a single object over.
    rnd = random.Random(n)
    for seed in range(40):
        objects = e2e_objects(1000 * n + seed)
        if seed % 2:
            objects = [o for o in objects for _ in range(1 + (o % 7 == 0) * rnd.randrange(1, 9))]
        keys = [*sorted(rnd.sample(range(MAX_HASH), n - 1)), MAX_HASH]
        plan = plan_by_workload(snapshot(keys, objects))
        actual = owned_counts(list(plan.targets), objects)
        assert actual == list(plan.predicted_loads)
        assert max(actual) == optimum(objects, n), (seed, keys)


def test_gap_histogram_shape_and_record_size() -> None:
    rng = HashRange(MAX_HASH // 4 + 1, MAX_HASH // 2)
    rnd = random.Random(7)
    few = [rng.lo + rnd.randrange(rng.size) for _ in range(40)]
    many = [rng.lo + rnd.randrange(rng.size) for _ in range(20_000)] + [rng.lo + 5] * 300  # and one lump
    for objects in (few, many):
        hist = gap_histogram([*objects, rng.lo - 1, rng.hi + 1], rng)  # keys outside the range are not counted
        ends, counts = hist["ends"], hist["objects"]
        assert isinstance(ends, list) and isinstance(counts, list)
        assert hist["cells"] == HISTOGRAM_CELLS and ends[-1] == HISTOGRAM_CELLS
        assert ends == sorted(set(ends)) and len(ends) == len(counts) <= HISTOGRAM_BUCKETS
        assert sum(counts) == len(objects)
        # Each bucket holds exactly the objects between its edges, and every edge is in a gap.
        cells = sorted(bucket_of(o, rng, HISTOGRAM_CELLS) for o in objects)
        start = 0
        for end, count in zip(ends, counts, strict=True):
            assert sum(1 for c in cells if start <= c < end) == count > 0
            start = end
        record = InstanceRecord.model_validate(
            {"instanceId": "m1-replicaset", "controllerType": CT, "hashKey": rng.hi, "histogram": hist}
        )
        assert len(record.to_json()) < 4_500
    assert len(gap_histogram(few, rng)["ends"]) == 40  # one bucket per object
    lumpy = gap_histogram(many, rng)["objects"]
    assert isinstance(lumpy, list) and max(lumpy) >= 300  # one cell's objects are never split
    assert sorted(lumpy)[len(lumpy) // 2] <= 2 * (20_300 // HISTOGRAM_BUCKETS)  # about equal counts
    assert gap_histogram([], rng) == {
        "lo": rng.lo,
        "hi": rng.hi,
        "cells": HISTOGRAM_CELLS,
        "ends": [HISTOGRAM_CELLS],
        "objects": [0],
    }


def test_records_of_earlier_versions_are_still_read() -> None:
    rnd = random.Random(11)
    objects = [hash_key(f"uid-{rnd.random()}") for _ in range(90)]
    keys = halving_keys(3)
    # An earlier manager's record, as stored: 256 equal-width counts, no cells/ends/objects.
    lo = keys[0] + 1
    rng = HashRange(lo, keys[1])
    old_value = orjson.dumps(
        {
            "hashKey": keys[1],
            "workloadNum": sum(1 for o in objects if rng.contains(o)),
            "state": "active",
            "histogram": {"lo": rng.lo, "hi": rng.hi, "counts": histogram(objects, rng)},
            "someFieldOfTheFuture": 1,
        }
    )
    old = InstanceRecord.from_kv(CT, "i1", old_value)
    assert old.histogram is not None and len(old.histogram.counts) == 256 and old.histogram.ends is None
    new = snapshot(keys, objects)
    mixed = Snapshot.build(
        CT,
        1,
        [(m.record if m.instance_id != "i1" else old, m.key, 1, 1, 0) for m in new.members],
    )
    assert [m.record.histogram.ends is None for m in mixed.members if m.record.histogram] == [False, True, False]
    # The earlier record is read as its 256 equal-width buckets.
    assert len([seg for seg in segments(mixed) if rng.lo <= seg.lo and seg.hi <= rng.hi]) == 256
    plan = plan_by_workload(mixed)
    assert owned_counts(list(plan.targets), objects) == list(plan.predicted_loads)
    assert plan.predicted_ratio <= 1.10
    # New records leave the earlier field empty: an earlier reader falls back to workloadNum.
    assert orjson.loads(new.members[0].record.to_json())["histogram"]["counts"] == []


@pytest.mark.parametrize(
    "bad",
    [
        {"cells": 8, "ends": [4, 8], "objects": [1]},  # lengths differ
        {"cells": 8, "ends": [4, 7], "objects": [1, 1]},  # does not end at cells
        {"cells": 8, "ends": [4, 4, 8], "objects": [1, 0, 1]},  # edges must increase
        {"cells": 8, "ends": [8], "objects": [-1]},
        {"cells": 0, "ends": [0], "objects": [1]},
        {"ends": [8], "objects": [2]},  # no cells
        {"counts": [-1, 3]},
    ],
)
def test_an_inconsistent_histogram_is_ignored_not_fatal(bad: dict[str, object]) -> None:
    rng = HashRange(0, MAX_HASH)
    rec = InstanceRecord.model_validate(
        {
            "instanceId": "i0",
            "controllerType": CT,
            "hashKey": MAX_HASH,
            "workloadNum": 2,
            "histogram": {"lo": 0, "hi": MAX_HASH, **bad},
        }
    )
    snap = Snapshot.build(CT, 1, [(rec, "/k/0", 1, 1, 0)])
    assert segments(snap) == [Segment(rng.lo, rng.hi, 2)]


def test_plan_by_range_equalises_ranges() -> None:
    snap = snapshot(halving_keys(3), [hash_key(str(i)) for i in range(90)])
    plan = plan_by_range(snap)
    sizes = [b - a for a, b in zip([-1, *plan.targets[:-1]], plan.targets, strict=True)]
    assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ConfigError, match="--by"):
        make_plan(snap, "bogus")


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(0, MAX_HASH), min_size=2, max_size=6, unique=True),
    st.lists(st.integers(0, MAX_HASH), max_size=200),
)
def test_moves_can_always_be_ordered(keys: list[int], objects: list[int]) -> None:
    keys = sorted(keys)
    keys[-1] = MAX_HASH
    snap = snapshot(keys, objects)
    plan = plan_by_workload(snap)
    # Apply the moves the way apply_plan does, on plain keys.
    current = list(keys)
    for _ in range(4 * len(keys) + 4):
        snap = snapshot(current, objects)
        move = next_move(snap, plan.targets)
        if move is None:
            break
        idx = int(move.instance_id[1:])
        current[idx] = move.new_key
        assert current == sorted(set(current))
    assert tuple(current) == plan.targets
    assert sum(plan.predicted_loads) == len(objects)
    assert loads_for(list(plan.targets), segments(snapshot(list(plan.targets), objects))) == list(plan.predicted_loads)


def test_auto_policy_hysteresis_never_flaps() -> None:
    rnd = random.Random(3)
    snap = snapshot(halving_keys(3), [hash_key(f"uid-{rnd.random()}") for _ in range(90)])
    plan = plan_by_workload(snap)
    assert plan.predicted_ratio < 1.1
    policy = AutoPolicy(threshold=1.2, hysteresis=0.1, min_gain=0.05)
    assert policy.decide(1.1, plan) == "balanced"
    assert policy.decide(1.5, plan) == "apply"
    policy.applied()
    # Still above the threshold after applying (say new objects arrived): no second try...
    assert policy.decide(1.3, plan) == "disarmed"
    # ... until the imbalance once fell clearly below the threshold.
    assert policy.decide(1.15, plan) == "balanced"
    assert policy.decide(1.3, plan) == "disarmed"
    assert policy.decide(1.05, plan) == "balanced"
    assert policy.decide(1.3, plan) == "apply"
    assert policy.decide(1.3, None) == "no-gain"
    with pytest.raises(ConfigError, match="threshold"):
        AutoPolicy(threshold=0.9)


def _park(snap: Snapshot, *instance_ids: str) -> Snapshot:
    """The same snapshot with ``instance_ids`` parked (their records keep their keys)."""
    items = []
    for m in snap:
        rec = m.record.evolve(state=State.PARKED) if m.instance_id in instance_ids else m.record
        items.append((rec, m.key, m.mod_revision, m.create_revision, m.lease_id))
    return Snapshot.build(snap.controller_type, snap.revision, items)


@pytest.mark.parametrize("by", ["workload", "range"])
@pytest.mark.parametrize("parked", [("i0",), ("i2",), ("i5",), ("i1", "i4"), ("i0", "i1", "i2", "i3", "i4", "i5")])
def test_parked_records_are_planned_around(by: str, parked: tuple[str, ...]) -> None:
    """A parked range waits for its own instance: its key and its predecessor's never move."""
    rnd = random.Random(7)
    objects = [rnd.randrange(MAX_HASH // 3) for _ in range(600)] + [rnd.randrange(MAX_HASH) for _ in range(60)]
    base = snapshot(halving_keys(6), objects)
    snap = _park(base, *parked)
    plan = make_plan(snap, by)
    members = list(snap)
    keys = [m.record.hash_key for m in members[:-1]] + [MAX_HASH]
    fixed = set()
    for i, m in enumerate(members):
        if m.record.is_parked:
            fixed.add(i)
            if i > 0:
                fixed.add(i - 1)
    for i in fixed:
        assert plan.targets[i] == keys[i], (i, plan.targets, keys)
    assert not any(mv.instance_id in parked for mv in plan.moves)
    assert list(plan.targets) == sorted(plan.targets) and len(set(plan.targets)) == len(plan.targets)
    assert plan.targets[-1] == MAX_HASH
    # Every planned move is valid in some order (the apply loop can carry it out).
    moved = snap
    for _ in range(len(plan.moves) + 1):
        mv = next_move(moved, plan.targets)
        if mv is None:
            break
        items = [
            (m.record.evolve(hash_key=mv.new_key) if m.instance_id == mv.instance_id else m.record, m.key, 1, 1, 0)
            for m in moved
        ]
        moved = Snapshot.build(CT, 1, items)
    assert [m.record.hash_key for m in moved][:-1] == list(plan.targets[:-1])


def test_parked_records_leave_the_rest_balanced() -> None:
    """With the middle instance parked, each side is balanced within its own space."""
    rnd = random.Random(3)
    objects = [rnd.randrange(MAX_HASH) for _ in range(2000)]
    snap = _park(snapshot(halving_keys(5), objects), "i2")
    plan = plan_by_workload(snap)
    members = list(snap)
    loads = plan.predicted_loads
    left, right = loads[:2], loads[3:]
    assert max(left) - min(left) <= max(3, sum(left) // 20)
    assert max(right) - min(right) <= max(3, sum(right) // 20)
    assert plan.targets[1] == members[1].record.hash_key and plan.targets[2] == members[2].record.hash_key
