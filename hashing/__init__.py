"""Pure hashing primitives of rangeshard: keys, ranges and shard selectors.

Purpose
    Map Kubernetes objects to points of the 63-bit hash space ``[0, MAX_HASH]``
    and ranges of that space to the upstream ``shardSelector`` grammar
    (KEP-5866), which speaks of the 64-bit FNV-1a space ``[0, 2**64)``.

Invariants
    * ``hash_key(v) == fnv1a_64(v.encode()) >> 1``; the shift keeps order, so the
      int64 range ``[lo, hi]`` is exactly the uint64 range ``[2*lo, 2*hi + 2)``.
    * A :class:`HashRange` is never empty: ``0 <= lo <= hi <= MAX_HASH``.
    * This package does no I/O and imports nothing else of ours (enforced by
      import-linter), so every other package may depend on it: it is the
      lowest floor, below the foundation :mod:`rangeshard.core`.

Modules
    ``keys`` (FNV-1a, ``hash_key``), ``rules`` (``ShardBy``: the one shard
    rule, which hash places an object, for reads, the write fence and the
    audit alike -- ``uid``, ``owner``, ``namespace``, ``root`` through ``via``
    kinds, ``label`` by one label's value; ``ObjectHashes``), ``ranges`` (``HashRange`` and
    splitting), ``selector`` (the KEP-5866 ``shardSelector`` grammar: parse,
    print canonically, match), ``resources`` (the one parser of kubectl-style
    resource names, behind ``via``, ``--resources`` and the manager's shard
    entries).

Concurrency model
    Everything here is immutable or a pure function; safe from any thread or
    event loop.
"""

from hashing.keys import (
    FNV_OFFSET_BASIS,
    FNV_PRIME,
    MAX_HASH,
    UINT64_SPACE,
    controller_owner_uid,
    fnv1a_64,
    hash_key,
    object_hash_key,
)
from hashing.ranges import HashRange, derive_ranges, split_largest
from hashing.rules import (
    MAX_CHAIN,
    NAMESPACE_PATH,
    OWNER_PATH,
    PATHS,
    ROOT_PATH,
    UID_PATH,
    ObjectHashes,
    ShardBy,
    canonical_via,
    check_label_key,
    label_of_path,
    label_path,
    path_hash,
    root_path,
    root_via,
)
from hashing.selector import (
    SelectorSyntaxError,
    ShardRange,
    ShardSelector,
    parse_shard_selector,
    range_to_selector,
    ranges_to_selector,
    selector_to_ranges,
)

__all__ = [
    "FNV_OFFSET_BASIS",
    "FNV_PRIME",
    "MAX_CHAIN",
    "MAX_HASH",
    "NAMESPACE_PATH",
    "OWNER_PATH",
    "PATHS",
    "ROOT_PATH",
    "UID_PATH",
    "UINT64_SPACE",
    "HashRange",
    "ObjectHashes",
    "SelectorSyntaxError",
    "ShardBy",
    "ShardRange",
    "ShardSelector",
    "canonical_via",
    "check_label_key",
    "controller_owner_uid",
    "derive_ranges",
    "fnv1a_64",
    "hash_key",
    "label_of_path",
    "label_path",
    "object_hash_key",
    "parse_shard_selector",
    "path_hash",
    "range_to_selector",
    "ranges_to_selector",
    "root_path",
    "root_via",
    "selector_to_ranges",
    "split_largest",
]
