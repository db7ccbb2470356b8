"""Rebalancing: imbalance reports, load-aware plans, and applying them through the handover protocol.

Purpose
    Halving the largest range is only semi-balanced (three instances: one owns
    half the space). This module computes where the boundaries (``hashKey``
    of every instance but the last) should be so owned objects
    (``--by workload``, from the hash histograms instances publish) or key
    ranges (``--by range``) are equal, and applies such a plan one boundary at
    a time with :meth:`Registry.set_key`, which locks the receiving instance
    in the same transaction; each move waits until the handover finished
    (receiver unlocked, both sides active) before the next.

Invariants
    * Plans keep the instance order and give every instance a non-empty range;
      the last key stays ``MAX_HASH``.
    * Histogram arithmetic is integer-exact: bucket ``j`` of ``[lo, hi]`` with
      ``B`` buckets holds keys ``k`` with ``(k - lo) * B // size == j``, so a
      boundary placed on a bucket edge splits counts exactly.
    * Managers publish histograms cut at gaps (:func:`gap_histogram`): up to
      :data:`HISTOGRAM_BUCKETS` buckets over a fine grid of
      :data:`HISTOGRAM_CELLS` cells, each edge in the middle of a gap between
      owned objects. With at most that many distinct hashes per instance every
      gap has an edge, so the planner reaches the exact optimum; with more,
      buckets hold about equal numbers of objects (error per boundary at most
      one bucket, ~1/256 of the instance's objects). Equal-width histograms of
      earlier versions are still read.
    * Every move is validated against the current keys before it is written;
      a failed or timed-out move leaves the registry consistent (the protocol
      finishes the handover by itself; nothing is half-written).

Concurrency model
    Pure functions plus a synchronous :func:`apply_plan` loop with a deadline
    per move; called from the CLI thread.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from hashing import MAX_HASH, HashRange
from rangeshard.core.errors import CompareFailed, ConfigError, PlanError, RegistryError
from registry.models import HashHistogram, Member, Snapshot, State
from registry.registry import Registry

log = logging.getLogger(__name__)

_MAX_MOVE_RACES = 10
"""How many lost races (concurrent registry writes) one :func:`apply_plan` run retries before giving up."""

HISTOGRAM_BUCKETS = 256
"""Most buckets one published histogram has (bounds a record at ~4 KB; see docs/rebalance.md)."""

HISTOGRAM_CELLS = 2**32
"""Equal-width cells of a range that the edges of a published histogram are placed on.

