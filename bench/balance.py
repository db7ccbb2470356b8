"""Balance: owned objects per instance after N joins (halving) and after ``rangeshard rebalance`` plans.

Purpose
    Pure computation with :mod:`hashing`, no processes. A workload is a sorted
    list of object keys (``hash_key`` of the uid an object is sharded by):

    * ``uniform``: independent objects with random uids;
    * ``skewed``: owners (hashed by their own uid) with dependents hashed by
      the owner's uid (the controller-owner path), dependent counts drawn
      from a heavy-tailed (Pareto) distribution, so a few owners bring
      hundreds of objects onto one single key ("lumps" no boundary can split).

    :func:`joins` replays the registry's join rule (split the largest range;
    ties to the higher workload, then the lower start) N-1 times.
    :func:`plan_rebalance` asks the planner of ``rangeshard rebalance
    plan/apply`` (:func:`registry.rebalance.make_plan`) for new boundaries,
    given a registry snapshot in which every instance publishes the 256-bucket
    histogram of the keys it owns, as the managers do; ``--by workload`` (the
    default) and ``--by range`` are both measured. The owned counts after a
    plan are then counted exactly from the keys (the plan itself only sees
    histograms).

Invariants
    * Ranges stay contiguous, ordered and cover ``[0, MAX_HASH]``; the last
      boundary is always ``MAX_HASH``.
    * The plans are the rebalance command's, unchanged; they are
      deterministic for a given input.
    * Workload generation is seeded (reproducible).

Concurrency model
    Pure functions; no shared state.
"""

from __future__ import annotations

import bisect
import random
import statistics
import uuid
from typing import Any

from hashing import HashRange, hash_key, split_largest
from registry.histogram import gap_histogram, histogram
from registry.models import InstanceRecord, Snapshot, State
from registry.rebalance import Plan, make_plan

#: The controller type of the synthetic registry snapshots.
CONTROLLER_TYPE = "bench"


def _uid(rnd: random.Random) -> str:
    return str(uuid.UUID(int=rnd.getrandbits(128), version=4))


def uniform_keys(objects: int, seed: int = 1) -> list[int]:
    """Sorted keys of ``objects`` independent objects."""
    rnd = random.Random(seed)
    return sorted(hash_key(_uid(rnd)) for _ in range(objects))


def skewed_keys(objects: int, seed: int = 2, alpha: float = 1.2) -> list[int]:
    """Sorted keys of owners plus owner-hashed dependents with Pareto-distributed (lumpy) counts."""
    rnd = random.Random(seed)
    keys: list[int] = []
    while len(keys) < objects:
        owner_key = hash_key(_uid(rnd))
        dependents = min(int(rnd.paretovariate(alpha)) - 1, 2_000, objects - len(keys) - 1)
        keys.extend([owner_key] * (1 + max(dependents, 0)))
    return sorted(keys)


def owned_counts(keys: list[int], uppers: list[int]) -> list[int]:
    """Objects per instance for ascending upper bounds (the last must be ``MAX_HASH``)."""
    counts = []
    prev = 0
    for hi in uppers:
        pos = bisect.bisect_right(keys, hi)
        counts.append(pos - prev)
        prev = pos
    return counts


def joins(keys: list[int], n: int) -> list[int]:
    """Upper bounds after ``n - 1`` joins under the registry's rule (split the largest range)."""
    ranges = [HashRange.full()]
    for _ in range(n - 1):
        uppers = [r.hi for r in ranges]
        work = owned_counts(keys, uppers)
        i = split_largest(list(zip(ranges, work, strict=True)))
        lower, upper = ranges[i].split()
        ranges[i : i + 1] = [lower, upper]
    return [r.hi for r in ranges]


def snapshot(keys: list[int], uppers: list[int]) -> Snapshot:
    """The registry as ``rangeshard rebalance`` reads it: instances with these upper bounds, each
    publishing the histogram of the keys it owns (what the managers write: cut at gaps, plus the equal-width counts)."""
    items = []
    lo = 0
    for i, hi in enumerate(uppers):
        rng = HashRange(lo, hi)
        mine = keys[bisect.bisect_left(keys, lo) : bisect.bisect_right(keys, hi)]
        hist = gap_histogram(mine, rng)
        hist["counts"] = histogram(mine, rng)
        record = InstanceRecord.model_validate(
            {
                "instanceId": f"bench-{i}",
                "controllerType": CONTROLLER_TYPE,
                "hashKey": hi,
                "workloadNum": len(mine),
                "state": State.ACTIVE,
                "histogram": hist,
            }
        )
        items.append((record, f"/bench/{i}", 1, 1, 0))
        lo = hi + 1
    return Snapshot.build(CONTROLLER_TYPE, 1, items)


def plan_rebalance(keys: list[int], uppers: list[int], by: str) -> Plan:
    """What ``rangeshard rebalance plan/apply --by BY`` computes for this registry state."""
    return make_plan(snapshot(keys, uppers), by)


def moved_objects(keys: list[int], before: list[int], after: list[int]) -> int:
    """Objects whose owner changes between two boundary lists."""
    moved = 0
    for k in keys:
        if bisect.bisect_left(before, k) != bisect.bisect_left(after, k):
            moved += 1
    return moved


def _imbalance(counts: list[int]) -> float:
    mean = statistics.fmean(counts)
    return round(max(counts) / mean, 3) if mean else 0.0


def run(quick: bool) -> list[dict[str, Any]]:
    """max/mean owned objects after joins and after each rebalance plan, for N = 3, 5, 7 and both workloads."""
    objects = 20_000 if quick else 100_000
    workloads = {"uniform": uniform_keys(objects), "skewed": skewed_keys(objects)}
    rows = []
    for name, keys in workloads.items():
        for n in (3, 5, 7):
            after_joins = joins(keys, n)
            counts_joins = owned_counts(keys, after_joins)
            row: dict[str, Any] = {
                "workload": name,
                "instances": n,
                "objects": len(keys),
                "distinctKeys": len(set(keys)),
                "largestLump": _largest_lump(keys),
                "maxOverMeanAfterJoins": _imbalance(counts_joins),
                "countsAfterJoins": counts_joins,
            }
            for by, suffix in (("workload", ""), ("range", "ByRange")):
                plan = plan_rebalance(keys, after_joins, by)
                targets = list(plan.targets)
                counts = owned_counts(keys, targets)
                row[f"maxOverMeanAfterRebalance{suffix}"] = _imbalance(counts)
                row[f"predictedMaxOverMean{suffix}"] = round(plan.predicted_ratio, 3)
                row[f"countsAfterRebalance{suffix}"] = counts
                row[f"boundaryMoves{suffix}"] = len(plan.moves)
                row[f"objectsMoved{suffix}"] = moved_objects(keys, after_joins, targets)
            rows.append(row)
    return rows


def _largest_lump(keys: list[int]) -> int:
    best = run_len = 0
    prev: int | None = None
    for k in keys:
        run_len = run_len + 1 if k == prev else 1
        prev = k
        best = max(best, run_len)
    return best
