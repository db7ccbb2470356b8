"""Unit and property tests of the pure hashing package."""

from __future__ import annotations

import contextlib
import itertools
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hashing import (
    MAX_HASH,
    NAMESPACE_PATH,
    OWNER_PATH,
    UID_PATH,
    HashRange,
    ObjectHashes,
    SelectorSyntaxError,
    derive_ranges,
    fnv1a_64,
    hash_key,
    object_hash_key,
    parse_shard_selector,
    range_to_selector,
    ranges_to_selector,
    selector_to_ranges,
    split_largest,
)

keys_st = st.integers(min_value=0, max_value=MAX_HASH)


def test_fnv_vectors() -> None:
    assert fnv1a_64("a") == 0xAF63DC4C8601EC8C
    assert fnv1a_64("foobar") == 0x85944171F73967E8
    assert fnv1a_64("") == 0xCBF29CE484222325
    assert hash_key("a") == 0xAF63DC4C8601EC8C >> 1
    assert hash_key("foobar") == 0x85944171F73967E8 >> 1


def test_hash_key_utf8() -> None:
    assert hash_key("ü") == fnv1a_64("ü".encode()) >> 1
    assert hash_key("ü") != hash_key("u")


@given(st.text())
def test_hash_key_in_space(value: str) -> None:
    assert 0 <= hash_key(value) <= MAX_HASH


def test_object_hash_key_prefers_controller_owner() -> None:
    owned = {"metadata": {"uid": "pod-1", "ownerReferences": [{"uid": "rs-1", "controller": True}]}}
    not_controller = {"metadata": {"uid": "pod-2", "ownerReferences": [{"uid": "rs-1", "controller": False}]}}
    assert object_hash_key(owned) == hash_key("rs-1")
    assert object_hash_key(not_controller) == hash_key("pod-2")
    assert object_hash_key({"metadata": {}}) is None
    assert object_hash_key({}) is None


def test_hash_range_basics() -> None:
    full = HashRange.full()
    assert full.size == MAX_HASH + 1
    assert 0 in full and MAX_HASH in full and MAX_HASH + 1 not in full
    lower, upper = full.split()
    assert lower == HashRange(0, 4611686018427387903)
    assert upper == HashRange(4611686018427387904, MAX_HASH)
    assert lower.split()[0].hi == 2305843009213693951
    with pytest.raises(ValueError, match="cannot split"):
        HashRange(5, 5).split()
    for lo, hi in ((-1, 3), (4, 3), (0, MAX_HASH + 1)):
        with pytest.raises(ValueError, match="invalid hash range"):
            HashRange(lo, hi)


@given(keys_st, keys_st)
def test_split_halves_partition(a: int, b: int) -> None:
    lo, hi = min(a, b), max(a, b)
    if lo == hi:
        return
    r = HashRange(lo, hi)
    lower, upper = r.split()
    assert lower.lo == lo and upper.hi == hi and lower.hi + 1 == upper.lo
    assert lower.size + upper.size == r.size
    assert lower.size >= upper.size - 1 and lower.size <= upper.size + 1


@given(keys_st, keys_st)
def test_uint64_roundtrip(a: int, b: int) -> None:
    r = HashRange(min(a, b), max(a, b))
    start, end = r.to_uint64()
    assert (start, end) == (2 * r.lo, 2 * r.hi + 2)
    assert HashRange.from_uint64(start, end) == r


@given(st.text(min_size=1), keys_st, keys_st)
def test_uint64_membership_matches(value: str, a: int, b: int) -> None:
    r = HashRange(min(a, b), max(a, b))
    start, end = r.to_uint64()
    assert (hash_key(value) in r) == (start <= fnv1a_64(value) < end)


def test_from_uint64_rejects_unaligned() -> None:
    with pytest.raises(ValueError, match="not aligned"):
        HashRange.from_uint64(1, 4)
    with pytest.raises(ValueError, match="start < end"):
        HashRange.from_uint64(4, 4)


@given(st.lists(keys_st, min_size=1, max_size=40))
def test_derive_ranges_partition(keys: list[int]) -> None:
    derived = derive_ranges((i, k) for i, k in enumerate(keys))
    ranges = sorted(r for _, r in derived if r is not None)
    assert ranges[0].lo == 0
    assert ranges[-1].hi == MAX_HASH
    for prev, cur in itertools.pairwise(ranges):
        assert prev.hi + 1 == cur.lo
    # Exactly one owner per distinct key; duplicates own nothing.
    assert len(ranges) == len(set(keys))
    for member, rng in derived:
        if rng is not None and rng.hi != MAX_HASH:
            assert rng.hi == keys[member]