Two distinct objects share a cell only if their hashes are within ``size / 2**32``
of each other (for 256 uniform hashes in a range: probability ~1e-5); the
indices stay 10 digits in the record, where raw keys would take 19.
"""


def bucket_of(key: int, rng: HashRange, buckets: int) -> int:
    """Index of the equal-width bucket of ``rng`` holding ``key`` (integer-exact)."""
    return (key - rng.lo) * buckets // rng.size


def bucket_start(j: int, rng: HashRange, buckets: int) -> int:
    """Smallest key of bucket ``j`` (``j == buckets`` gives ``rng.hi + 1``)."""
    return rng.lo + -(-j * rng.size // buckets)


def histogram(keys: Sequence[int], rng: HashRange, buckets: int = HISTOGRAM_BUCKETS) -> list[int]:
    """Counts of ``keys`` inside ``rng`` per equal-width bucket (the layout earlier versions published)."""
    counts = [0] * buckets
    for k in keys:
        if rng.contains(k):
            counts[bucket_of(k, rng, buckets)] += 1
    return counts


def gap_histogram(
    keys: Iterable[int],
    rng: HashRange,
    max_buckets: int = HISTOGRAM_BUCKETS,
    cells: int = HISTOGRAM_CELLS,
) -> dict[str, Any]:
    """The histogram a manager publishes for the ``keys`` it owns in ``rng`` (record field ``histogram``).

    Keys are placed on ``cells`` equal-width cells; runs of objects in one
    cell stay together (owner-hashed dependents share their owner's hash).
    With at most ``max_buckets`` occupied cells each is its own bucket;
    otherwise consecutive cells are grouped into at most ``max_buckets``
    buckets of about equal counts. Each bucket edge goes to the middle of the
    gap between the last occupied cell before it and the first after it, so
    a boundary the planner places there leaves room for new objects on both
    sides. No keys in ``rng``: one empty bucket.
    """
    if max_buckets < 1 or cells < 1:
        raise ValueError("gap_histogram: need max_buckets >= 1 and cells >= 1")
    ks = sorted(k for k in keys if rng.contains(k))
    total = len(ks)
    if not ks:
        return {"lo": rng.lo, "hi": rng.hi, "cells": cells, "ends": [cells], "objects": [0]}

    def run_end(i: int) -> int:
        """Index of the last key in the same cell as ``ks[i]`` (keys are sorted, cells ascend with keys)."""
        last_key = bucket_start(bucket_of(ks[i], rng, cells) + 1, rng, cells) - 1
        return bisect.bisect_right(ks, last_key, i) - 1

    # Index of the last key of each bucket. First one bucket per occupied cell...
    lasts: list[int] = []
    i = 0
    while i < total and len(lasts) <= max_buckets:
        lasts.append(run_end(i))
        i = lasts[-1] + 1
    if len(lasts) > max_buckets:
        # ... too many: bucket j ends with the cell holding the (j * total / max_buckets)-th key
        # (cells are never split, so a lump of one hash may cover several shares).
        lasts = []
        for j in range(1, max_buckets + 1):
            share_end = -(-j * total // max_buckets) - 1
            if not lasts or share_end > lasts[-1]:
                lasts.append(run_end(share_end))
    ends: list[int] = []
    objects: list[int] = []
    first = 0
    for last in lasts:
        if last + 1 < total:
            gap_lo = bucket_of(ks[last], rng, cells) + 1
            gap_hi = bucket_of(ks[last + 1], rng, cells)
            ends.append((gap_lo + gap_hi) // 2)
        else:
            ends.append(cells)
        objects.append(last + 1 - first)
        first = last + 1
    return {"lo": rng.lo, "hi": rng.hi, "cells": cells, "ends": ends, "objects": objects}


#: Cost units per second: the planner balances integers (microseconds of measured reconcile time).
COST_UNITS_PER_SECOND = 1_000_000


def add_cost(hist: dict[str, Any], costs: Mapping[int, float]) -> dict[str, Any]:
    """Add ``cost`` (seconds per gap bucket, aligned with ``objects``) to a :func:`gap_histogram` result.

    ``costs`` maps key hashes to measured reconcile seconds; keys outside the
    histogram's range are left out. Returns ``hist`` (changed in place).
    """
    rng = HashRange(hist["lo"], hist["hi"])
    cells, ends = hist["cells"], hist["ends"]
    out = [0.0] * len(ends)
    for key, seconds in costs.items():
        if rng.contains(key) and seconds > 0:
            out[bisect.bisect_right(ends, bucket_of(key, rng, cells))] += seconds
    hist["cost"] = [round(c, 6) for c in out]
    return hist


class Strategy(StrEnum):
    """What a plan equalises (``--by``): owned objects, measured reconcile time, or key ranges."""

    WORKLOAD = "workload"
    COST = "cost"
    RANGE = "range"

    @classmethod
    def parse(cls, value: str) -> Strategy:
        """``--by``'s value; :class:`ConfigError` (bad input, exit 2) for anything else."""
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"--by: {value!r} is not one of workload, range, cost") from None


@dataclass(frozen=True)
class Segment:
    """A slice ``[lo, hi]`` of the space holding ``count`` objects (from a histogram bucket)."""

    lo: int
    hi: int
    count: int


@dataclass(frozen=True)
class Move:
    """Set ``instance``'s key from ``old_key`` to ``new_key``."""

    instance_id: str
    old_key: int
    new_key: int


@dataclass(frozen=True)
class Plan:
    """Target keys (instance order), the moves, and predicted loads."""

    controller_type: str
    by: Strategy
    targets: tuple[int, ...]
    moves: tuple[Move, ...]
    current_loads: tuple[int, ...]
    predicted_loads: tuple[int, ...]

    @property
    def current_ratio(self) -> float:
        return max_over_mean(self.current_loads)

    @property
    def predicted_ratio(self) -> float:
        return max_over_mean(self.predicted_loads)


def max_over_mean(loads: Sequence[float]) -> float:
    """max/mean of the loads (1.0 when there is nothing to balance)."""
    if not loads:
        return 1.0
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean > 0 else 1.0


