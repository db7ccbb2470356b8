"""Rebalance planning: imbalance reports and load-aware plans (``--by workload | cost | range``).

Purpose
    Halving the largest range is only semi-balanced (three instances: one owns
    half the space). This module computes where the boundaries (``hashKey``
    of every instance but the last) should be so owned objects
    (``--by workload``, from the hash histograms instances publish,
    :mod:`registry.histogram`), measured reconcile time (``--by cost``) or key
    ranges (``--by range``) are equal. :mod:`registry.apply` applies a plan.

Invariants
    * Plans keep the instance order and give every instance a non-empty range;
      the last key stays ``MAX_HASH``. A parked or pinned instance's range is
      never changed by a plan (:func:`movable_runs`).
    * Both published histogram layouts are read (gap histograms, and the
      equal-width ones of earlier versions); one that does not describe the
      instance's current range counts as one segment with its ``workloadNum``.
    * A plan that cannot be made is a :class:`PlanError`; a strategy is a
      :class:`Strategy`, parsed once from ``--by``.

Concurrency model
    Pure functions.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from hashing import MAX_HASH, HashRange
from rangeshard.core.errors import ConfigError, PlanError
from registry.histogram import COST_UNITS_PER_SECOND, bucket_start
from registry.models import HashHistogram, Member, Snapshot


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
    """``[i, j)`` index runs of consecutive members that are neither parked nor pinned.

    A parked record's range waits for its own instance, and a pinned one
    (``rangeshard rebalance pin``) stays as it is: neither its key nor its
    predecessor's may move, so each run is balanced on its own, within the
    space its members own now (its last member's key stays).
    """
    runs: list[tuple[int, int]] = []
    start = 0
    for i, m in enumerate(members):
        if m.record.is_parked or m.pinned:
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


def isolate_targets(snap: Snapshot, instance_id: str, point: int) -> list[int]:
    """Target keys (of the owning members, in order) that give ``instance_id`` exactly ``[point, point]``.

    The instance's predecessor gets key ``point - 1`` and the instance key
    ``point``; members further down whose keys are not below ``point - 1`` are
    pressed down (one key each), members further up whose keys are not above
    ``point`` pushed up, so every member keeps a non-empty range and the order.
    :class:`PlanError` (one line) when the order makes it impossible: the first
    instance always starts at 0 and the last always ends at ``MAX_HASH``, or
    when another pinned (or parked) member's range would have to change.
    """
    members = owned(snap)
    idx = next((i for i, m in enumerate(members) if m.instance_id == instance_id), None)
    if idx is None:
        known = ", ".join(m.instance_id for m in members) or "none"
        raise PlanError(f"--instance: {instance_id!r} owns no range of {snap.controller_type} (known: {known})")
    n = len(members)
    interior = [m.instance_id for m in members[1:-1]]
    hint = f"; instances that can be isolated: {', '.join(interior)}" if interior else ""
    if idx == 0 and point > 0:
        raise PlanError(
            f"{instance_id} is the first instance of {snap.controller_type}: its range always starts at 0, "
            f"so it cannot own only key {point}{hint}"
        )
    if idx == n - 1 and point < MAX_HASH:
        raise PlanError(
            f"{instance_id} is the last instance of {snap.controller_type}: its range always ends at {MAX_HASH}, "
            f"so it cannot own only key {point}{hint}"
        )
    if point < idx or MAX_HASH - point < n - 1 - idx:
        raise PlanError(f"key {point} leaves no room for the instances around {instance_id}")
    keys = [m.record.hash_key for m in members]
    keys[-1] = MAX_HASH
    targets = list(keys)
    targets[idx] = point
    for j in range(idx - 1, -1, -1):  # below: the predecessor ends at point - 1, the others below it
        targets[j] = point - 1 if j == idx - 1 else min(keys[j], targets[j + 1] - 1)
    for j in range(idx + 1, n - 1):  # above: each key above the previous one
        targets[j] = max(keys[j], targets[j - 1] + 1)
    for j, m in enumerate(members):
        if m.instance_id == instance_id:
            continue
        lower_moves = j > 0 and targets[j - 1] != keys[j - 1]
        if (m.pinned or m.record.is_parked) and (targets[j] != keys[j] or lower_moves):
            what = "pinned" if m.pinned else "parked"
            raise PlanError(
                f"{m.instance_id} is {what}: isolating key {point} on {instance_id} would change its range "
                f"[{m.range.lo if m.range else '?'}, {m.range.hi if m.range else '?'}]"
            )
    return targets


def isolate_plan(snap: Snapshot, instance_id: str, point: int) -> Plan:
    """The moves of :func:`isolate_targets` as a :class:`Plan` (loads predicted by workload)."""
    members = owned(snap)
    targets = isolate_targets(snap, instance_id, point)
    return _plan(snap, Strategy.WORKLOAD, members, targets, segments(snap))
