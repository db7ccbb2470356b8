"""Which downstream watchers an event can concern, without asking every one of them.

Purpose
    The cache used to ask every watcher's filter about every event: with 16
    range watchers that was ~half of the in-process cost per event (16
    predicate calls to find the one watcher that wants it). A
    :class:`DispatchIndex` sorts the watchers whose filter has a
    ``shardSelector`` over one path (what controller instances send) into
    the elementary intervals of their ranges, so the candidates of an event
    are found with one binary search per hashed path. Watchers without such
    a filter are candidates for every event.

Invariants
    * A watcher that is not among :meth:`DispatchIndex.candidates` of an
      event would have been told nothing about it: its shard selector
      matches neither the event's current nor its previous object (both are
      looked up), and every filter requires its shard selector to match.
      Candidates still go through :meth:`WatchFilter.variant`, so what a
      watcher receives is exactly what the plain loop gave it.
    * Each candidate comes once. Their order is not significant: every
      watcher has its own queue, and each queue gets its events in order.

    * Building the index costs O(W log W) for W watchers with disjoint ranges
      (one sweep, not a scan of every watcher per interval); the cache builds
      it lazily, at the first event after watchers were added or removed, so
      a thousand watch requests in a row cost one build, not a thousand.

Concurrency model
    An immutable value, rebuilt by the cache (on its event loop) at the first
    dispatch after a watcher was added or removed; a dispatch in progress
    keeps iterating the tuple it was given.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hashing import ObjectHashes, ShardBy, path_hash
from range_filter_proxy.cached import CachedEvent
from range_filter_proxy.watcher import Watcher


@dataclass(frozen=True, slots=True)
class _PathIndex:
    """The watchers of one shard path, by elementary interval of the 64-bit space."""

    #: The hash of this path (:func:`hashing.path_hash`: an attribute, or a label's value).
    value: Callable[[ObjectHashes], int | None]
    bounds: tuple[int, ...]
    #: ``segments[bisect_right(bounds, v)]``: the watchers whose ranges contain ``v``.
    segments: tuple[tuple[Watcher, ...], ...]
    #: The watchers an object without this hash matches (the owner path: all of them).
    when_missing: tuple[Watcher, ...]

    @classmethod
    def build(cls, path: str, entries: list[tuple[Watcher, list[tuple[int, int]]]]) -> _PathIndex:
        """One sweep over the sorted bounds: O(B log B + the sum of the segments' sizes).

        Segment ``i`` (``1 <= i < len(bounds)``) is ``[bounds[i-1], bounds[i])``;
        a range ``(s, e)`` covers the segments ``pos(s)+1 .. pos(e)``, so each
        watcher enters the active set at one position and leaves it at another
        (a counter per watcher: its terms may touch or overlap). Asking every
        watcher about every segment instead was O(watchers^2) per build, and the
        cache rebuilt on every watch request: 1,000 watchers took minutes.
        """
        bounds = sorted({b for _, ranges in entries for r in ranges for b in r})
        pos = {b: i for i, b in enumerate(bounds)}
        enter: dict[int, list[Watcher]] = {}
        leave: dict[int, list[Watcher]] = {}
        for w, ranges in entries:
            for s, e in ranges:
                lo, hi = pos[s] + 1, pos[e] + 1
                if lo < hi:
                    enter.setdefault(lo, []).append(w)
                    leave.setdefault(hi, []).append(w)
        active: dict[Watcher, int] = {}
        segments: list[tuple[Watcher, ...]] = [()]
        current: tuple[Watcher, ...] = ()
        for i in range(1, len(bounds)):
            changed = False
            for w in leave.get(i, ()):
                n = active[w] - 1
                if n:
                    active[w] = n
                else:
                    del active[w]
                    changed = True
            for w in enter.get(i, ()):
                n = active.get(w, 0)
                active[w] = n + 1
                changed = changed or n == 0
            if changed:
                current = tuple(active)
            segments.append(current)
        segments.append(())
        rule = ShardBy.of_path(path)  # the one shard rule: which hash, and whether its absence matches all
        missing = tuple(w for w, _ in entries) if rule.matches_absent else ()
        return cls(path_hash(path), tuple(bounds), tuple(segments), missing)

    def lookup(self, value: int | None) -> tuple[Watcher, ...]:
        if value is None:
            return self.when_missing
        return self.segments[bisect_right(self.bounds, value)]


class DispatchIndex:
    """The candidates of an event among a cache's watchers (see module docstring)."""

    __slots__ = ("_always", "_paths", "size")

    def __init__(self, watchers: Iterable[Watcher]) -> None:
        always: list[Watcher] = []
        by_path: dict[str, list[tuple[Watcher, list[tuple[int, int]]]]] = {}
        count = 0
        for w in watchers:
            count += 1
            shard = w.filter.shard
            paths = shard.paths if shard is not None else frozenset()
            if shard is None or len(paths) != 1:
                always.append(w)
                continue
            by_path.setdefault(next(iter(paths)), []).append((w, [(t.start, t.end) for t in shard.terms]))
        self.size = count
        self._always = tuple(always)
        self._paths = tuple(_PathIndex.build(path, entries) for path, entries in by_path.items())

    def candidates(self, ev: CachedEvent) -> tuple[Watcher, ...]:
        """The watchers that may want ``ev`` (every other one would filter it out)."""
        paths = self._paths
        if not paths:
            return self._always
        found: tuple[Watcher, ...] = self._always
        cur = ev.cur.hashes
        prev = ev.prev.hashes if ev.prev is not None else None
        for index in paths:
            of = index.value
            value = of(cur)
            hit = index.lookup(value)
            if prev is not None:
                old = of(prev)
                if old != value:
                    hit = hit + tuple(w for w in index.lookup(old) if w not in hit)
            if hit:
                found = found + hit if found else hit
        return found