def owned(snap: Snapshot) -> list[Member]:
    """Members that own a range, in key order."""
    return [m for m in snap.members if m.range is not None]


def segments(snap: Snapshot) -> list[Segment]:
    """The space cut into histogram buckets with counts, in key order.

    Both published layouts are read (see :class:`registry.models.HashHistogram`).
    An instance without a usable histogram (none, published for an earlier
    range, or inconsistent) contributes one segment (its whole range) with its
    ``workloadNum``.
    """
    return [s for m in owned(snap) for s in _member_segments(m)]


def _histogram_segments(hist: HashHistogram, rng: HashRange) -> list[Segment] | None:
    """The buckets of one published histogram as segments, or ``None`` when it does not describe ``rng``."""
    if hist.lo != rng.lo or hist.hi != rng.hi:
        return None  # published for an earlier range
    if hist.ends is not None or hist.objects is not None or hist.cells is not None:
        return _gap_segments(hist, rng)
    if not hist.counts or any(c < 0 for c in hist.counts):
        return None
    n = len(hist.counts)
    out: list[Segment] = []
    for j, count in enumerate(hist.counts):
        lo = bucket_start(j, rng, n)
        hi = bucket_start(j + 1, rng, n) - 1
        if lo <= hi:
            out.append(Segment(lo, hi, count))
    return out


def _gap_segments(hist: HashHistogram, rng: HashRange, weights: list[int] | None = None) -> list[Segment] | None:
    """The gap buckets as segments holding their ``objects`` (or ``weights`` of the same length instead)."""
    cells, ends, objects = hist.cells, hist.ends, hist.objects
    if cells is None or cells < 1 or not ends or objects is None or len(ends) != len(objects):
        return None
    if ends[-1] != cells or any(c < 0 for c in objects):
        return None
    loads = objects if weights is None else weights
    if len(loads) != len(ends):
        return None
    out: list[Segment] = []
    start = 0
    for end, count in zip(ends, loads, strict=True):
        if end <= start:
            return None  # edges must increase
        lo = bucket_start(start, rng, cells)
        hi = bucket_start(end, rng, cells) - 1
        if lo <= hi:
            out.append(Segment(lo, hi, count))
        elif count:
            return None  # objects in a bucket that holds no key
        start = end
    return out


def loads_for(keys: Sequence[int], segs: Sequence[Segment]) -> list[int]:
    """Objects per instance if the instances had ``keys`` (segments never straddle a boundary)."""
    loads = [0] * len(keys)
    i = 0
    for seg in segs:
        while i < len(keys) - 1 and seg.hi > keys[i]:
            i += 1
        loads[i] += seg.count
    return loads


def _parts_needed(counts: Sequence[int], cap: int) -> int:
    """Fewest contiguous parts with at most ``cap`` objects each (greedy is optimal)."""
    parts, acc = 1, 0
    for c in counts:
        if acc + c > cap:
            parts, acc = parts + 1, c
        else:
            acc += c
    return parts


def min_max_load(counts: Sequence[int], parts: int) -> int:
    """The smallest achievable maximum load when cutting ``counts`` into ``parts`` contiguous parts."""
    lo, hi = max(counts, default=0), sum(counts)
    while lo < hi:
        mid = (lo + hi) // 2
        if _parts_needed(counts, mid) <= parts:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _member_segments(m: Member, by: Strategy = Strategy.WORKLOAD) -> list[Segment]:
    """One member's buckets as segments, weighed by object count or (``Strategy.COST``) by measured cost units.

    Without a usable histogram: its whole range with ``workloadNum`` (by
    count) or with its total cost (by cost; 0 when it publishes none).
    """
    rng = m.range
    if rng is None:
        return []
    hist = m.record.histogram
    mine = _histogram_segments(hist, rng) if hist is not None else None
    if by is Strategy.COST:
        units = _cost_units(hist) if hist is not None and mine is not None else None
        weighted = _gap_segments(hist, rng, units) if hist is not None and units is not None else None
        return weighted if weighted is not None else [Segment(rng.lo, rng.hi, member_cost_units(m))]
    return mine if mine is not None else [Segment(rng.lo, rng.hi, m.record.workload_num)]


