"""What an external controller may see and write now: the endpoint's serving periods, open watches and writes.

Purpose
    :class:`ServingState` is the endpoint's bookkeeping, fed by the shard
    instance's callbacks (``on_epoch``, ``on_allowed``, ``on_token``) and
    read by the instance (``synced``, ``drained``) and by the relay:

    * the *allowed* range of the instance as a ``shardSelector`` per rule
      (:meth:`served_selector`; ``None`` while it may serve nothing);
    * serving periods: every reset (range change, unlock, stop) ends one,
      cuts every open watch (:meth:`reset_watches`) and forgets the
      resourceVersions handed out in it, so a watch may only resume from
      a list or event of the period it is in (:meth:`fresh`);
    * the owner token writes carry, and how many writes are in flight
      (:meth:`write`), for the drain.

Invariants
    * After :meth:`reset_watches` returns, no open watch relays anything
      more of the range served before: a watch's events are written under
      the same lock as the cut (:meth:`deliver`), and a watch registered
      with an older period is cut at once (:meth:`register`).
    * At most :data:`ISSUED_MAX` resourceVersions are remembered per period.

Concurrency model
    Called from the shard instance's state-machine thread and the endpoint's
    event loop thread; every field is read and written under ``_lock``,
    held only for short, non-blocking steps.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol

from hashing import HashRange, ShardBy, range_to_selector
from rangeshard.core.ownertoken import OwnerToken

log = logging.getLogger(__name__)

#: How many resourceVersions handed to the controller are remembered per serving period.
ISSUED_MAX = 65536


class Shard(Protocol):
    """What the state reads of its shard instance (:class:`controller_manager.sharding.ShardInstance`)."""

    @property
    def allowed(self) -> HashRange | None: ...

    @property
    def epoch(self) -> int: ...

    def write_fenced(self, token: OwnerToken | None, stale_epoch: bool) -> bool:
        """A write made with ``token`` was fenced (``stale_epoch``: take a fresh epoch); True the first time."""
        ...


class Watch(Protocol):
    """An open watch of a ``shard`` resource."""

    reset: bool

    def cut(self) -> None:
        """End the relay now (from any thread); ``reset`` is already true."""


class ServingState:
    """The serving-period bookkeeping of one endpoint (see module docstring)."""

    def __init__(
        self,
        name: str,
        shard: Shard,
        rules: Mapping[str, ShardBy],
        drain_seconds: float,
        paths: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.shard = shard
        #: The shard rule of each ``shard`` resource, by ``resource.group`` label.
        self.rules = dict(rules)
        #: The selector path of each ``shard`` resource whose rule has parameters (``root`` with ``via``).
        self.paths = dict(paths or {})
        self.drain_seconds = drain_seconds
        self._lock = threading.Lock()
        self._watches: set[Watch] = set()
        self.token: OwnerToken | None = None
        self.writes_in_flight = 0
        self.cut_at = 0.0
        self.reset_epoch = -1
        self.resets = 0
        self._issued: OrderedDict[str, None] = OrderedDict()

    # -- the shard instance's callbacks (its state-machine thread) -----------------
    def on_epoch(self) -> None:
        """The range or lock changed: cut every watch, remember when (the drain counts from here)."""
        with self._lock:
            self.cut_at = time.monotonic()
        self.reset_watches("the instance's range changed")
        with self._lock:
            self.reset_epoch = self.shard.epoch

    def on_allowed(self) -> None:
        """Processing is allowed on a (new) range: the controller relists to see it."""
        self.reset_watches("the instance may now serve its range")

    def on_token(self, token: OwnerToken) -> None:
        with self._lock:
            self.token = token

    def synced(self, epoch: int) -> bool:
        with self._lock:
            return self.reset_epoch >= epoch

    def drained(self) -> bool:
        with self._lock:
            return self.writes_in_flight == 0 and time.monotonic() - self.cut_at >= self.drain_seconds

    # -- serving periods -----------------------------------------------------------
    def served_selector(self, rule: ShardBy, path: str | None = None) -> str | None:
        """The shardSelector of what the instance serves now by ``rule`` (``None``: nothing).

        ``path`` is the rule's selector path when it has parameters (``root`` through its ``via`` kinds).
        """
        allowed = self.shard.allowed
        return range_to_selector(allowed, path or rule.path) if allowed is not None else None

    def generation(self) -> int:
        """The serving period: bumped by every reset (a request records it before it picks its selector)."""
        with self._lock:
            return self.resets

    def issued(self, resource_version: str, generation: int) -> None:
        """The controller got ``resource_version`` (a list's) in serving period ``generation``.

        Ignored when a reset came in between: the answer was cut to the range served before it.
        """
        with self._lock:
            self._remember((resource_version,), generation)

    def _remember(self, resource_versions: Iterable[str], generation: int) -> None:
        if generation != self.resets:
            return
        issued = self._issued
        for rv in resource_versions:
            if rv:
                issued[rv] = None
                issued.move_to_end(rv)
        while len(issued) > ISSUED_MAX:
            issued.popitem(last=False)

    def fresh(self, resource_version: str) -> bool:
        """Whether a watch from ``resource_version`` resumes state of the range served now.

        A list made before a range change and a watch started after it would
        otherwise miss every object that moved in between (the watch only
        sends changes): such a watch is answered ``410 Expired`` and the
        client relists. ``""`` and ``"0"`` carry no state.
        """
        if resource_version in ("", "0"):
            return True
        with self._lock:
            return resource_version in self._issued

    def reset_watches(self, why: str) -> None:
        with self._lock:
            watches, self._watches = list(self._watches), set()
            self.resets += 1
            self._issued.clear()
            for w in watches:
                w.reset = True
        if watches:
            log.info("%s: resetting %s watch(es): %s", self.name, len(watches), why)
        for w in watches:
            w.cut()

    # -- watches and writes ----------------------------------------------------------
    def register(self, watch: Watch, generation: int) -> None:
        """Track an open watch; one whose request began before the last reset is cut at once.

        A reset between the request's freshness check and this registration
        (e.g. the instance was unlocked: the check saw the locked period's
        empty list as fresh, the selector the new range) would otherwise leave
        a watch that resumes from a list of another range and is never cut.
        """
        with self._lock:
            current = generation == self.resets
            if current:
                self._watches.add(watch)
            else:
                watch.reset = True
        if not current:
            log.info("%s: a watch opened across a reset: cut at once (the controller relists)", self.name)
            watch.cut()

    def forget(self, watch: Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def deliver(self, watch: Watch, generation: int, resource_versions: list[str], send: Callable[[], None]) -> bool:
        """``send`` a watch's events and remember their resourceVersions, unless it was cut (then ``False``)."""
        with self._lock:
            if watch.reset:
                return False
            self._remember(resource_versions, generation)
            send()
            return True

    @contextlib.contextmanager
    def write(self) -> Iterator[OwnerToken | None]:
        """A write to a ``shard`` resource in flight; yields the token it carries (``None`` before the first)."""
        with self._lock:
            self.writes_in_flight += 1
            token = self.token
        try:
            yield token
        finally:
            with self._lock:
                self.writes_in_flight -= 1
