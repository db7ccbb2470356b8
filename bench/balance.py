"""Balance: owned objects per instance after N joins (halving) and after an offline greedy rebalance plan.

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
    :func:`plan_rebalance` is the planner the rebalance CLI can use: given
    the current boundaries (``hashKey`` of each instance, ascending) and the
    object keys, it moves boundaries (never reorders instances) so each
    instance owns as close to ``total / N`` objects as the lumps allow,
    greedily from the lowest boundary up, and returns the moves.

Invariants
    * Ranges stay contiguous, ordered and cover ``[0, MAX_HASH]``; the last
      boundary is always ``MAX_HASH``.
    * A boundary only ever falls between two distinct keys, so no object's
      owner is ambiguous; the plan is deterministic for a given input.
    * Workload generation is seeded (reproducible).

Concurrency model
    Pure functions; no shared state.
"""

from __future__ import annotations

import bisect
import random
import statistics
import uuid
from dataclasses import dataclass
from typing import Any

from hashing import MAX_HASH, HashRange, hash_key, split_largest


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


@dataclass(frozen=True)
class Move:
    """Set instance ``index``'s upper bound (``hashKey``) from ``old`` to ``new``."""

    index: int
    old: int
    new: int


def plan_rebalance(keys: list[int], uppers: list[int]) -> tuple[list[int], list[Move]]:
    """Boundaries that equalise owned objects, and the moves from ``uppers`` to them.

    ``keys`` sorted ascending; ``uppers`` ascending with ``uppers[-1] == MAX_HASH``.
    Greedy: boundary *i* goes to the gap between distinct keys whose cumulative
    count is nearest ``placed + remaining / instances_left``; ties keep the
    lower count. Every instance keeps at least one key of space. A plan whose
    largest owned count is not below the current one is dropped (no moves).
    """
    n = len(uppers)
    total = len(keys)
    new = list(uppers)
    if n < 2 or total == 0:
        return new, []
    # Candidate cut positions: indices p where keys[p-1] != keys[p] (cut after p objects).
    cuts = [p for p in range(1, total) if keys[p - 1] != keys[p]]
    placed = 0
    lo_key = -1
    for i in range(n - 1):
        remaining_instances = n - i
        target = placed + (total - placed) / remaining_instances
        j = bisect.bisect_left(cuts, target)
        best: int | None = None
        for c in (cuts[j - 1] if j > 0 else None, cuts[j] if j < len(cuts) else None):
            if c is None or c <= placed:
                continue
            if best is None or abs(c - target) < abs(best - target):
                best = c
        if best is None:
            # No distinct key left: keep the boundary just above the previous one.
            hi = min(max(lo_key + 1, new[i]), MAX_HASH - (n - 1 - i))
        else:
            hi = keys[best - 1]
            placed = best
        hi = max(hi, lo_key + 1)
        new[i] = hi
        lo_key = hi
    new[-1] = MAX_HASH
    if max(owned_counts(keys, new)) >= max(owned_counts(keys, uppers)):
        return list(uppers), []  # never propose moves that do not lower the maximum
    moves = [Move(i, old, nw) for i, (old, nw) in enumerate(zip(uppers, new, strict=True)) if old != nw]
    return new, moves


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
    """max/mean owned objects after joins and after the greedy plan, for N = 3, 5, 7 and both workloads."""
    objects = 20_000 if quick else 100_000
    workloads = {"uniform": uniform_keys(objects), "skewed": skewed_keys(objects)}
    rows = []
    for name, keys in workloads.items():
        for n in (3, 5, 7):
            after_joins = joins(keys, n)
            counts_joins = owned_counts(keys, after_joins)
            planned, moves = plan_rebalance(keys, after_joins)
            counts_plan = owned_counts(keys, planned)
            rows.append(
                {
                    "workload": name,
                    "instances": n,
                    "objects": len(keys),
                    "distinctKeys": len(set(keys)),
                    "largestLump": _largest_lump(keys),
                    "maxOverMeanAfterJoins": _imbalance(counts_joins),
                    "maxOverMeanAfterRebalance": _imbalance(counts_plan),
                    "countsAfterJoins": counts_joins,
                    "countsAfterRebalance": counts_plan,
                    "boundaryMoves": len(moves),
                    "objectsMoved": moved_objects(keys, after_joins, planned),
                }
            )
    return rows


def _largest_lump(keys: list[int]) -> int:
    best = run_len = 0
    prev: int | None = None
    for k in keys:
        run_len = run_len + 1 if k == prev else 1
        prev = k
        best = max(best, run_len)
    return best
