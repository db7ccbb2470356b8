"""Measured reconcile cost per key hash, decayed over a window (for ``rangeshard rebalance --by cost``).

Purpose
    Equal object counts are not equal work: one object may take ten times the
    reconcile time of another. :class:`CostTracker` adds up, per key hash
    (the hash the key is sharded by), the wall time of its reconciles, and
    lets old measurements fade: a measurement ``dt`` seconds old counts
    ``exp(-dt / window)`` of its value (``window`` = ``costWindowSeconds``,
    the mean age of what is counted). The runtime publishes the decayed sums
    per histogram bucket in its registry record (``histogram.cost``, see
    :func:`registry.rebalance.add_cost`).

Invariants
    * Values only decay between measurements; a key whose decayed cost falls
      below ``floor`` seconds is forgotten (memory stays bounded by the keys
      reconciled within a few windows).
    * ``snapshot`` never returns negative or non-finite values.

Concurrency model
    Worker threads call :meth:`record`; the shard thread calls
    :meth:`snapshot` when it heartbeats. One lock guards the table.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

#: Decayed costs below this many seconds are dropped.
FLOOR = 1e-6


class CostTracker:
    """Decayed reconcile seconds per key hash (see module docstring)."""

    def __init__(self, window: float, clock: Callable[[], float] = time.monotonic, floor: float = FLOOR) -> None:
        if not window > 0:
            raise ValueError(f"cost window must be positive, got {window}")
        self.window = window
        self.clock = clock
        self.floor = floor
        self._lock = threading.Lock()
        self._costs: dict[int, tuple[float, float]] = {}  # key hash -> (value, as of time)

    def record(self, key_hash: int, seconds: float) -> None:
        """Add one reconcile of ``seconds`` to ``key_hash``."""
        if not (seconds >= 0 and math.isfinite(seconds)):
            return
        now = self.clock()
        with self._lock:
            value, at = self._costs.get(key_hash, (0.0, now))
            self._costs[key_hash] = (value * math.exp(-(now - at) / self.window) + seconds, now)

    def snapshot(self) -> dict[int, float]:
        """Every key's decayed cost now (keys below the floor are forgotten)."""
        now = self.clock()
        out: dict[int, float] = {}
        with self._lock:
            for key, (value, at) in list(self._costs.items()):
                decayed = value * math.exp(-max(0.0, now - at) / self.window)
                if decayed < self.floor:
                    del self._costs[key]
                else:
                    out[key] = decayed
        return out
