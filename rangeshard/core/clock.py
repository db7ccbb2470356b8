"""The one clock interface of the handover: monotonic seconds, injectable for tests.

Purpose
    Lease fencing (``registry.lease.LeaseKeeper``) and the handover state
    machine (``controller_manager.sharding.ShardInstance``) decide safety
    questions by comparing monotonic instants: *may this reconcile start, given
    the fencing deadline?*, *is the deadline past?*. They read time only
    through a :class:`Clock`, so unit tests can drive those decisions with a
    :class:`ManualClock` (against a real etcd) instead of waiting for real
    seconds to pass.

Invariants
    * :meth:`Clock.monotonic` never goes backwards.
    * All deadlines handed between components (lease fencing deadline,
      reconcile deadline) are in the domain of the *same* clock instance; the
      production default :data:`MONOTONIC` is ``time.monotonic``.
    * :class:`ManualClock` only moves when told to (:meth:`ManualClock.advance`
      or :meth:`ManualClock.set`); moving it backwards is a ``ValueError``.

Concurrency model
    :data:`MONOTONIC` is stateless. :class:`ManualClock` guards its value with
    a lock, so any thread may read or advance it.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Something that tells monotonic time in seconds."""

    def monotonic(self) -> float:
        """Seconds since an arbitrary fixed origin; never decreases."""
        ...


class SystemClock:
    """The real clock: ``time.monotonic()``."""

    def monotonic(self) -> float:
        return time.monotonic()


MONOTONIC: Clock = SystemClock()
"""The production clock every component uses unless a test injects another."""


class ManualClock:
    """A clock that moves only when a test moves it (starts at ``start``)."""

    def __init__(self, start: float = 1000.0) -> None:
        self._lock = threading.Lock()
        self._now = start

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (>= 0); return the new time."""
        if seconds < 0:
            raise ValueError(f"a monotonic clock cannot go back ({seconds}s)")
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, when: float) -> None:
        """Jump to ``when`` (not before the current time)."""
        with self._lock:
            if when < self._now:
                raise ValueError(f"a monotonic clock cannot go back ({when} < {self._now})")
            self._now = when
