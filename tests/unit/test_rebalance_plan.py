"""The rebalance planner on synthetic snapshots (pure: no etcd)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hashing import MAX_HASH, HashRange, hash_key
from rangeshard.core.errors import ConfigError
from registry.models import InstanceRecord, Snapshot, State
from registry.rebalance import (
    AutoPolicy,
    bucket_of,
    bucket_start,
    histogram,
    loads_for,
    make_plan,
    max_over_mean,
    next_move,
    plan_by_range,
    plan_by_workload,
    segments,
)

CT = "replicaset"


def snapshot(keys: list[int], objects: list[int]) -> Snapshot:
    """Instances with ``keys`` publishing exact histograms of ``objects``."""
    items = []
    prev = -1
    for i, k in enumerate(sorted(keys)):
        hi = MAX_HASH if i == len(keys) - 1 else k
        rng = HashRange(prev + 1, hi)
        counts = histogram(objects, rng)
        rec = InstanceRecord.model_validate(
            {
                "instanceId": f"i{i}",
                "controllerType": CT,
                "hashKey": k,
                "workloadNum": sum(counts),
                "state": State.ACTIVE,
                "histogram": {"lo": rng.lo, "hi": rng.hi, "counts": counts},
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
def test_plan_by_workload_balances(n: int, skewed: bool) -> None:
    rnd = random.Random(n * 10 + skewed)
    uids = [f"uid-{rnd.random()}" for _ in range(20 * n)]
    objects = [hash_key(u) for u in uids]
    if skewed:
        # Owner-hashed dependents: lumpy counts per owner key.
        objects = [o for o in objects for _ in range(1 + (o % 5 == 0) * 6)]
    keys = halving_keys(n)
    snap = snapshot(keys, objects)
    plan = plan_by_workload(snap)
    actual = owned_counts(list(plan.targets), objects)
    assert list(plan.predicted_loads) == actual
    assert plan.predicted_ratio == pytest.approx(max_over_mean(actual), abs=1e-3)
    assert plan.predicted_ratio <= (1.10 if not skewed else 1.35)
    assert max_over_mean(actual) <= (1.10 if not skewed else 1.35)
    assert max_over_mean(actual) < max_over_mean(owned_counts(keys, objects))
    assert plan.targets[-1] == MAX_HASH and list(plan.targets) == sorted(set(plan.targets))


def test_clustered_objects_get_the_optimal_maximum() -> None:
    # Short strings hash into a few buckets: 60 | 20 | 10 objects in three clusters.
    objects = [hash_key(str(i)) for i in range(90)]
    plan = plan_by_workload(snapshot(halving_keys(3), objects))
    assert max(plan.predicted_loads) == 60
    assert sorted(plan.predicted_loads) == [10, 20, 60]
    assert owned_counts(list(plan.targets), objects) == list(plan.predicted_loads)


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