def _cost_units(hist: HashHistogram) -> list[int] | None:
    """``cost`` as integer units, or ``None`` when it is missing or malformed (then it is ignored)."""
    raw = hist.cost
    if not isinstance(raw, list) or not raw:
        return None
    out: list[int] = []
    for c in raw:
        if isinstance(c, bool) or not isinstance(c, int | float) or not math.isfinite(c) or c < 0:
            return None
        out.append(round(c * COST_UNITS_PER_SECOND))
    return out


def member_cost_units(m: Member) -> int:
    """The measured cost an instance publishes for its current range (0 when none or malformed)."""
    hist = m.record.histogram
    if hist is None or m.range is None or hist.lo != m.range.lo or hist.hi != m.range.hi:
        return 0
    units = _cost_units(hist)
    return sum(units) if units is not None else 0


def loads_of(snap: Snapshot, by: Strategy | str) -> list[int]:
    """Per owning instance: objects (``workloadNum``; also for ``range``) or measured cost units."""
    if Strategy.parse(by) is Strategy.COST:
        return [member_cost_units(m) for m in owned(snap)]
    return [m.record.workload_num for m in owned(snap)]


def movable_runs(members: Sequence[Member]) -> list[tuple[int, int]]:
    """``[i, j)`` index runs of consecutive members that are not parked.

    A parked record's range waits for its own instance: neither its key nor
    its predecessor's may move, so each run is balanced on its own, within
    the space its members own now (its last member's key stays).
    """
    runs: list[tuple[int, int]] = []
    start = 0
    for i, m in enumerate(members):
        if m.record.is_parked:
            if start < i:
                runs.append((start, i))
            start = i + 1
    if start < len(members):
        runs.append((start, len(members)))
    return runs


def _run_targets(members: Sequence[Member], fn: Callable[[list[Member], int, int], list[int]]) -> list[int]:
    """Target keys of every member: parked ones keep theirs, each movable run is planned by ``fn``."""
    targets = [m.record.hash_key if m.range is None else m.range.hi for m in members]
    for i, j in movable_runs(members):
        run = list(members[i:j])
        lo = run[0].range.lo if run[0].range is not None else 0
        hi = run[-1].range.hi if run[-1].range is not None else MAX_HASH
        targets[i:j] = fn(run, lo, hi)
    return targets


def plan_by_workload(snap: Snapshot) -> Plan:
    """Boundaries on bucket edges: the smallest possible maximum load, then as even as possible.

    First the optimal cap (the least maximum any cut can reach) is found by a
    binary search; then each boundary goes to the bucket edge nearest its
    even share (``total * i / n`` objects before it) among the edges that
    keep every part within the cap and leave enough room for the remaining
    instances; among equally near edges, one that leaves no instance idle.
    Equally good edges lie in one gap between objects: the middle one is
    taken, so new objects land evenly. Parked records are planned around
    (:func:`movable_runs`).
    """
    return _plan_by_weight(snap, Strategy.WORKLOAD)


def plan_by_cost(snap: Snapshot) -> Plan:
    """:func:`plan_by_workload` on measured reconcile cost instead of object counts (loads in microseconds).

    Each instance publishes the decayed reconcile seconds per gap bucket of
    its histogram; an instance without a usable cost histogram counts as one
    segment with its total cost. A type none of whose instances publishes cost
    (external controllers) or nothing measured yet is a :class:`PlanError`.
    """
    members = owned(snap)
    if not any(member_cost_units(m) for m in members):
        if all(m.record.histogram is None or m.record.histogram.cost is None for m in members):
            raise PlanError(
                f"{snap.controller_type}: this controller type has no reconcile times (its instances publish "
                "no cost histogram, as external controllers do): use --by workload"
            )
        raise PlanError(f"{snap.controller_type}: no reconcile cost has been measured yet: use --by workload")
    return _plan_by_weight(snap, Strategy.COST)


def _plan_by_weight(snap: Snapshot, by: Strategy) -> Plan:
    members = owned(snap)
    segs = [s for m in members for s in _member_segments(m, by)]

    def run_targets(run: list[Member], _lo: int, hi: int) -> list[int]:
        return _workload_targets(snap.controller_type, [s for m in run for s in _member_segments(m, by)], len(run), hi)

    return _plan(snap, by, members, _run_targets(members, run_targets), segs)


