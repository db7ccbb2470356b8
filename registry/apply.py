"""Applying a rebalance plan through the handover protocol, by hand or by the automatic policy.

Purpose
    :func:`apply_plan` moves one boundary at a time with
    :meth:`Registry.set_key`, which locks the receiving instance in the same
    transaction; each move waits until the handover finished (receiver
    unlocked, both sides active) before the next. :class:`AutoPolicy` decides
    when ``rangeshard rebalance auto`` applies a plan.

Invariants
    * Every move is validated against the current keys before it is written
      (:func:`next_move`); a failed or timed-out move leaves the registry
      consistent (the protocol finishes the handover by itself; nothing is
      half-written).

Concurrency model
    A synchronous loop with a deadline per move; called from the CLI thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rangeshard.core.errors import CompareFailed, ConfigError, RegistryError
from registry.models import Member, Snapshot, State
from registry.rebalance import Move, Plan, owned
from registry.registry import Registry

log = logging.getLogger(__name__)

_MAX_MOVE_RACES = 10
"""How many lost races (concurrent registry writes) one :func:`apply_plan` run retries before giving up."""


def handover_done(snap: Snapshot) -> bool:
    """No instance locked and every owner active (or parked: it waits for its own instance, not a handover)."""
    return all(not m.record.is_locked and m.record.state in (State.ACTIVE, State.PARKED) for m in owned(snap))


def wait_settled(registry: Registry, controller_type: str, timeout: float, poll: float = 0.2) -> Snapshot:
    """Wait until every instance of the type is unlocked and active; :class:`RegistryError` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        snap = registry.snapshot(controller_type)
        if handover_done(snap):
            return snap
        if time.monotonic() > deadline:
            busy = [
                f"{m.instance_id} ({m.record.state.value}{', locked' if m.record.is_locked else ''})"
                for m in owned(snap)
                if m.record.is_locked or m.record.state not in (State.ACTIVE, State.PARKED)
            ]
            raise RegistryError(f"{controller_type}: handover not finished after {timeout:.0f}s: {', '.join(busy)}")
        time.sleep(poll)


def wait_republished(registry: Registry, controller_type: str, timeout: float, poll: float = 0.2) -> bool:
    """Wait until every owning instance heartbeated again (its ``workloadNum`` is of its new range).

    ``heartbeatAt`` changes with every heartbeat, which publishes the workload; True
    when all did within ``timeout``, False otherwise (the figures are pending).
    """
    first = {m.instance_id: m.record.heartbeat_at for m in owned(registry.snapshot(controller_type))}
    deadline = time.monotonic() + timeout
    while True:
        now = {m.instance_id: m.record.heartbeat_at for m in owned(registry.snapshot(controller_type))}
        if all(now.get(i) != at for i, at in first.items()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)


def next_move(snap: Snapshot, targets: Sequence[int]) -> Move | None:
    """A move that is valid now (keeps order and non-empty ranges), or ``None`` when all are done."""
    members = owned(snap)
    keys = [m.record.hash_key for m in members]
    if len(targets) != len(members):
        raise CompareFailed(
            f"{snap.controller_type}: membership changed while rebalancing ({len(members)} instances now)"
        )
    pending = [i for i in range(len(members) - 1) if keys[i] != targets[i]]
    for i in pending:
        lo = keys[i - 1] + 1 if i > 0 else 0
        if lo <= targets[i] < keys[i + 1]:
            return Move(members[i].instance_id, keys[i], targets[i])
    if pending:
        raise CompareFailed(f"{snap.controller_type}: no valid order for the remaining moves")
    return None


def apply_plan(
    registry: Registry,
    plan: Plan,
    *,
    timeout: float = 60.0,
    progress: Callable[[int, int, Move], None] | None = None,
    respect_pins: bool = True,
) -> int:
    """Apply ``plan`` one boundary at a time, waiting for each handover; return the moves made.

    A move whose guarded transaction lost a race (a heartbeat or state change
    of the same type landed between its read and its write) is re-planned from
    a fresh settled snapshot, a bounded number of times. A move that would
    change a pinned range is refused (:class:`ConfigError`) unless
    ``respect_pins`` is false (``rebalance isolate`` checked its own plan).
    """
    snap = wait_settled(registry, plan.controller_type, timeout)
    total = len(plan.moves)
    done = 0
    races = 0
    for _ in range(4 * len(plan.targets) + 4 + _MAX_MOVE_RACES):
        move = next_move(snap, plan.targets)
        if move is None:
            return done
        if progress is not None:
            progress(done, total, move)
        try:
            registry.set_key(plan.controller_type, move.instance_id, move.new_key, respect_pins=respect_pins)
        except CompareFailed as e:
            races += 1
            if races > _MAX_MOVE_RACES:
                raise
            log.info("%s: move of %s lost a race (%s); re-reading the registry", plan.controller_type, move, e)
        else:
            done += 1
        snap = wait_settled(registry, plan.controller_type, timeout)
    raise CompareFailed(f"{plan.controller_type}: the plan did not converge")


def set_key_settled(
    registry: Registry, controller_type: str, instance_id: str, new_key: int, timeout: float
) -> tuple[Member, Member | None]:
    """:meth:`Registry.set_key`; a lost race (a heartbeat or a handover of the same type landed between its read and
    its write) is retried once the registry settled again, a bounded number of times. Bad input fails at once."""
    for races in range(_MAX_MOVE_RACES + 1):
        try:
            return registry.set_key(controller_type, instance_id, new_key)
        except CompareFailed as e:
            if races == _MAX_MOVE_RACES:
                raise
            log.info("%s: moving the key of %s lost a race (%s); retrying", controller_type, instance_id, e)
            wait_settled(registry, controller_type, timeout)
    raise CompareFailed(f"{controller_type}: moving the key of {instance_id} kept losing races")  # not reached


@dataclass
class AutoPolicy:
    """When automatic rebalancing acts (threshold with hysteresis, minimum gain).

    It acts when max/mean exceeds ``threshold`` and the plan predicts at least
    ``min_gain`` improvement. After acting it disarms and re-arms only once
    max/mean fell below ``threshold - hysteresis``, so a plan that cannot get
    below the threshold is not retried over and over (no flapping).
    """

    threshold: float = 1.2
    hysteresis: float = 0.05
    min_gain: float = 0.05
    armed: bool = True

    def __post_init__(self) -> None:
        if self.threshold < 1.0 or self.hysteresis < 0 or self.min_gain < 0:
            raise ConfigError("auto: need --threshold >= 1 and --hysteresis, --min-gain >= 0")

    def decide(self, ratio: float, plan: Plan | None) -> str:
        """``"apply"``, or why not: ``"balanced"``, ``"disarmed"``, ``"no-gain"``."""
        if ratio < self.threshold - self.hysteresis:
            self.armed = True
        if ratio <= self.threshold:
            return "balanced"
        if not self.armed:
            return "disarmed"
        if plan is None or not plan.moves or plan.predicted_ratio > ratio - self.min_gain:
            return "no-gain"
        return "apply"

    def applied(self) -> None:
        self.armed = False
