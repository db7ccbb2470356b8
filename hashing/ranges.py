"""Hash ranges and how instance keys derive them.

Purpose
    A :class:`HashRange` is an inclusive slice ``[lo, hi]`` of ``[0, MAX_HASH]``.
    Instances store only their upper bound (``hashKey``); ranges are derived:
    sorted by key, instance *i* owns ``[key(i-1) + 1, key(i)]``, the first from
    0, the last up to ``MAX_HASH`` whatever its stored key says.

Invariants
    * ``0 <= lo <= hi <= MAX_HASH`` (checked in ``__post_init__``, never assumed).
    * The ranges returned by :func:`derive_ranges` for a non-empty key set are
      pairwise disjoint and their union is exactly ``[0, MAX_HASH]``.
    * ``HashRange.split`` gives the lower half ``[lo, lo + (hi - lo) // 2]`` to
      the newcomer and keeps the rest; both halves are non-empty.

Concurrency model
    Immutable values and pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from hashing.keys import MAX_HASH, UINT64_SPACE

T = TypeVar("T")


@dataclass(frozen=True, order=True, slots=True)
class HashRange:
    """An inclusive, non-empty range ``[lo, hi]`` of the 63-bit hash space."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not (0 <= self.lo <= self.hi <= MAX_HASH):
            raise ValueError(f"invalid hash range [{self.lo}, {self.hi}]: need 0 <= lo <= hi <= {MAX_HASH}")

    @classmethod
    def full(cls) -> HashRange:
        """The whole space ``[0, MAX_HASH]``."""
        return cls(0, MAX_HASH)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and self.lo <= key <= self.hi

    def contains(self, key: int) -> bool:
        """True if ``key`` lies in ``[lo, hi]``."""
        return self.lo <= key <= self.hi

    @property
    def size(self) -> int:
        """Number of keys in the range."""
        return self.hi - self.lo + 1

    @property
    def share(self) -> float:
        """Fraction of the whole hash space this range covers."""
        return self.size / (MAX_HASH + 1)

    def split(self) -> tuple[HashRange, HashRange]:
        """Split into ``(lower, upper)``; the newcomer takes ``lower``.

        ``lower = [lo, lo + (hi - lo) // 2]``. Raises ``ValueError`` for a
        single-key range, which cannot be split.
        """
        if self.size < 2:
            raise ValueError(f"cannot split single-key range [{self.lo}, {self.hi}]")
        mid = self.lo + (self.hi - self.lo) // 2
        return HashRange(self.lo, mid), HashRange(mid + 1, self.hi)

    def to_uint64(self) -> tuple[int, int]:
        """The same keys in the 64-bit FNV space: ``[2*lo, 2*hi + 2)``."""
        return 2 * self.lo, 2 * self.hi + 2

    @classmethod
    def from_uint64(cls, start: int, end: int) -> HashRange:
        """Inverse of :meth:`to_uint64` for ``[start, end)`` aligned to even bounds."""
        if not (0 <= start < end <= UINT64_SPACE):
            raise ValueError(f"invalid uint64 range [{start:#x}, {end:#x}): need start < end <= 2**64")
        if start % 2 or end % 2:
            raise ValueError(
                f"uint64 range [{start:#x}, {end:#x}) is not aligned to the 63-bit key space (both bounds must be even)"
            )
        return cls(start // 2, end // 2 - 1)

    def __str__(self) -> str:
        return f"[{self.lo}, {self.hi}]"


def derive_ranges(members: Iterable[tuple[T, int]]) -> list[tuple[T, HashRange | None]]:
    """Derive each member's range from ``(member, key)`` pairs.

    Members are ordered by ``(key, position in the input)``. Each owns
    ``[previous key + 1, its key]``; the first starts at 0 and the last ends at
    ``MAX_HASH``. A member whose key repeats an earlier key (only possible for
    records written by hand) owns nothing and gets ``None``. Keys outside
    ``[0, MAX_HASH]`` are clamped.
    """
    indexed = [(min(max(key, 0), MAX_HASH), pos, member) for pos, (member, key) in enumerate(members)]
    indexed.sort(key=lambda t: (t[0], t[1]))
    out: list[tuple[T, HashRange | None]] = []
    next_lo = 0
    last_real = -1
    for key, _pos, member in indexed:
        if key < next_lo:
            out.append((member, None))
            continue
        out.append((member, HashRange(next_lo, key)))
        last_real = len(out) - 1
        next_lo = key + 1
    if last_real >= 0:
        member, rng = out[last_real]
        if rng is not None and rng.hi != MAX_HASH:
            out[last_real] = (member, HashRange(rng.lo, MAX_HASH))
    return out


def split_largest(candidates: Sequence[tuple[HashRange, int]]) -> int:
    """Return the index of the range a newcomer splits.

    ``candidates`` are ``(range, workloadNum)`` pairs. The largest range wins;
    ties go to the higher workload, then to the lower start. Ranges of a single
    key cannot be split and are skipped; ``ValueError`` if none can be.
    """
    splittable = [i for i, (rng, _) in enumerate(candidates) if rng.size >= 2]
    if not splittable:
        raise ValueError("no range can be split: every range holds a single key")
    return max(splittable, key=lambda i: (candidates[i][0].size, candidates[i][1], -candidates[i][0].lo))
