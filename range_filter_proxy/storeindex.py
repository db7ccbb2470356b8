"""The watch cache's store indexed by shard hash, so a range LIST visits only its slice.

Purpose
    ``WatchCache.select`` used to ask every cached object whether it passes a
    filter: at a million pods a LIST of a 1/64 range scanned the whole store
    (~120 ms of its ~200 ms). A :class:`StoreIndex` files the store's keys
    by the top :data:`BUCKET_BITS` bits of each object's 64-bit hash, one
    set of buckets per shard path, so the candidates of a ``shardSelector``
    are the keys of the buckets its ranges overlap: O(k + buckets) instead of
    O(N). Buckets are fixed (no rebalancing) and keyed like the store, by
    ``(namespace, name)``; the key tuples are the store's own (a key whose hash
    moved gets a second tuple), and an update that keeps its hashes (nearly
    every update) touches nothing.

    Which hash a path uses is its :class:`hashing.ShardBy` rule's, as in
    :meth:`hashing.ShardSelector.matches_hashes`:
    ``uid`` and ``namespace`` file an object by ``ObjectHashes.uid`` /
    ``.namespace`` and leave out one without it (it matches no term of that
    path); ``owner`` files it by ``ObjectHashes.owner`` (its controller
    ownerReference's uid) and keeps an object without a controller owner in
    :attr:`_PathBuckets.unowned`, a candidate of every owner-path range
    (such an object matches every one); ``label`` files it by the hash of
    its label's value, else of its uid (:func:`hashing.path_hash`).

Invariants
    * For every built path and every object ``o`` of the store: ``o``'s key is
      in exactly the bucket of its hash on that path (or in ``unowned``, or
      nowhere when it has no such hash), and no other key is in any bucket.
    * :meth:`StoreIndex.candidates` returns a superset of the keys whose object
      matches the selector, each once; callers apply the full filter to every
      candidate, so a select answers exactly what the scan answered.
    * A path's buckets are built at the first select that uses the path
      (O(N) once) and kept up to date from then on (O(1) per event and path):
      a cache never pays memory for a path nobody asks about. A relist
      rebuilds the paths already built.

Concurrency model
    Plain mutable state of one :class:`~range_filter_proxy.watchcache.WatchCache`,
    changed and read on the proxy's event loop by synchronous code only (no
    ``await`` between an event's store update and its index update).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from itertools import chain

from hashing import ObjectHashes, ShardBy, ShardSelector, path_hash
from range_filter_proxy.cached import CachedObject

#: Buckets per path: 4,096, by the top 12 bits of the 64-bit hash. At a million objects a
#: bucket holds ~244 keys, so a 1/64 range (64 buckets + 1 edge) visits ~1.6 % of the store.
BUCKET_BITS = 12
_SHIFT = 64 - BUCKET_BITS
_BUCKETS = 1 << BUCKET_BITS

Key = tuple[str, str]


class _PathBuckets:
    """The store's keys by bucket of one path's hash."""

    __slots__ = ("buckets", "unowned", "value")

    def __init__(self, path: str) -> None:
        rule = ShardBy.of_path(path)  # the one shard rule: which hash, and whether its absence matches all
        #: The hash of this path (an :class:`ObjectHashes` attribute, or a label's value for ``by: label``).
        self.value: Callable[[ObjectHashes], int | None] = path_hash(path)
        #: ``buckets[h >> _SHIFT]``: the keys whose hash is ``h`` on this path (``None``: empty).
        self.buckets: list[set[Key] | None] = [None] * _BUCKETS
        #: Owner path only: the keys of objects without a controller owner (they match every range).
        self.unowned: set[Key] | None = set() if rule.matches_absent else None

    def add(self, key: Key, hashes: ObjectHashes) -> None:
        value = self.value(hashes)
        if value is None:
            if self.unowned is not None:
                self.unowned.add(key)
            return
        i = value >> _SHIFT
        bucket = self.buckets[i]
        if bucket is None:
            self.buckets[i] = {key}
        else:
            bucket.add(key)

    def discard(self, key: Key, hashes: ObjectHashes) -> None:
        value = self.value(hashes)
        if value is None:
            if self.unowned is not None:
                self.unowned.discard(key)
            return
        i = value >> _SHIFT
        bucket = self.buckets[i]
        if bucket is not None:
            bucket.discard(key)
            if not bucket:
                self.buckets[i] = None  # an emptied bucket gives its table back

    def overlapping(self, start: int, end: int) -> list[set[Key]]:
        """The non-empty sets that may hold keys with a hash in ``[start, end)`` (uint64, ``end`` exclusive)."""
        found = [b for b in self.buckets[start >> _SHIFT : ((end - 1) >> _SHIFT) + 1] if b]
        if self.unowned:
            found.append(self.unowned)
        return found


class StoreIndex:
    """The keys of one watch cache's store by shard hash (see the module docstring)."""

    __slots__ = ("_paths",)

    def __init__(self) -> None:
        self._paths: dict[str, _PathBuckets] = {}

    @property
    def paths(self) -> frozenset[str]:
        """The paths built so far."""
        return frozenset(self._paths)

    def rebuild(self, objects: Mapping[Key, CachedObject]) -> None:
        """Refile ``objects`` (a new store, after a relist) on every path built so far."""
        for path in list(self._paths):
            self._paths[path] = self._build(path, objects)

    @staticmethod
    def _build(path: str, objects: Mapping[Key, CachedObject]) -> _PathBuckets:
        index = _PathBuckets(path)
        add = index.add
        for key, o in objects.items():
            add(key, o.hashes)
        return index

    def added(self, key: Key, hashes: ObjectHashes) -> None:
        """A new key entered the store (``key``: the tuple the store keeps)."""
        for index in self._paths.values():
            index.add(key, hashes)

    def moved(self, key: Key, old: ObjectHashes, new: ObjectHashes) -> None:
        """An object of the store was replaced by one with other hashes (``old is new``: nothing to do)."""
        if old is new or old == new:
            return
        for index in self._paths.values():
            of = index.value
            if of(old) != of(new):
                index.discard(key, old)
                index.add(key, new)

    def removed(self, key: Key, hashes: ObjectHashes) -> None:
        """A key left the store (``hashes``: those of the object the store held)."""
        for index in self._paths.values():
            index.discard(key, hashes)

    def candidates(self, shard: ShardSelector, objects: Mapping[Key, CachedObject]) -> Iterable[Key]:
        """Each key once whose object may match ``shard`` (a superset: filter each one exactly).

        Builds a path's buckets from ``objects`` (the store) at its first use.
        """
        sets: list[set[Key]] = []
        for term in shard.terms:
            index = self._paths.get(term.path)
            if index is None:
                index = self._paths[term.path] = self._build(term.path, objects)
            sets.extend(index.overlapping(term.start, term.end))
        if len(shard.terms) == 1:
            return chain.from_iterable(sets)  # one term: its buckets are disjoint
        return set().union(*sets)  # overlapping terms, or several paths: each key once
