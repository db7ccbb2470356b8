"""What one reconcile is given and may raise: its deadline, client-go's expectations, a requeue, timeouts.

Purpose
    :class:`ReconcileContext` carries a reconcile's deadline (API calls take
    their timeout from it); :class:`Expectations` is client-go's
    ControllerExpectations (creations and deletions in flight per key, until
    seen or expired); :class:`Requeue` asks for the key again;
    :func:`timed_out` says whether an exception is a timeout of the reconcile
    or of an API call. Re-exported by :mod:`controller_manager.controller`.

Invariants
    * :meth:`ReconcileContext.timeout` raises :class:`ReconcileTimeout` once
      less than 50 ms are left: no API call starts that the deadline would cut.

Concurrency model
    :class:`Expectations` is shared by a controller's workers and informer
    threads: every field under its lock. The others belong to one reconcile.
"""

from __future__ import annotations

import threading

import urllib3

from rangeshard.core.clock import MONOTONIC, Clock
from rangeshard.core.errors import ControllerError, ReconcileTimeout


class Requeue(ControllerError):
    """Raise from ``reconcile`` to try the key again after ``after`` seconds (default: rate limited)."""

    def __init__(self, after: float | None = None, reason: str = "") -> None:
        super().__init__(reason or "requeue")
        self.after = after


def timed_out(exc: BaseException) -> str | None:
    """What timed out, if ``exc`` (or what caused it) is a timeout; else ``None``.

    Timeouts are :class:`ReconcileTimeout` (the reconcile's deadline), the
    socket/urllib3 timeouts of an API call given ``ctx.timeout()`` (the
    official client raises urllib3's ``ReadTimeoutError``/``ConnectTimeoutError``,
    possibly inside ``MaxRetryError``) and Python's ``TimeoutError``.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ReconcileTimeout):
            return f"the reconcile deadline ({cur})"
        if isinstance(cur, urllib3.exceptions.TimeoutError | TimeoutError):
            return f"an API call ({type(cur).__name__}: {cur})"
        reason = getattr(cur, "reason", None)  # urllib3's MaxRetryError carries the timeout as .reason
        if isinstance(reason, BaseException) and id(reason) not in seen:
            cur = reason
            continue
        cur = cur.__cause__ or cur.__context__
    return None


class ReconcileContext:
    """Per-reconcile facts: the deadline and a timeout helper for API calls."""

    def __init__(self, key: str, deadline: float, clock: Clock = MONOTONIC) -> None:
        self.key = key
        self.deadline = deadline
        self.clock = clock

    def remaining(self) -> float:
        return self.deadline - self.clock.monotonic()

    def timeout(self) -> float:
        """Seconds an API call may take now; :class:`ReconcileTimeout` if none are left."""
        left = self.remaining()
        if left < 0.05:
            raise ReconcileTimeout(f"{self.key}: reconcile deadline reached")
        return left


class Expectations:
    """client-go ControllerExpectations: creations/deletions in flight per key, until seen or expired."""

    def __init__(self, ttl: float = 10.0, clock: Clock = MONOTONIC) -> None:
        self.ttl = ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[int, int, float]] = {}

    def expect(self, key: str, adds: int = 0, dels: int = 0) -> None:
        with self._lock:
            self._pending[key] = (adds, dels, self.clock.monotonic())

    def observe(self, key: str, adds: int = 0, dels: int = 0) -> None:
        with self._lock:
            cur = self._pending.get(key)
            if cur is not None:
                self._pending[key] = (cur[0] - adds, cur[1] - dels, cur[2])

    def satisfied(self, key: str) -> bool:
        with self._lock:
            cur = self._pending.get(key)
            if cur is None:
                return True
            adds, dels, at = cur
            if (adds <= 0 and dels <= 0) or self.clock.monotonic() - at > self.ttl:
                del self._pending[key]
                return True
            return False

    def forget(self, key: str) -> None:
        with self._lock:
            self._pending.pop(key, None)