def test_derive_three_instances() -> None:
    keys = [9223372036854775807, 4611686018427387903, 2305843009213693951]
    derived = dict(derive_ranges((i, k) for i, k in enumerate(keys)))
    assert derived[2] == HashRange(0, 2305843009213693951)
    assert derived[1] == HashRange(2305843009213693952, 4611686018427387903)
    assert derived[0] == HashRange(4611686018427387904, MAX_HASH)


def test_last_member_extends_to_max() -> None:
    derived = dict(derive_ranges([("a", 10), ("b", 100)]))
    assert derived["b"] == HashRange(11, MAX_HASH)


def test_split_largest_tie_breaks() -> None:
    a, b = HashRange.full().split()
    # Equal sizes: the higher workload wins, then the lower start.
    assert split_largest([(a, 1), (b, 5)]) == 1
    assert split_largest([(a, 5), (b, 1)]) == 0
    assert split_largest([(b, 3), (a, 3)]) == 1
    assert split_largest([(HashRange(0, 9), 0), (HashRange(10, MAX_HASH), 0)]) == 1
    with pytest.raises(ValueError, match="no range can be split"):
        split_largest([(HashRange(3, 3), 1)])


def test_selector_print_and_parse() -> None:
    sel = range_to_selector(HashRange(0, 2**62 - 1))
    assert sel == "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
    full = range_to_selector(HashRange.full(), OWNER_PATH)
    assert full.endswith("'0x10000000000000000')")
    parsed = parse_shard_selector(
        "shardRange(object.metadata.uid,'0x0000000000000000','0x8000000000000000') || "
        " shardRange( object.metadata.namespace , '0x8000000000000000', '0x10000000000000000' ) "
    )
    assert [t.path for t in parsed.terms] == [UID_PATH, NAMESPACE_PATH]
    assert parsed.terms[1].end == 2**64


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty selector"),
        ("shardRange(object.metadata.name, '0x0000000000000000', '0x0000000000000001')", "unsupported path"),
        ("shardRange(object.metadata.uid, 0x0000000000000000, '0x0000000000000001')", "single-quoted"),
        ('shardRange(object.metadata.uid, "0x0000000000000000", "0x0000000000000001")', "single-quoted"),
        (
            "shardRange(object.metadata.uid, '0', '0x0000000000000001')",
            'hexStart must be a 0x-prefixed 16-digit hex value, got "0"$',
        ),
        (
            "shardRange(object.metadata.uid, '0xg', '0x0000000000000001')",
            "hexStart must be a 0x-prefixed 16-digit hex value",
        ),
        ("shardRange(object.metadata.uid, '0x0000000000000002', '0x0000000000000001')", "less than end"),
        ("shardRange(object.metadata.uid, '0x0000000000000001', '0x0000000000000001')", "less than end"),
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x10000000000000001')",
            'hexEnd .* got "0x10000000000000001"$',
        ),
        ("shardRange(object.metadata.uid, '0x0000000000000000', '0x0000000000000001') &&", r"expected '\|\|'"),
        ("shardRange(object.metadata.uid, '0x0000000000000000', '0x0000000000000001') ||", "expected shardRange"),
        ("shardrange(object.metadata.uid, '0x0000000000000000', '0x0000000000000001')", "expected shardRange"),
        # KEP-5866 spelling: 0x + 16 lowercase hex digits; the message names the canonical form (issue 25).
        (
            "shardRange(object.metadata.uid, '0x0', '0x8000000000000002')",
            r'hexStart must be a 0x-prefixed 16-digit hex value, got "0x0" \(did you mean "0x0000000000000000"\?\)',
        ),
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000A')",
            'hexEnd must be a 0x-prefixed 16-digit hex value, got "0x8000000000000000A"$',
        ),
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x80000000000000FF')",
            r'hexEnd .* got "0x80000000000000FF" \(did you mean "0x80000000000000ff"\?\)',
        ),
        (
            "shardRange(object.metadata.uid, '0x00000000000000001', '0x0000000000000002')",
            r'hexStart .* \(did you mean "0x0000000000000001"\?\)',
        ),
        (
            "shardRange(object.metadata.uid, '0x10000000000000000', '0x0000000000000002')",
            'hexStart .* got "0x10000000000000000"',
        ),
        ("shardRange(object.metadata.uid, '0X0000000000000000', '0x0000000000000002')", "hexStart must be"),
    ],
)
def test_selector_errors(text: str, message: str) -> None:
    with pytest.raises(SelectorSyntaxError, match=message):
        parse_shard_selector(text)


