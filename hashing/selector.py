"""The ``shardSelector`` grammar of KEP-5866, with rangeshard's owner-aware path.

Purpose
    Parse, print and evaluate selectors of the form::

        shardRange(<path>, '0x<start>', '0x<end>') [|| shardRange(...)]...

    over the 64-bit FNV-1a space ``[0, 2**64)``: start inclusive, end exclusive,
    ``start < end <= 2**64``. Bounds are spelled as kube-apiserver 1.36 requires:
    ``0x`` + exactly 16 lowercase hex digits (the end may be
    ``0x10000000000000000``); any other spelling is refused with a message
    naming the canonical form, and we print only that form. Paths:

    * ``object.metadata.uid``
    * ``object.metadata.namespace``
    * ``object.metadata.ownerReferences.controller.uid`` (ours): the uid of the
      controller ownerReference; an object without one matches every range,
      so orphans stay visible to every instance and can be adopted.
    * ``object.metadata.ownerReferences.root(<kinds>).uid`` (ours, ``by: root``).
    * ``object.metadata.labels(<label key>)`` (ours, ``by: label``): the value of
      that label; an object without the label by its own ``metadata.uid``.

Invariants
    * :func:`parse_shard_selector` either returns a non-empty
      :class:`ShardSelector` or raises :class:`SelectorSyntaxError` whose
      message names the offending position and what was expected.
    * ``parse_shard_selector(str(s)) == s`` for every valid selector ``s``.
    * ``range_to_selector(r)`` selects exactly the objects whose
      ``hash_key`` lies in ``r`` (the ``>> 1`` of :mod:`hashing.keys` keeps order).

Concurrency model
    Immutable values and pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hashing.keys import UINT64_SPACE
from hashing.ranges import HashRange
from hashing.rules import PATHS, UID_PATH, ObjectHashes, ShardBy, is_path, label_of_path

_MAX_SELECTOR_LENGTH = 16 * 1024
_MAX_TERMS = 256


class SelectorSyntaxError(ValueError):
    """A ``shardSelector`` that does not follow the grammar; the message says where and why."""


@dataclass(frozen=True, slots=True)
class ShardRange:
    """One ``shardRange(path, start, end)`` term: ``[start, end)`` of the uint64 space."""

    path: str
    start: int
    end: int

    def __post_init__(self) -> None:
        if not is_path(self.path):
            raise ValueError(f"unsupported path {self.path!r}; supported: {', '.join(PATHS)}")
        if not (0 <= self.start < self.end <= UINT64_SPACE):
            raise ValueError(f"invalid range [{self.start:#x}, {self.end:#x}): need 0 <= start < end <= 2**64")

    def contains(self, value64: int) -> bool:
        """True if the 64-bit hash ``value64`` lies in ``[start, end)``."""
        return self.start <= value64 < self.end

    def __str__(self) -> str:
        return f"shardRange({self.path}, '{canonical_bound(self.start)}', '{canonical_bound(self.end)}')"


@dataclass(frozen=True, slots=True)
class ShardSelector:
    """A disjunction of :class:`ShardRange` terms (never empty)."""

    terms: tuple[ShardRange, ...]

    def __post_init__(self) -> None:
        if not self.terms:
            raise ValueError("a shard selector needs at least one shardRange term")

    def __str__(self) -> str:
        return " || ".join(str(t) for t in self.terms)

    @property
    def paths(self) -> frozenset[str]:
        """The set of paths the terms use."""
        return frozenset(t.path for t in self.terms)

    def matches_hashes(self, hashes: ObjectHashes) -> bool:
        """Evaluate the selector against precomputed hashes (each term by its path's :class:`ShardBy` rule).

        An object lacking the hashed field (no uid, cluster-scoped for the
        namespace path) matches no term of that path, except the owner path:
        no controller reference matches every owner-path term.
        """
        return any(ShardBy.of_path(t.path).in_range(hashes, t.start, t.end, label_of_path(t.path)) for t in self.terms)

    def predicate(self) -> Callable[[ObjectHashes], bool]:
        """:meth:`matches_hashes` specialised to this selector, for hot loops.

        A single term (what a controller instance asks for) compiles to one
        attribute read and one chained comparison; anything else falls back to
        :meth:`matches_hashes`. Both give the same answer for every input.
        """
        if len(self.terms) != 1:
            return self.matches_hashes
        term = self.terms[0]
        start, end = term.start, term.end
        rule = ShardBy.of_path(term.path)
        # One closure per rule (not a getattr by name): this runs once per event and watcher.
        if rule is ShardBy.OWNER:

            def owner_in(h: ObjectHashes) -> bool:
                v = h.owner
                return v is None or start <= v < end

            return owner_in
        if rule is ShardBy.ROOT:

            def root_in(h: ObjectHashes) -> bool:
                v = h.root
                return v is not None and start <= v < end

            return root_in
        if rule is ShardBy.LABEL:
            key = label_of_path(term.path) or ""

            def label_in(h: ObjectHashes) -> bool:
                v = h.label(key)
                return v is not None and start <= v < end

            return label_in
        if rule is ShardBy.UID:

            def uid_in(h: ObjectHashes) -> bool:
                v = h.uid
                return v is not None and start <= v < end

            return uid_in

        def namespace_in(h: ObjectHashes) -> bool:
            v = h.namespace
            return v is not None and start <= v < end

        return namespace_in

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Evaluate the selector against a Kubernetes object."""
        return self.matches_hashes(ObjectHashes.of(obj))


_TERM_RE = re.compile(
    r"""\s*shardRange\s*\(\s*
        (?P<path>[A-Za-z_][A-Za-z0-9_.]*(?:\([A-Za-z0-9_.,/-]*\)[A-Za-z0-9_.]*)?)\s*,\s*
        (?P<start>'[^']*'|"[^"]*"|[^,)\s]+)\s*,\s*
        (?P<end>'[^']*'|"[^"]*"|[^,)\s]+)\s*
        \)\s*""",
    re.VERBOSE,
)
_HEX_RE = re.compile(r"0x[0-9a-fA-F]{1,17}")
#: The only spelling KEP-5866 (kube-apiserver 1.36) accepts: ``0x`` + 16 lowercase hex digits.
_CANONICAL_RE = re.compile(r"0x[0-9a-f]{16}")
#: The one 17-digit bound: the exclusive end of the whole space.
_SPACE_END = "0x10000000000000000"


def canonical_bound(value: int) -> str:
    """The KEP-5866 spelling of a bound: ``0x`` + 16 lowercase hex digits (``2**64`` as ``0x10000000000000000``)."""
    if value == UINT64_SPACE:
        return _SPACE_END
    return f"0x{value:016x}"


def _parse_bound(token: str, name: str, pos: int) -> int:
    # name is "hexStart" or "hexEnd", as kube-apiserver names them in its messages.
    if not (len(token) >= 2 and token[0] == "'" and token[-1] == "'"):
        raise SelectorSyntaxError(
            f"at offset {pos}: {name} must be a single-quoted hex string like '0x0000000000000000', got {token}"
        )
    body = token[1:-1]
    if _CANONICAL_RE.fullmatch(body) or (name == "hexEnd" and body == _SPACE_END):
        return int(body, 16)
    hint = ""
    if _HEX_RE.fullmatch(body) and int(body, 16) <= UINT64_SPACE:
        hint = f' (did you mean "{canonical_bound(int(body, 16))}"?)'
    raise SelectorSyntaxError(f'{name} must be a 0x-prefixed 16-digit hex value, got "{body}"{hint}')


def parse_shard_selector(text: str) -> ShardSelector:
    """Parse a ``shardSelector`` string; raise :class:`SelectorSyntaxError` on anything else."""
    if len(text) > _MAX_SELECTOR_LENGTH:
        raise SelectorSyntaxError(f"selector is {len(text)} characters long; at most {_MAX_SELECTOR_LENGTH} allowed")
    if not text.strip():
        raise SelectorSyntaxError("empty selector: expected shardRange(<path>, '0x<start>', '0x<end>')")
    terms: list[ShardRange] = []
    pos = 0
    while True:
        m = _TERM_RE.match(text, pos)
        if m is None:
            snippet = text[pos : pos + 40].strip() or "end of input"
            raise SelectorSyntaxError(
                f"at offset {pos}: expected shardRange(<path>, '0x<start>', '0x<end>'), got {snippet!r}"
            )
        path = m.group("path")
        if not is_path(path):
            raise SelectorSyntaxError(
                f"at offset {m.start('path')}: unsupported path {path!r}; supported: {', '.join(PATHS)}, "
                "object.metadata.ownerReferences.root(<resource.group>,...).uid (via kinds sorted, each once), "
                "or object.metadata.labels(<label key>)"
            )
        start = _parse_bound(m.group("start"), "hexStart", m.start("start"))
        end = _parse_bound(m.group("end"), "hexEnd", m.start("end"))
        if start >= end:
            raise SelectorSyntaxError(f"at offset {m.start('start')}: start {start:#x} must be less than end {end:#x}")
        terms.append(ShardRange(path, start, end))
        if len(terms) > _MAX_TERMS:
            raise SelectorSyntaxError(f"more than {_MAX_TERMS} shardRange terms")
        pos = m.end()
        if pos == len(text):
            break
        if text.startswith("||", pos):
            pos += 2
            continue
        raise SelectorSyntaxError(f"at offset {pos}: expected '||' or end of input, got {text[pos : pos + 20]!r}")
    return ShardSelector(tuple(terms))


def range_to_selector(rng: HashRange, path: str = UID_PATH) -> str:
    """Render an int64 range as a one-term selector over ``[2*lo, 2*hi + 2)``."""
    start, end = rng.to_uint64()
    return str(ShardSelector((ShardRange(path, start, end),)))


def ranges_to_selector(ranges: Sequence[HashRange], path: str = UID_PATH) -> str:
    """Render several int64 ranges as one selector (terms joined by ``||``)."""
    return str(ShardSelector(tuple(ShardRange(path, *r.to_uint64()) for r in ranges)))


def selector_to_ranges(selector: str | ShardSelector) -> list[HashRange]:
    """Convert a selector back to int64 ranges (bounds must be even; one path only)."""
    sel = parse_shard_selector(selector) if isinstance(selector, str) else selector
    if len(sel.paths) != 1:
        raise ValueError(f"selector mixes paths {sorted(sel.paths)}; convert one path at a time")
    return [HashRange.from_uint64(t.start, t.end) for t in sel.terms]
