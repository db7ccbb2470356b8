"""The manager's watchdog: a built-in controller that stops working without exiting is named, then restarted.

Purpose
    The registry sees a lease being renewed, not work being done (issue 38). A
    worker wedged in a reconcile (a deadlock, a call without a timeout) or an
    informer whose open watch brings nothing any more (a blocked event
    handler, a black-holed connection) leaves the instance ``active`` while
    its range goes unserved. :class:`Watchdog` looks at every built-in
    controller of the manager every :data:`TICK_SECONDS` and calls it *stuck*
    while

    * ``watchdog.reconcileTimeouts`` reconciles in a row outlived their
      timeout (ended by it, or returned at or after their deadline) with no
      other result between (:class:`ReconcileTracker`), or one reconcile is
      still running :data:`HANG_GRACE_SECONDS` past its deadline;
    * an informer has a watch open that brought no event and no bookmark for
      ``watchdog.informerSilenceSeconds`` (the proxy bookmarks quiet watches).

    A stuck controller makes the manager not ready (``/readyz`` answers 503
    and names it, ``rangeshard_controller_stuck{controller}`` is 1); one stuck
    for ``watchdog.exitAfterSeconds`` (> 0) makes :meth:`Watchdog.expired`
    say why, and the manager leaves the registry and exits 1 so that its
    supervisor restarts it (:meth:`ControllerManager.run_until_signal`).

State machine of one controller (logged: WARNING when it becomes stuck or its
reasons change, INFO when it recovers, ERROR when it expires)::

    ok ──(a reason holds)──► stuck (not ready; /readyz names it)
    stuck ──(no reason holds any more)──► ok
    stuck ──(stuck for exitAfterSeconds > 0)──► expired (the manager leaves the registry and exits 1)

Invariants
    * A tick that comes much later than due (the whole process was paused,
      e.g. SIGSTOP) judges nothing, and silences are measured from the end of
      the pause at most: the pause's silence is not the informer's.
    * Only built-in controllers are watched; external ones have their liveness
      probe and the proxy's progress metrics.

Concurrency model
    One named daemon thread (``watchdog``). Workers update their
    :class:`ReconcileTracker` under its lock; informers publish their last
    receipt time as plain float assignments. Readers (``/readyz``, the
    manager's main loop) take the watchdog's lock for a copy of its state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from rangeshard.core.loops import join_thread, start_thread

log = logging.getLogger(__name__)


class WatchdogSettings(Protocol):
    """The bounds of the watchdog (the config's ``watchdog`` section satisfies it; no import of the config)."""

    @property
    def reconcile_timeouts(self) -> int: ...

    @property
    def informer_silence_seconds(self) -> float: ...

    @property
    def exit_after_seconds(self) -> float: ...


#: Seconds between checks.
TICK_SECONDS = 0.5
#: A reconcile still running this long past its deadline makes its controller stuck at once.
HANG_GRACE_SECONDS = 1.0
#: A tick later than this many ticks is a paused process: it judges nothing.
PAUSE_TICKS = 6


class ReconcileTracker:
    """What the workers of one controller are doing, and how its last reconciles ended (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: worker thread name -> (key, deadline in ``time.monotonic()`` terms)
        self._running: dict[str, tuple[str, float]] = {}
        self.outlived_in_a_row = 0
        self.last_outlived: str | None = None

    def begin(self, worker: str, key: str, deadline: float) -> None:
        with self._lock:
            self._running[worker] = (key, deadline)

    def end(self, worker: str, key: str, outlived: bool) -> None:
        """A reconcile ended; ``outlived``: by its timeout, or at/after its deadline."""
        with self._lock:
            self._running.pop(worker, None)
            if outlived:
                self.outlived_in_a_row += 1
                self.last_outlived = key
            else:
                self.outlived_in_a_row = 0

    def running(self) -> dict[str, tuple[str, float]]:
        with self._lock:
            return dict(self._running)

    def streak(self) -> tuple[int, str | None]:
        with self._lock:
            return self.outlived_in_a_row, self.last_outlived


class WatchedInformer(Protocol):
    name: str

    def silence(self, now: float) -> float | None:
        """Seconds since the open watch last brought anything; ``None`` when no watch is open."""


class Watched(Protocol):
    """What the watchdog reads of a built-in controller (:class:`controller_manager.controller.ControllerRuntime`)."""

    name: str
    reconciles: ReconcileTracker

    @property
    def watched_informers(self) -> Sequence[WatchedInformer]: ...


def stuck_reasons(rt: Watched, settings: WatchdogSettings, now: float, resumed_at: float | None = None) -> list[str]:
    """Why ``rt`` is stuck at ``now`` (``time.monotonic()``); empty when it is not.

    ``resumed_at``: when the process last resumed from a pause; a silence counts from then at most.
    """
    reasons: list[str] = []
    for worker, (key, deadline) in sorted(rt.reconciles.running().items()):
        if now > deadline + HANG_GRACE_SECONDS:
            reasons.append(f"worker {worker} is still reconciling {key} {now - deadline:.1f}s past its deadline")
    count, last = rt.reconciles.streak()
    if count >= settings.reconcile_timeouts:
        reasons.append(f"{count} reconciles in a row outlived their timeout (the last: {last})")
    for inf in rt.watched_informers:
        quiet = inf.silence(now)
        if quiet is not None and resumed_at is not None:
            quiet = min(quiet, now - resumed_at)
        if quiet is not None and quiet > settings.informer_silence_seconds:
            reasons.append(
                f"informer {inf.name}: its open watch brought no event and no bookmark for {quiet:.0f}s "
                f"(informerSilenceSeconds {settings.informer_silence_seconds:g})"
            )
    return reasons


class Watchdog:
    """Judges every built-in controller of a manager every :data:`TICK_SECONDS` (see module docstring)."""

    def __init__(
        self,
        settings: WatchdogSettings,
        runtimes: Sequence[Watched],
        *,
        on_stuck: Callable[[str, bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        tick: float = TICK_SECONDS,
    ) -> None:
        self.settings = settings
        self.runtimes = list(runtimes)
        self.on_stuck = on_stuck
        self.clock = clock
        self.tick = tick
        self._lock = threading.Lock()
        self._reasons: dict[str, list[str]] = {}
        self._since: dict[str, float] = {}
        self._expired: str | None = None
        self._last_tick: float | None = None
        self._resumed_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.runtimes:
            self._thread = start_thread("watchdog", self._run, what="watchdog")

    def stop(self) -> None:
        self._stop.set()
        join_thread(self._thread, self.tick + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            self.check()

    # -- judging --
    def check(self) -> None:
        """One tick: judge every controller (also called by tests)."""
        now = self.clock()
        last, self._last_tick = self._last_tick, now
        if last is not None and now - last > PAUSE_TICKS * self.tick:
            log.info("watchdog: %.1fs since the last check (the process was paused): judging nothing now", now - last)
            self._resumed_at = now
            return
        for rt in self.runtimes:
            self._judge(rt.name, stuck_reasons(rt, self.settings, now, self._resumed_at), now)

    def _judge(self, name: str, reasons: list[str], now: float) -> None:
        with self._lock:
            before = self._reasons.get(name, [])
            if reasons:
                self._reasons[name] = reasons
                since = self._since.setdefault(name, now)
            else:
                self._reasons.pop(name, None)
                since = self._since.pop(name, now)
        if reasons and [_kind(r) for r in reasons] != [_kind(r) for r in before]:
            log.warning("%s: stuck (not ready): %s", name, "; ".join(reasons))
            if self.on_stuck is not None and not before:
                self.on_stuck(name, True)
        elif not reasons and before:
            log.info("%s: no longer stuck after %.1fs", name, now - since)
            if self.on_stuck is not None:
                self.on_stuck(name, False)
        bound = self.settings.exit_after_seconds
        if reasons and bound > 0 and now - since >= bound:
            with self._lock:
                first = self._expired is None
                if first:
                    self._expired = (
                        f"{name}: stuck for {now - since:.0f}s (watchdog.exitAfterSeconds {bound:g}): "
                        f"{'; '.join(reasons)}; leaving the registry and exiting for the supervisor to restart "
                        "the manager"
                    )
            if first:
                log.error("%s", self._expired)

    # -- reading --
    def reasons(self) -> dict[str, list[str]]:
        """``controller -> why it is stuck`` for every stuck controller."""
        with self._lock:
            return {k: list(v) for k, v in self._reasons.items()}

    def expired(self) -> str | None:
        """Why the manager must leave and exit (a controller stuck past ``exitAfterSeconds``), if so."""
        with self._lock:
            return self._expired


def _kind(reason: str) -> str:
    """A reason without its changing numbers (so a growing silence is not logged every tick)."""
    return "".join(c for c in reason if not c.isdigit() and c != ".")
