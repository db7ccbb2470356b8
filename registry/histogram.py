"""Workload histograms: what a manager publishes of the keys it owns, and the bucket arithmetic behind it.

Purpose
    Each manager publishes, with every heartbeat, where its objects sit in
    its range (record field ``histogram``): :func:`gap_histogram` cuts the
    range at gaps between owned objects, :func:`add_cost` adds the measured
    reconcile seconds per bucket, :func:`histogram` gives the equal-width
    counts of earlier versions; :func:`workload_histogram` builds the
    record's histogram from them (every controller kind uses it). The planner (:mod:`registry.rebalance`)
    reads them back as segments.

Invariants
    * Histogram arithmetic is integer-exact: bucket ``j`` of ``[lo, hi]`` with
      ``B`` buckets holds keys ``k`` with ``(k - lo) * B // size == j``, so a
      boundary placed on a bucket edge splits counts exactly.
    * A gap histogram has up to :data:`HISTOGRAM_BUCKETS` buckets over a fine
      grid of :data:`HISTOGRAM_CELLS` cells, each edge in the middle of a gap
      between owned objects. With at most that many distinct hashes per
      instance every gap has an edge, so the planner reaches the exact
      optimum; with more, buckets hold about equal numbers of objects (error
      per boundary at most one bucket, ~1/256 of the instance's objects).

Concurrency model
    Pure functions.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hashing import HashRange

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


def workload_histogram(
    keys: Sequence[int], rng: HashRange, costs: Mapping[int, float] | None = None, window: float | None = None
) -> dict[str, Any]:
    """The ``histogram`` of a registry record: the one builder, for in-process and external controllers alike.

    The :func:`gap_histogram` of ``keys`` in ``rng``, with the equal-width
    ``counts`` of earlier versions (their readers; the planner reads the
    gaps) and, given ``costs``, the measured reconcile seconds per gap bucket
    (:func:`add_cost`) and ``costWindowSeconds``.
    """
    hist = gap_histogram(keys, rng)
    hist["counts"] = histogram(keys, rng)
    if costs is not None:
        add_cost(hist, costs)
        hist["costWindowSeconds"] = window
    return hist
