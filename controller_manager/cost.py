"""Measured reconcile cost per key hash, as seconds per window (for ``rangeshard rebalance --by cost``).

Purpose
    Equal object counts are not equal work: one object may take ten times the
    reconcile time of another. :class:`CostTracker` measures, per key hash
    (the hash the key is sharded by), how many seconds of reconcile wall time
    the key costs per ``window`` (``costWindowSeconds``); the runtime
    publishes the sums per histogram bucket in its registry record
    (``histogram.cost``, see :func:`registry.histogram.add_cost`). The unit is
    the one earlier versions published (a decayed sum whose steady state is
    rate x window), so records of both stay comparable and readable.

    **No warm-up.** A decayed sum of a key's costs reaches its steady state
    only after about three windows, so an instance that just received a key
    (a join, a rebalance move) under-reported it for that long. Instead, each
    key's rate is its decayed cost divided by the decayed length of time this
    instance has observed it::

        seconds per window = W * rate = S / (1 - exp(-span / W))

    ``span`` runs from the start of the observation to the key's latest
    reconcile; ``S`` sums the costs of the reconciles after the start, each
    decayed (``exp(-age / W)``) from the middle of the interval it closes. For
    a key reconciled every ``I`` seconds this is ``c / (2 sinh(I / 2W))``
    (about ``c * W / I``) as soon as one interval was seen: a key seen for a
    second reports what one seen for ten windows does. The observation starts
    at the last of the key's *arrival* reconciles: an instance reconciles a
    key that entered its range (or was first listed) at once, and typically a
    second time within ~0.25 s (the retry of the key refused while the
    instance was locked, or the resync when processing is allowed); those are
    the arrival's work, not the key's cadence.

Invariants
    * Before a first interval is seen (only arrival reconciles), the key
      counts its arrival reconciles' seconds decayed from then
      (``c * exp(-age / W)``, as earlier versions did).
    * A rate is never extrapolated from less than ``W * MIN_SPAN_WINDOWS`` of
      observation: a burst counts as at most ``1 / (1 - exp(-MIN_SPAN_WINDOWS))``
      (~20) times its seconds.
    * Within its mean interval after its latest reconcile a key's value does
      not decay (no saw-tooth in what is published); past that it decays as
      ``exp(-overdue / W)``, and below ``floor`` seconds the key is forgotten
      (memory stays bounded by the keys reconciled within a few windows).
    * A reconcile after a gap longer than ``RESTART_INTERVALS`` mean intervals
      (and longer than the minimum span) starts a new observation, arrival
      included: the key was most likely on another instance meanwhile, and
      the gap is no time in which it was cheap here.
    * An interval more than ``BURST_RATIO`` times as long as the whole
      observation before it marks that observation as a burst (more arrival
      reconciles than usual, say an update right after the arrival): the
      observation restarts at the burst's last reconcile.
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
from dataclasses import dataclass

#: Published costs below this many seconds are dropped.
FLOOR = 1e-6

#: A rate is measured over at least this many windows of observation (bounds what a burst extrapolates to).
MIN_SPAN_WINDOWS = 0.05

#: A gap this many times a key's mean reconcile interval restarts its observation.
RESTART_INTERVALS = 8.0

#: Reconciles that an arrival brings before the key's own cadence: the first reconcile and the retry of the
#: key refused while the instance was locked (or the resync when processing is allowed), within ~0.25 s.
ARRIVAL_RECONCILES = 2

#: An interval this many times longer than everything observed before it ends a burst: the observation
#: restarts at the burst's last reconcile.
BURST_RATIO = 4.0


@dataclass(slots=True)
class _KeyCost:
    """One key's observation on this instance (times from the tracker's clock)."""

    first: float  # the observation starts: the last of its arrival reconciles
    last: float  # its latest reconcile
    arrival_cost: float  # the arrival reconciles' seconds, decayed to ``first`` (shown until an interval is seen)
    arrivals: int = 1  # arrival reconciles seen
    intervals: int = 0  # reconciles after ``first``
    decayed: float = 0.0  # their seconds, each decayed from its interval's middle to ``last``


class CostTracker:
    """Reconcile seconds per window of each key hash, free of warm-up (see module docstring)."""

    def __init__(self, window: float, clock: Callable[[], float] = time.monotonic, floor: float = FLOOR) -> None:
        if not window > 0:
            raise ValueError(f"cost window must be positive, got {window}")
        self.window = window
        self.clock = clock
        self.floor = floor
        self.min_span = window * MIN_SPAN_WINDOWS
        self._lock = threading.Lock()
        self._costs: dict[int, _KeyCost] = {}

    def record(self, key_hash: int, seconds: float) -> None:
        """Add one reconcile of ``seconds`` to ``key_hash``, ending now."""
        if not (seconds >= 0 and math.isfinite(seconds)):
            return
        now = self.clock()
        with self._lock:
            k = self._costs.get(key_hash)
            if k is None or self._restarts(k, now):
                self._costs[key_hash] = _KeyCost(first=now, last=now, arrival_cost=seconds)
                return
            gap = max(0.0, now - k.last)
            if k.intervals == 0 and k.arrivals < ARRIVAL_RECONCILES:
                # Still arriving: the observation starts at this reconcile.
                k.arrival_cost = k.arrival_cost * math.exp(-gap / self.window) + seconds
                k.arrivals += 1
                k.first = k.last = max(k.last, now)
                return
            if k.intervals and gap > BURST_RATIO * (k.last - k.first):
                # What came before was a burst, not the key's cadence: the observation starts at its last reconcile.
                k.first, k.intervals, k.decayed = k.last, 0, 0.0
            k.decayed = k.decayed * math.exp(-gap / self.window) + seconds * math.exp(-gap / (2 * self.window))
            k.intervals += 1
            k.last = max(k.last, now)

    def _restarts(self, k: _KeyCost, now: float) -> bool:
        """Whether a reconcile at ``now`` starts a new observation of ``k`` (a gap far beyond its cadence)."""
        if k.intervals < 2:
            return False  # one interval is no cadence yet
        mean = (k.last - k.first) / k.intervals
        return now - k.last > max(RESTART_INTERVALS * mean, self.min_span)

    def _value(self, k: _KeyCost, now: float) -> float:
        """Seconds per window of ``k`` at ``now`` (see module docstring)."""
        w = self.window
        if k.intervals == 0:
            return k.arrival_cost * math.exp(-max(0.0, now - k.first) / w)
        span = k.last - k.first
        overdue = max(0.0, now - k.last - span / k.intervals)
        return k.decayed * math.exp(-overdue / w) / -math.expm1(-max(span, self.min_span) / w)

    def snapshot(self) -> dict[int, float]:
        """Every key's seconds per window now (keys below the floor are forgotten)."""
        now = self.clock()
        out: dict[int, float] = {}
        with self._lock:
            for key, k in list(self._costs.items()):
                value = self._value(k, now)
                if not (value >= self.floor and math.isfinite(value)):
                    del self._costs[key]
                else:
                    out[key] = value
        return out