def _workload_targets(controller_type: str, segs: Sequence[Segment], n: int, end_key: int) -> list[int]:
    """Keys of ``n`` instances sharing ``segs`` (see :func:`plan_by_workload`); the last is ``end_key``."""
    counts = [s.count for s in segs]
    total = sum(counts)
    size = len(segs)
    targets: list[int] = []
    if n > 1:
        if size < n:
            raise PlanError(f"{controller_type}: not enough histogram resolution to place {n - 1} boundaries")
        cap = min_max_load(counts, n)
        # suffix_parts[j]: fewest parts covering segments j.. within the cap (greedy from the right).
        suffix_parts = [0] * (size + 1)
        parts, acc = 0, 0
        for j in range(size - 1, -1, -1):
            if parts == 0 or acc + counts[j] > cap:
                parts, acc = parts + 1, counts[j]
            else:
                acc += counts[j]
            suffix_parts[j] = parts
        cumulative = list(itertools.accumulate(counts))
        start = 0
        for i in range(1, n):
            goal = total * i / n
            left = n - i  # instances after this boundary
            before_start = cumulative[start - 1] if start else 0
            best_rank: tuple[float, bool] | None = None
            best_idx: list[int] = []
            for idx in range(start, size - left):
                part = cumulative[idx] - before_start
                if part > cap:
                    break
                if suffix_parts[idx + 1] > left:
                    continue
                # Nearest to the even share; among equals, one that leaves nobody idle.
                rank = (abs(cumulative[idx] - goal), part == 0)
                if best_rank is None or rank < best_rank:
                    best_rank, best_idx = rank, [idx]
                elif rank == best_rank:
                    best_idx.append(idx)
            if not best_idx:
                raise PlanError(f"{controller_type}: cannot place boundary {i} of {n - 1}")
            chosen = best_idx[len(best_idx) // 2]
            targets.append(segs[chosen].hi)
            start = chosen + 1
    targets.append(end_key)
    return targets


def plan_by_range(snap: Snapshot) -> Plan:
    """Equal key ranges (each run between parked records shares its own space equally)."""
    members = owned(snap)

    def run_targets(run: list[Member], lo: int, hi: int) -> list[int]:
        n, size = len(run), hi - lo + 1
        return [lo + size * i // n - 1 for i in range(1, n)] + [hi]

    targets = _run_targets(members, run_targets)
    segs = segments(snap)
    # Predicted loads assume objects spread evenly inside each bucket.
    return _plan(snap, Strategy.RANGE, members, targets, _split_segments(segs, targets))


def _split_segments(segs: Sequence[Segment], keys: Sequence[int]) -> list[Segment]:
    out: list[Segment] = []
    for s in segs:
        lo = s.lo
        remaining = s.count
        size = s.hi - s.lo + 1
        for k in keys:
            if lo <= k < s.hi:
                part = round(s.count * (k - lo + 1) / size) if size else 0
                part = min(part, remaining)
                out.append(Segment(lo, k, part))
                remaining -= part
                lo = k + 1
        out.append(Segment(lo, s.hi, remaining))
    return out


def _plan(snap: Snapshot, by: Strategy, members: list[Member], targets: list[int], segs: Sequence[Segment]) -> Plan:
    moves = tuple(
        Move(m.instance_id, m.record.hash_key, tgt)
        for m, tgt in zip(members[:-1], targets[:-1], strict=True)
        if m.record.hash_key != tgt
    )
    return Plan(
        controller_type=snap.controller_type,
        by=by,
        targets=tuple(targets),
        moves=moves,
        current_loads=tuple(loads_of(snap, by)),
        predicted_loads=tuple(loads_for(targets, segs)),
    )


_PLANNERS: dict[Strategy, Callable[[Snapshot], Plan]] = {
    Strategy.WORKLOAD: plan_by_workload,
    Strategy.RANGE: plan_by_range,
    Strategy.COST: plan_by_cost,
}


def make_plan(snap: Snapshot, by: Strategy | str) -> Plan:
    """The plan of ``by`` (a :class:`Strategy` or ``--by``'s text: :class:`ConfigError` if it names none)."""
    return _PLANNERS[Strategy.parse(by)](snap)


def handover_done(snap: Snapshot) -> bool:
    """No instance locked and every owner active (or parked: it waits for its own instance, not a handover)."""
    return all(not m.record.is_locked and m.record.state in (State.ACTIVE, State.PARKED) for m in owned(snap))


def wait_settled(registry: Registry, controller_type: str, timeout: float, poll: float = 0.2) -> Snapshot:
    """Wait until every instance of the type is unlocked and active; :class:`RegistryError` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        snap = registry.snapshot(controller_type)
        if handover_done(snap):
            return snap
        if time.monotonic() > deadline:
            busy = [
                f"{m.instance_id} ({m.record.state.value}{', locked' if m.record.is_locked else ''})"
                for m in owned(snap)
                if m.record.is_locked or m.record.state not in (State.ACTIVE, State.PARKED)
            ]
            raise RegistryError(f"{controller_type}: handover not finished after {timeout:.0f}s: {', '.join(busy)}")
        time.sleep(poll)


def next_move(snap: Snapshot, targets: Sequence[int]) -> Move | None:
    """A move that is valid now (keeps order and non-empty ranges), or ``None`` when all are done."""
    members = owned(snap)
    keys = [m.record.hash_key for m in members]
    if len(targets) != len(members):
        raise CompareFailed(
            f"{snap.controller_type}: membership changed while rebalancing ({len(members)} instances now)"
        )
    pending = [i for i in range(len(members) - 1) if keys[i] != targets[i]]
    for i in pending:
        lo = keys[i - 1] + 1 if i > 0 else 0
        if lo <= targets[i] < keys[i + 1]:
            return Move(members[i].instance_id, keys[i], targets[i])
    if pending:
        raise CompareFailed(f"{snap.controller_type}: no valid order for the remaining moves")
    return None


def apply_plan(
    registry: Registry,
    plan: Plan,
    *,
    timeout: float = 60.0,
    progress: Callable[[int, int, Move], None] | None = None,
) -> int:
    """Apply ``plan`` one boundary at a time, waiting for each handover; return the moves made.

    A move whose guarded transaction lost a race (a heartbeat or state change
    of the same type landed between its read and its write) is re-planned from
    a fresh settled snapshot, a bounded number of times.
    """
    snap = wait_settled(registry, plan.controller_type, timeout)
    total = len(plan.moves)
    done = 0
    races = 0
    for _ in range(4 * len(plan.targets) + 4 + _MAX_MOVE_RACES):
        move = next_move(snap, plan.targets)
        if move is None:
            return done
        if progress is not None:
            progress(done, total, move)
        try:
            registry.set_key(plan.controller_type, move.instance_id, move.new_key)
        except CompareFailed as e:
            races += 1
            if races > _MAX_MOVE_RACES:
                raise
            log.info("%s: move of %s lost a race (%s); re-reading the registry", plan.controller_type, move, e)
        else:
            done += 1
        snap = wait_settled(registry, plan.controller_type, timeout)
    raise CompareFailed(f"{plan.controller_type}: the plan did not converge")


@dataclass
class AutoPolicy:
    """When automatic rebalancing acts (threshold with hysteresis, minimum gain).

    It acts when max/mean exceeds ``threshold`` and the plan predicts at least
    ``min_gain`` improvement. After acting it disarms and re-arms only once
    max/mean fell below ``threshold - hysteresis``, so a plan that cannot get
    below the threshold is not retried over and over (no flapping).
    """

    threshold: float = 1.2
    hysteresis: float = 0.05
    min_gain: float = 0.05
    armed: bool = True

    def __post_init__(self) -> None:
        if self.threshold < 1.0 or self.hysteresis < 0 or self.min_gain < 0:
            raise ConfigError("auto: need --threshold >= 1 and --hysteresis, --min-gain >= 0")

    def decide(self, ratio: float, plan: Plan | None) -> str:
        """``"apply"``, or why not: ``"balanced"``, ``"disarmed"``, ``"no-gain"``."""
        if ratio < self.threshold - self.hysteresis:
            self.armed = True
        if ratio <= self.threshold:
            return "balanced"
        if not self.armed:
            return "disarmed"
        if plan is None or not plan.moves or plan.predicted_ratio > ratio - self.min_gain:
            return "no-gain"
        return "apply"

    def applied(self) -> None:
        self.armed = False
