"""Short garbage-collector pauses for a process that holds large watch caches.

Purpose
    A watch cache keeps every object of a resource and up to 100,000 history
    events, several GC-tracked Python objects each. CPython's cycle collector
    walks all of them on every full (generation 2) collection: measured in
    ``bench`` at 60,000 events, full collections took up to **45 ms**, which is
    what the p99 delivery latency paid. None of those objects is part of a
    reference cycle (they are freed by reference counting when the cache
    drops them), so walking them finds nothing.

    :class:`HeapKeeper` runs in the proxy process (``rangeshard proxy`` turns
    it on) and, every ``freeze_interval`` seconds, collects the objects
    created since its last pass (a full collection that only sees unfrozen
    objects, so its cost follows the allocation rate, not the cache size) and
    then moves every survivor to the permanent generation (``gc.freeze()``),
    out of the collector's sight. Frozen objects are still freed by reference
    counting; only a *cycle* that was alive at a freeze and dies later stays
    unreclaimed, so every ``full_interval`` seconds the keeper unfreezes
    everything and runs one complete collection (one long pause per hour by
    default) before freezing again.

Invariants
    * Between two passes, garbage cycles are reclaimed by the automatic young
      collections as usual; what is frozen was reachable at freeze time.
    * At most ``full_interval`` (+ one ``freeze_interval``) after a cycle
      becomes garbage it is reclaimed.
    * ``stop`` unfreezes, so a process that stops the keeper (tests, a
      shutting-down app) is left with an ordinary collector.

Concurrency model
    One named asyncio task on the proxy's event loop (collections are
    synchronous, like every automatic collection). ``gc`` state is
    process-wide: run one keeper per process, never in a library or test
    process that did not ask for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from dataclasses import dataclass

from rangeshard.core.loops import start_task

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HeapSettings:
    """How often the keeper freezes survivors, and how often it reclaims everything."""

    freeze_interval: float = 0.25
    full_interval: float = 3600.0

    def __post_init__(self) -> None:
        if not (self.freeze_interval > 0 and self.full_interval >= self.freeze_interval):
            raise ValueError("need freeze_interval > 0 and full_interval >= freeze_interval")


class HeapKeeper:
    """Periodic collect-then-freeze of the process heap (see module docstring)."""

    def __init__(self, settings: HeapSettings) -> None:
        self.settings = settings
        self.passes = 0
        self.full_passes = 0
        #: Duration of the longest pass so far (seconds).
        self.longest_pass = 0.0
        self._task: asyncio.Task[None] | None = None
        self._last_full = time.monotonic()

    def start(self) -> None:
        """Start the background task (idempotent)."""
        if self._task is None:
            self._last_full = time.monotonic()
            self._task = start_task(self._run(), "proxy:heap-keeper", what="the heap keeper")

    async def stop(self) -> None:
        """Stop the task and unfreeze the heap."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        gc.unfreeze()

    def run_pass(self) -> float:
        """One pass now: collect the unfrozen objects (all of them if a full pass is due), then freeze."""
        t0 = time.perf_counter()
        full = time.monotonic() - self._last_full >= self.settings.full_interval
        if full:
            gc.unfreeze()
        gc.collect()
        gc.freeze()
        took = time.perf_counter() - t0
        self.passes += 1
        self.longest_pass = max(self.longest_pass, took)
        if full:
            self._last_full = time.monotonic()
            self.full_passes += 1
            log.info("full garbage collection: %.1f ms, %d objects frozen", took * 1000, gc.get_freeze_count())
        else:
            # Not gc.get_freeze_count() here: it walks every frozen object (~15 ms with a full cache).
            log.debug("heap keeper pass: %.2f ms", took * 1000)
        return took

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.freeze_interval)  # the pass interval, not synchronisation
            self.run_pass()
