"""A rate-limited, delaying work queue with client-go semantics.

Purpose
    Controllers turn watch events into *keys* (``namespace/name``) and hand them
    to a pool of worker threads through a :class:`WorkQueue`. The queue is a
    port of client-go's ``workqueue`` (seed ``004_*``): a FIFO *queue*, a
    *dirty* set (keys that need processing) and a *processing* set (keys a
    worker holds right now), plus client-go's delaying queue (``add_after``)
    and per-key exponential back-off (``add_rate_limited``/``forget``).

Invariants
    * **One key is never handed to two workers at once.** :meth:`WorkQueue.get`
      moves a key from *dirty* to *processing*; while it is processing, an
      :meth:`~WorkQueue.add` only marks it dirty, and :meth:`~WorkQueue.done`
      puts it back at the end of the queue. So a key is either queued, or
      processing, or processing and dirty (will be queued again) - never twice
      in the queue and never held twice.
    * A key is queued at most once (dirty keys are deduplicated); distinct keys
      leave the queue in the order they entered it (FIFO).
    * Level-triggered, not edge-triggered: every :meth:`~WorkQueue.add` is
      followed by at least one :meth:`~WorkQueue.get` of that key that *starts*
      after the add, but several adds may collapse into one.
    * A key waits for at most one delayed add: a second ``add_after`` of the
      same key keeps the *earlier* ready time (client-go's rule); the later
      request is covered by the earlier processing.
    * After :meth:`~WorkQueue.shutdown`, ``add``/``add_after`` are ignored and
      pending delayed adds are dropped; :meth:`~WorkQueue.get` still hands out
      keys that were already queued (and keys that were re-dirtied while
      processing), and returns ``None`` once the queue is empty.
    * Back-off delay: ``min(base_delay * 2**failures, max_delay)``, counted per
      key until :meth:`~WorkQueue.forget`.

Concurrency model
    Thread-safe. All state is guarded by **one** :class:`threading.Condition`
    (over a plain, non-reentrant lock). Three kinds of threads wait on it:
    workers in :meth:`~WorkQueue.get`, callers of :meth:`~WorkQueue.wait_idle`,
    and the queue's single daemon timer thread (``workqueue-<name>-delay``,
    started on the first delayed add) that moves due keys from a heap into the
    queue. Because waiters of different kinds share the condition, every state
    change uses ``notify_all`` (``notify`` could wake the wrong kind of waiter
    and lose the wake-up); with a few dozen workers per queue this costs
    nothing measurable. Delays are measured with :func:`time.monotonic`.
    The predicate given to :meth:`~WorkQueue.wait_idle` runs under the lock:
    it must be fast and must not call back into the queue.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from rangeshard.core.loops import start_thread

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

# 2.0**1023 is the largest power of two a float holds; beyond it ``2.0**n`` raises.
_MAX_EXPONENT = 1023


class WorkQueue(Generic[K]):
    """A work queue of hashable keys; see the module docstring for the guarantees."""

    def __init__(self, name: str, *, base_delay: float = 0.005, max_delay: float = 60.0) -> None:
        if not base_delay > 0:
            raise ValueError(f"workqueue {name!r}: base_delay must be positive, got {base_delay!r}")
        if not max_delay >= base_delay:
            raise ValueError(f"workqueue {name!r}: max_delay ({max_delay!r}) must be >= base_delay ({base_delay!r})")
        self._name = name
        self._base_delay = float(base_delay)
        self._max_delay = float(max_delay)
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._failures: dict[K, int] = {}
        self._shutting_down = False
        # Delayed adds: a heap of (ready_at, seq, key); ``_waiting`` holds the live
        # entry of each key, so superseded heap entries are skipped when popped.
        self._heap: list[tuple[float, int, K]] = []
        self._waiting: dict[K, tuple[float, int]] = {}
        self._seq = itertools.count()
        self._timer: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self._name

    # -- adding ------------------------------------------------------------

    def add(self, key: K) -> None:
        """Queue ``key`` unless it is already queued; if it is processing, queue it again after :meth:`done`."""
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: K) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return
        self._queue.append(key)
        self._cond.notify_all()

    def add_after(self, key: K, delay: float) -> None:
        """Add ``key`` once ``delay`` seconds have passed (at once if ``delay <= 0``)."""
        with self._cond:
            if self._shutting_down:
                return
            if delay <= 0:
                self._add_locked(key)
                return
            ready_at = time.monotonic() + delay
            current = self._waiting.get(key)
            if current is not None and current[0] <= ready_at:
                return
            seq = next(self._seq)
            self._waiting[key] = (ready_at, seq)
            heapq.heappush(self._heap, (ready_at, seq, key))
            if self._timer is None:
                self._timer = start_thread(f"workqueue-{self._name}-delay", self._run_timer)
            self._cond.notify_all()

    def add_rate_limited(self, key: K) -> None:
        """Add ``key`` after its back-off delay, then count one more failure for it."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        self.add_after(key, self._backoff(failures))

    def _backoff(self, failures: int) -> float:
        return min(self._base_delay * 2.0 ** min(failures, _MAX_EXPONENT), self._max_delay)

    def forget(self, key: K) -> None:
        """Reset the failure counter of ``key`` (call after a successful reconcile)."""
        with self._cond:
            self._failures.pop(key, None)

    def num_requeues(self, key: K) -> int:
        """How many rate-limited adds ``key`` had since it was last forgotten."""
        with self._cond:
            return self._failures.get(key, 0)

    # -- processing --------------------------------------------------------

    def get(self, timeout: float | None = None) -> K | None:
        """Take the next key and mark it processing; ``None`` on timeout or once shut down and empty.

        Blocks while the queue is empty (at most ``timeout`` seconds if given).
        The caller must call :meth:`done` with the key when it has finished.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._queue and not self._shutting_down:
                if deadline is None:
                    self._cond.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            if not self._queue:
                return None
            key = self._queue.popleft()
            self._processing.add(key)
            self._dirty.discard(key)
            return key

    def done(self, key: K) -> None:
        """Mark ``key`` as no longer processing; if it was added meanwhile, queue it again."""
        with self._cond:
            if key not in self._processing:
                log.warning("workqueue %s: done(%r) for a key that is not processing", self._name, key)
                return
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
            self._cond.notify_all()

    # -- shutdown and inspection -------------------------------------------

    def shutdown(self) -> None:
        """Stop accepting keys, drop delayed adds and wake every blocked :meth:`get`."""
        with self._cond:
            if self._shutting_down:
                return
            self._shutting_down = True
            self._heap.clear()
            self._waiting.clear()
            timer = self._timer
            self._cond.notify_all()
        if timer is not None and timer is not threading.current_thread():
            timer.join(timeout=5.0)
        log.debug("workqueue %s: shut down", self._name)

    @property
    def shutting_down(self) -> bool:
        with self._cond:
            return self._shutting_down

    def __len__(self) -> int:
        """Number of queued keys (not counting keys being processed or waiting for a delay)."""
        with self._cond:
            return len(self._queue)

    def processing(self) -> frozenset[K]:
        """Snapshot of the keys workers hold right now."""
        with self._cond:
            return frozenset(self._processing)

    def wait_idle(self, keys_predicate: Callable[[K], bool], timeout: float) -> bool:
        """Block until no processing key satisfies ``keys_predicate``; ``False`` on timeout.

        Used when a range shrinks: wait until every in-flight reconcile of a key
        outside the new range has finished. The predicate runs under the queue's
        lock (keep it cheap; do not call the queue from it).
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while any(keys_predicate(k) for k in self._processing):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    # -- timer thread --------------------------------------------------------

    def _run_timer(self) -> None:
        with self._cond:
            while not self._shutting_down:
                if not self._heap:
                    self._cond.wait()
                    continue
                now = time.monotonic()
                ready_at, seq, key = self._heap[0]
                if ready_at > now:
                    self._cond.wait(ready_at - now)
                    continue
                heapq.heappop(self._heap)
                if self._waiting.get(key) == (ready_at, seq):
                    del self._waiting[key]
                    self._add_locked(key)