def test_printed_bounds_are_canonical() -> None:
    """Everything we print is the only spelling a real kube-apiserver 1.36 accepts."""
    canonical = re.compile(r"^0x(?:[0-9a-f]{16}|10000000000000000)$")
    for rng in (HashRange(0, 0), HashRange(0, 2**62 - 1), HashRange(5, 2**40), HashRange.full()):
        for path in (UID_PATH, OWNER_PATH, NAMESPACE_PATH):
            sel = parse_shard_selector(range_to_selector(rng, path))
            (term,) = sel.terms
            text = str(term)
            bounds = re.findall(r"'([^']*)'", text)
            assert len(bounds) == 2
            assert all(canonical.match(b) for b in bounds), text
            assert parse_shard_selector(text) == sel


@given(st.text(max_size=200))
def test_parser_never_crashes(text: str) -> None:
    with contextlib.suppress(SelectorSyntaxError):
        parse_shard_selector(text)


@given(st.lists(st.tuples(keys_st, keys_st), min_size=1, max_size=5), st.sampled_from([UID_PATH, OWNER_PATH]))
def test_selector_roundtrip(pairs: list[tuple[int, int]], path: str) -> None:
    ranges = [HashRange(min(a, b), max(a, b)) for a, b in pairs]
    text = ranges_to_selector(ranges, path)
    parsed = parse_shard_selector(text)
    assert str(parsed) == text
    assert parse_shard_selector(str(parsed)) == parsed
    assert selector_to_ranges(text) == ranges


def test_owner_path_semantics() -> None:
    lower, upper = HashRange.full().split()
    low_sel = parse_shard_selector(range_to_selector(lower, OWNER_PATH))
    high_sel = parse_shard_selector(range_to_selector(upper, OWNER_PATH))
    owner = "owner-uid-1"
    pod = {"metadata": {"uid": "p", "ownerReferences": [{"uid": owner, "controller": True}]}}
    orphan = {"metadata": {"uid": "orphan"}}
    assert low_sel.matches(pod) != high_sel.matches(pod)
    assert low_sel.matches(pod) == (hash_key(owner) in lower)
    assert low_sel.matches(orphan) and high_sel.matches(orphan)
    hashes = ObjectHashes.of(pod)
    assert hashes.owner == fnv1a_64(owner) and hashes.uid == fnv1a_64("p")


def test_uid_and_namespace_paths() -> None:
    obj = {"metadata": {"uid": "u1", "namespace": "ns"}}
    lower, upper = HashRange.full().split()
    uid_hits = [parse_shard_selector(range_to_selector(r, UID_PATH)).matches(obj) for r in (lower, upper)]
    ns_hits = [parse_shard_selector(range_to_selector(r, NAMESPACE_PATH)).matches(obj) for r in (lower, upper)]
    assert sorted(uid_hits) == [False, True] and sorted(ns_hits) == [False, True]
    cluster_scoped = {"metadata": {"uid": "u1"}}
    assert not any(
        parse_shard_selector(range_to_selector(r, NAMESPACE_PATH)).matches(cluster_scoped) for r in (lower, upper)
    )


_HASH_OR_NONE = st.none() | st.integers(min_value=0, max_value=(1 << 64) - 1)


@given(
    st.lists(st.tuples(keys_st, keys_st), min_size=1, max_size=3),
    st.lists(st.sampled_from([UID_PATH, OWNER_PATH, NAMESPACE_PATH]), min_size=3, max_size=3),
    st.lists(st.builds(ObjectHashes, _HASH_OR_NONE, _HASH_OR_NONE, _HASH_OR_NONE), min_size=1, max_size=8),
)
def test_compiled_predicate_agrees_with_matches_hashes(
    pairs: list[tuple[int, int]], paths: list[str], objects: list[ObjectHashes]
) -> None:
    text = " || ".join(
        range_to_selector(HashRange(min(a, b), max(a, b)), path) for (a, b), path in zip(pairs, paths, strict=False)
    )
    selector = parse_shard_selector(text)
    predicate = selector.predicate()
    for hashes in objects:
        assert predicate(hashes) == selector.matches_hashes(hashes)
