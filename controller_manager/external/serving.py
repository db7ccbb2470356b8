"""What an external controller may see and write now: per resource, the range served, open watches, writes.

Purpose
    :class:`ServingState` is the endpoint's bookkeeping, fed by the shard
    instance's callbacks (``on_epoch``, ``on_fenced``, ``on_leaving``,
    ``on_token``) and read by the instance (``synced``, ``drained``) and by
    the relay:

    * the range each ``shard`` resource is served with now, as a
      ``shardSelector`` (:meth:`served_selector`; ``None`` while nothing is);
    * a range change is carried out in the steps of
      :func:`controller_manager.handover.serving_steps`: objects placed by
      another object reach the controller before their owners, and owners
      leave first. A step resets the watches of the resources it changes
      (each ends with ``ERROR 410``, the controller relists) and the next
      step waits until each was taken in (a watch opened after a new list,
      a streaming list's initial-events-end bookmark sent, or
      ``handoverStepSeconds`` passed: logged) and then ``handoverSettleSeconds``
      (the controller processes what it relisted);
    * serving periods per resource: every reset of a resource ends one,
      cuts its open watches and forgets the resourceVersions handed out in
      it, so a watch may only resume from a list or event of the period it
      is in (:meth:`fresh`); a streaming list (``sendInitialEvents``)
      carries its state and needs no resume point;
    * the highest resourceVersion handed out per resource (:meth:`floor`):
      the endpoint turns the controller's consistent lists into "not older
      than" that, which the proxy serves from its cache;
    * the owner token writes carry, and how many writes are in flight
      (:meth:`write`), for the drain; the highest resourceVersion of the
      controller's successful writes per resource (:meth:`wrote`), which
      the instance publishes for its takers (:mod:`controller_manager.freshness`).

Invariants
    * After a reset of a resource returns, no open watch of it relays
      anything more of the range served before: a watch's events are
      written under the same lock as the cut (:meth:`deliver`), and a watch
      registered with an older period is cut at once (:meth:`register`).
    * While locked, no resource is served more than it was (the plan only
      narrows); a new range is served, rank by rank, only once unlocked.
    * :meth:`synced` is true for an epoch only once every step of its plan
      was applied; :meth:`drained` only once, in addition, no write is in
      flight and ``drainSeconds`` have passed since the last cut.
    * At most :data:`ISSUED_MAX` resourceVersions are remembered per resource.

Concurrency model
    Called from the shard instance's state-machine thread and the endpoint's
    event loop thread; every field is read and written under ``_lock``,
    held only for short, non-blocking steps. Watches are cut outside it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from controller_manager.freshness import WrittenVersions
from controller_manager.handover import Step, Targets, serving_steps
from hashing import HashRange, ShardBy, range_to_selector
from rangeshard.core.ownertoken import OwnerToken

log = logging.getLogger(__name__)

#: How many resourceVersions handed to the controller are remembered per resource and serving period.
ISSUED_MAX = 65536
#: The bound of one step while the instance fences itself or leaves (its lease is running out).
LEAVING_STEP_SECONDS = 2.0


class Shard(Protocol):
    """What the state reads of its shard instance (:class:`controller_manager.sharding.ShardInstance`)."""

    def serving_target(self) -> tuple[int, HashRange | None, bool]:
        """``(epoch, range, locked)``; the range is ``None`` while fenced, leaving or unregistered."""
        ...

    def write_fenced(self, token: OwnerToken | None, stale_epoch: bool) -> bool:
        """A write made with ``token`` was fenced (``stale_epoch``: take a fresh epoch); True the first time."""
        ...

    def floor(self, label: str) -> int:
        """The resourceVersion of ``label`` a list after a range change is not older than (peers' writes)."""
        ...


class Watch(Protocol):
    """An open watch of a ``shard`` resource."""

    reset: bool
    #: The resource (``plural.group`` label) it watches.
    label: str
    #: A streaming list (``sendInitialEvents``): taken in once its initial-events-end bookmark is relayed.
    streaming: bool

    def cut(self) -> None:
        """End the relay now (from any thread); ``reset`` is already true."""


class _Resource:
    """The serving state of one ``shard`` resource (under the state's lock)."""

    __slots__ = ("floor", "generation", "issued", "path", "rank", "read", "rule", "served", "watches", "watches_cut")

    def __init__(self, rule: ShardBy, path: str | None, rank: int) -> None:
        self.rule = rule
        self.path = path
        self.rank = rank
        self.served: HashRange | None = None
        self.generation = 0
        self.issued: OrderedDict[str, None] = OrderedDict()
        self.watches: set[Watch] = set()
        #: The controller read this resource at least once (a step waits for it to read again).
        self.read = False
        #: The highest resourceVersion handed out (lists, events) in any period.
        self.floor = 0
        #: How many open watches the last reset cut.
        self.watches_cut = 0


class ServingState:
    """The serving bookkeeping of one endpoint (see module docstring)."""

    def __init__(
        self,
        name: str,
        shard: Shard,
        rules: Mapping[str, ShardBy],
        drain_seconds: float,
        paths: Mapping[str, str] | None = None,
        *,
        ranks: Mapping[str, int] | None = None,
        step_seconds: float = 10.0,
        settle_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.shard = shard
        #: The shard rule of each ``shard`` resource, by ``resource.group`` label.
        self.rules = dict(rules)
        #: The selector path of each ``shard`` resource whose rule has parameters (``root`` with ``via``).
        self.paths = dict(paths or {})
        self.drain_seconds = drain_seconds
        self.step_seconds = step_seconds
        self.settle_seconds = settle_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._resources = {
            label: _Resource(rule, self.paths.get(label), (ranks or {}).get(label, 0)) for label, rule in rules.items()
        }
        self.token: OwnerToken | None = None
        self.writes_in_flight = 0
        #: The highest resourceVersion of the controller's successful writes per resource (published).
        self.written = WrittenVersions()
        self.cut_at = 0.0
        # The plan of the last range change: its steps still to apply, the one applied, its epoch.
        self._steps: list[Targets] = []
        self._step: Step | None = None
        self._step_bound = step_seconds
        self._plan_epoch = -1
        self._done_epoch = -1
        #: Steps that ran out of time (their wait was bounded), for tests and logs.
        self.steps_timed_out = 0
        self.steps_applied = 0

    # -- the shard instance's callbacks (its state-machine thread) -----------------
    def on_epoch(self) -> None:
        """The range or lock changed: plan the steps to the new target and apply the first."""
        epoch, rng, locked = self.shard.serving_target()
        with self._lock:
            steps = serving_steps(
                {lb: r.served for lb, r in self._resources.items()},
                rng,
                {lb: r.rank for lb, r in self._resources.items()},
                grow=not locked,  # locked: never more than served before, only the part kept
            )
            bound = self.step_seconds if rng is not None else min(self.step_seconds, LEAVING_STEP_SECONDS)
            self._plan(epoch, steps, bound)
        self._advance()

    def on_fenced(self) -> None:
        """Processing stopped (fencing): owners leave first, then their dependents, each step briefly bounded."""
        self.on_epoch()

    def on_leaving(self) -> None:
        """A graceful stop: the views shrink to nothing in order before the lease goes."""
        self.on_epoch()

    def on_allowed(self) -> None:
        """Processing is allowed on the range: every resource already serves it (the plan did)."""

    def on_token(self, token: OwnerToken) -> None:
        with self._lock:
            self.token = token

    def synced(self, epoch: int) -> bool:
        """Every step of the plan of ``epoch`` (or a later one) was applied."""
        self._advance()
        with self._lock:
            return self._done_epoch >= epoch

    def drained(self) -> bool:
        """The plan is done, no write is in flight and ``drainSeconds`` passed since the last cut."""
        self._advance()
        with self._lock:
            return (
                self._done_epoch >= self._plan_epoch
                and self.writes_in_flight == 0
                and self._clock() - self.cut_at >= self.drain_seconds
            )

    # -- the plan ------------------------------------------------------------------------
    def _plan(self, epoch: int, steps: list[Targets], bound: float) -> None:
        """Replace the plan (under the lock); a step in progress is abandoned: the new plan starts from now."""
        self._plan_epoch = epoch
        self._steps = steps
        self._step = None
        self._step_bound = bound

    def _advance(self) -> None:
        """Apply the next steps while the current one is taken in (or ran out of time)."""
        while True:
            cut: list[Watch] = []
            with self._lock:
                step = self._step
                if step is not None:
                    now = self._clock()
                    if step.settled(now, self.settle_seconds if self._steps else 0.0):
                        self._step = None
                    elif step.taken_at is None and step.timed_out(now, self._step_bound):
                        self.steps_timed_out += 1
                        log.warning(
                            "%s: handover step %s not taken in after %.1fs (waiting for %s): going on",
                            self.name,
                            _describe(step.targets),
                            self._step_bound,
                            ", ".join(step.waiting_for()),
                        )
                        self._step = None
                    else:
                        return
                if not self._steps:
                    if self._done_epoch < self._plan_epoch:
                        self._done_epoch = self._plan_epoch
                        log.debug("%s: serving plan of epoch %s done", self.name, self._plan_epoch)
                    return
                targets = self._steps.pop(0)
                self._step = step = Step(targets, self._clock())
                self.steps_applied += 1
                for label, rng in targets.items():
                    res = self._resources[label]
                    res.served = rng
                    cut.extend(self._reset(res))
                    needed = max(res.watches_cut, 1 if res.read else 0)
                    if needed:
                        step.needed[label] = needed
                if cut or step.needed:
                    self.cut_at = self._clock()
            log.info("%s: handover step: %s", self.name, _describe(targets))
            for w in cut:
                w.cut()

    def _reset(self, res: _Resource) -> list[Watch]:
        """End ``res``'s serving period (under the lock): its watches to cut, its issued versions forgotten."""
        watches, res.watches = list(res.watches), set()
        res.generation += 1
        res.issued.clear()
        for w in watches:
            w.reset = True
        res.watches_cut = len(watches)
        return watches

    def reset_watches(self, why: str) -> None:
        """Cut every watch of every resource now (the manager is stopping)."""
        with self._lock:
            watches = [w for res in self._resources.values() for w in self._reset(res)]
        if watches:
            log.info("%s: resetting %s watch(es): %s", self.name, len(watches), why)
        for w in watches:
            w.cut()

    # -- serving periods -----------------------------------------------------------
    def served_selector(self, label: str) -> str | None:
        """The shardSelector of what ``label`` is served with now (``None``: nothing)."""
        with self._lock:
            res = self._resources[label]
            rng = res.served
        return range_to_selector(rng, res.path or res.rule.path) if rng is not None else None

    def served(self, label: str) -> HashRange | None:
        with self._lock:
            return self._resources[label].served

    def generation(self, label: str) -> int:
        """The serving period of ``label``: bumped by every reset (recorded by a request before its selector)."""
        with self._lock:
            return self._resources[label].generation

    def floor(self, label: str) -> int:
        """The highest resourceVersion of ``label`` handed to the controller (0: none yet)."""
        with self._lock:
            return self._resources[label].floor

    def issued(self, label: str, resource_version: str, generation: int) -> None:
        """The controller got ``resource_version`` (a list's) in serving period ``generation``.

        Ignored when a reset came in between: the answer was cut to the range served before it.
        A list of a resource whose reset cut no watch completes its part of the step.
        """
        with self._lock:
            res = self._resources[label]
            res.read = True
            if generation != res.generation:
                return
            self._remember(res, (resource_version,))
            step = self._step
            if step is not None and label in step.needed and not res.watches_cut:
                step.taken_in(label)
        self._advance()

    def _remember(self, res: _Resource, resource_versions: list[str] | tuple[str, ...]) -> None:
        issued = res.issued
        newest = ""
        for rv in resource_versions:
            if rv:
                issued[rv] = None
                issued.move_to_end(rv)
                newest = rv
        if newest.isdigit():  # a batch's versions only grow: its last one is its highest
            res.floor = max(res.floor, int(newest))
        while len(issued) > ISSUED_MAX:
            issued.popitem(last=False)

    def fresh(self, label: str, resource_version: str) -> bool:
        """Whether a watch of ``label`` from ``resource_version`` resumes state of the range served now.

        A list made before a range change and a watch started after it would
        otherwise miss every object that moved in between (the watch only
        sends changes): such a watch is answered ``410 Expired`` and the
        client relists. ``""`` and ``"0"`` carry no state.
        """
        if resource_version in ("", "0"):
            return True
        with self._lock:
            return resource_version in self._resources[label].issued

    # -- watches and writes ----------------------------------------------------------
    def register(self, watch: Watch, generation: int) -> None:
        """Track an open watch; one whose request began before its resource's last reset is cut at once.

        A reset between the request's freshness check and this registration
        (e.g. the instance was unlocked: the check saw the locked period's
        empty list as fresh, the selector the new range) would otherwise leave
        a watch that resumes from a list of another range and is never cut.
        A watch that is not a streaming list completes its part of the step.
        """
        with self._lock:
            res = self._resources[watch.label]
            res.read = True
            current = generation == res.generation
            if current:
                res.watches.add(watch)
                if not watch.streaming and self._step is not None:
                    self._step.taken_in(watch.label)
            else:
                watch.reset = True
        if not current:
            log.info("%s: a watch opened across a reset: cut at once (the controller relists)", self.name)
            watch.cut()
        else:
            self._advance()

    def forget(self, watch: Watch) -> None:
        with self._lock:
            self._resources[watch.label].watches.discard(watch)

    def deliver(
        self,
        watch: Watch,
        generation: int,
        resource_versions: list[str],
        send: Callable[[], None],
        initial_events_end: bool = False,
    ) -> bool:
        """``send`` a watch's events and remember their resourceVersions, unless it was cut (then ``False``).

        ``initial_events_end``: the events end a streaming list's initial state (its bookmark).
        """
        with self._lock:
            if watch.reset:
                return False
            res = self._resources[watch.label]
            if generation == res.generation:
                self._remember(res, resource_versions)
            send()
            ended = initial_events_end and watch.streaming and self._step is not None
            if ended and self._step is not None:
                self._step.taken_in(watch.label)
        if ended:
            self._advance()
        return True

    def wrote(self, label: str, resource_version: int | None) -> None:
        """A write of ``label`` succeeded with ``resource_version`` (before it counts as no longer in flight)."""
        if resource_version is not None:
            self.written.record(label, resource_version)

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


def _describe(targets: Targets) -> str:
    return ", ".join(f"{label} -> {rng if rng is not None else 'nothing'}" for label, rng in sorted(targets.items()))
