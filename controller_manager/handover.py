"""The handover's decisions, without I/O: instance states, their transitions, and the order of a range change.

Purpose
    Kazoo's partitioner recipe is the model: what one shard instance does
    next is a pure function of what it sees. :func:`decide` maps a
    :class:`View` (the registry snapshot as it concerns this instance, plus
    the local facts: in-flight work, drained, synced) to a list of actions;
    :class:`controller_manager.sharding.ShardInstance` reads the view and
    carries the actions out (etcd writes, epochs, callbacks) for both the
    in-process and the external runtime. :func:`serving_steps` and
    :class:`Step` decide in which order the caches of a controller see a
    range change and when a step counts as taken in; the external endpoint's
    serving state (:mod:`controller_manager.external.serving`) drives them.

States and transitions (:class:`Phase`; ``state`` of the registry record, plus the local ``fenced``)::

    init ──(first instance; caches synced)──────────────────────► active
    init ──(joined by splitting a busy range)───────────────────► locked
    locked ──(unlocked by giver, or giver gone; caches synced)───► active
    active ──(a receiver names us as giver)─────────────────────► wait
    wait ──(drained: no in-flight key outside our range; receivers unlocked)► active
    any ──(fencing deadline passed / record gone / lease lost)──► fenced
    fenced ──(lease renewed, record intact)──────────────────────► the state the record says
    fenced ──(rejoin)──► init | locked
    any ──(graceful stop with rejoinGraceSeconds, drained)──────► parked (final)

The order of a range change (dependents before owners)
    Every ``shard`` resource has a *rank*: how many controller-owner levels
    below the top its rule places it (``uid``, ``namespace``, ``label``: 0;
    ``owner``: 1; ``root`` through ``via`` kinds: 1 + len(via)). When a
    range grows, the objects of higher rank reach the controller first, so
    an owner never arrives before its dependents (a ReplicaSet never meets
    an empty pod cache); when it shrinks, the objects of rank 0 leave
    first, so the controller is never left with an owner whose dependents
    are gone. A change that both shrinks and grows first shrinks every rank
    to the part kept (ascending), then grows it (descending). A step is
    taken in when every watch it cut was replaced by one opened after a new
    list (client-go: list answered, store replaced, watch opened), a
    streaming list's initial-events-end bookmark was sent, or its bounded
    wait ran out (logged); the next step follows once the controller had a
    settle time to process what it relisted (kopf fills its indexes in
    per-object workers after the list arrived).

Invariants
    * :func:`decide` never both starts a new epoch and allows processing in
      one call: processing is allowed only on a view whose ``synced`` was
      measured at the current epoch.
    * A locked instance is given nothing new (``Allow`` needs unlocked);
      a giver unlocks only when ``drained`` and nothing in flight is outside
      its new range.
    * :func:`serving_steps` never widens a resource before every resource of
      a higher rank has its final range, and never narrows one before every
      resource of a lower rank was narrowed.

Concurrency model
    None: plain functions and values. :class:`Step` is mutable and owned by
    whoever holds it (the serving state, under its lock).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hashing import HashRange, ShardBy


class Phase(enum.StrEnum):
    """The states of one instance (``fenced`` is local: never published; ``parked`` is final)."""

    INIT = "init"
    LOCKED = "locked"
    WAIT = "wait"
    ACTIVE = "active"
    FENCED = "fenced"
    PARKED = "parked"


_P = Phase
#: Every transition the state machine makes (the module docstring draws them).
TRANSITIONS: frozenset[tuple[Phase, Phase]] = frozenset(
    {
        (_P.INIT, _P.ACTIVE),
        (_P.INIT, _P.LOCKED),
        (_P.INIT, _P.WAIT),
        (_P.LOCKED, _P.ACTIVE),
        (_P.LOCKED, _P.WAIT),
        (_P.ACTIVE, _P.WAIT),
        (_P.ACTIVE, _P.LOCKED),
        (_P.WAIT, _P.ACTIVE),
        (_P.WAIT, _P.LOCKED),
        *((p, _P.FENCED) for p in (_P.INIT, _P.LOCKED, _P.WAIT, _P.ACTIVE)),
        *((_P.FENCED, p) for p in (_P.INIT, _P.LOCKED, _P.WAIT, _P.ACTIVE)),
        *((p, _P.PARKED) for p in (_P.INIT, _P.LOCKED, _P.WAIT, _P.ACTIVE)),
        # A rejoin (lease lost) publishes a fresh record: init or locked again.
        *((p, q) for p in (_P.LOCKED, _P.WAIT, _P.ACTIVE) for q in (_P.INIT,)),
    }
)


def allowed_transition(old: str, new: str) -> bool:
    """Whether ``old -> new`` is one of :data:`TRANSITIONS` (unknown names: no)."""
    try:
        return (Phase(old), Phase(new)) in TRANSITIONS
    except ValueError:
        return False


# -- the state machine's decisions -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Receiver:
    """A locked instance naming us as its giver, as the snapshot saw it."""

    instance_id: str
    mod_revision: int


@dataclass(frozen=True, slots=True)
class View:
    """What one evaluation of the state machine sees (registry facts, then local facts)."""

    #: The lease is gone for good (etcd said so): rejoin.
    lease_lost: bool = False
    #: The fencing deadline (last good keepalive + TTL - margin) has passed.
    deadline_passed: bool = False
    #: A registry snapshot at or after our join revision is at hand.
    current: bool = True
    #: Our record is in that snapshot, with our lease.
    registered: bool = True
    range: HashRange | None = None
    locked: bool = False
    #: Our record's giver is still registered and not parked (a locked instance waits for it).
    giver_present: bool = False
    receivers: tuple[Receiver, ...] = ()
    revision: int = 0
    # -- local facts --
    fenced: bool = False
    #: The range and lock state this instance works with now (changed only by ``TakeRange``).
    held_range: HashRange | None = None
    held_locked: bool = False
    #: Processing is allowed now (``ShardInstance.allowed`` is set).
    allowed: bool = False
    leaving: bool = False
    #: Some reconcile in flight is outside ``range``.
    inflight_outside: bool = False
    #: The host's extra drain condition (an external controller: views cut, no write in flight, drainSeconds).
    drained: bool = True
    #: Every cache was taken in at the current epoch.
    synced: bool = False
    #: The epoch ``synced`` was measured at (``Allow`` applies only if it is still current).
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class Fence:
    why: str


@dataclass(frozen=True, slots=True)
class Rejoin:
    """Register again with a fresh lease (after the running reconciles ended)."""


@dataclass(frozen=True, slots=True)
class Unfence:
    """The lease is renewed and the record intact: processing may resume after a relist (a new epoch)."""


@dataclass(frozen=True, slots=True)
class TakeRange:
    """Work with ``range``/``locked`` from now: a new owner token (epoch ``revision``) and a new epoch."""

    range: HashRange | None
    locked: bool
    revision: int


@dataclass(frozen=True, slots=True)
class SetState:
    phase: Phase


@dataclass(frozen=True, slots=True)
class SelfUnlock:
    """Locked, and the giver is gone (or parked after draining): unlock ourselves, guarded by its absence."""


@dataclass(frozen=True, slots=True)
class Unlock:
    """Drained: release these receivers (each guarded by the mod revision we saw)."""

    receivers: tuple[Receiver, ...]


@dataclass(frozen=True, slots=True)
class DrainWait:
    """Receivers wait for us: something in flight is outside our range, or the host is not drained yet."""


@dataclass(frozen=True, slots=True)
class Allow:
    """Every cache was taken in at this epoch: process ``range``."""

    range: HashRange


Action = Fence | Rejoin | Unfence | TakeRange | SetState | SelfUnlock | Unlock | DrainWait | Allow


def decide(view: View) -> list[Action]:
    """The actions for ``view``, in the order they are to be carried out (see the module docstring)."""
    if view.lease_lost:
        return [Fence("lease lost"), Rejoin()]
    if view.deadline_passed:
        return [Fence("lease could not be renewed before the fencing deadline")]
    if not view.current:
        return []
    if not view.registered:
        return [Fence("our registry record is gone"), Rejoin()]
    actions: list[Action] = []
    if view.fenced:
        actions.append(Unfence())
    if view.range != view.held_range or view.locked != view.held_locked:
        actions.append(TakeRange(view.range, view.locked, view.revision))
    new_epoch = bool(actions)
    if view.locked:
        actions.append(SetState(Phase.LOCKED))
        if not view.giver_present:
            actions.append(SelfUnlock())
        return actions
    if view.receivers:
        actions.append(SetState(Phase.WAIT))
        if not view.inflight_outside and view.drained and not new_epoch:
            actions.append(Unlock(view.receivers))
        else:
            actions.append(DrainWait())
    allowed = view.allowed and not new_epoch
    if not new_epoch and not view.allowed and view.range is not None and not view.leaving and view.synced:
        actions.append(Allow(view.range))
        allowed = True
    if not view.receivers and allowed:
        actions.append(SetState(Phase.ACTIVE))
    return actions


# -- the order in which a controller's caches see a range change ---------------------------------------------


def rank(rule: ShardBy, via: Sequence[str] = ()) -> int:
    """How many controller-owner levels below the top ``rule`` places an object (see the module docstring)."""
    if rule is ShardBy.ROOT:
        return 1 + len(via)
    if rule is ShardBy.OWNER:
        return 1
    return 0


def intersect(a: HashRange | None, b: HashRange | None) -> HashRange | None:
    """The keys in both (``None``: none)."""
    if a is None or b is None:
        return None
    lo, hi = max(a.lo, b.lo), min(a.hi, b.hi)
    return HashRange(lo, hi) if lo <= hi else None


#: One step: the resources (by label) whose served range changes, and to what.
Targets = dict[str, HashRange | None]


def serving_steps(
    served: Mapping[str, HashRange | None], target: HashRange | None, ranks: Mapping[str, int], *, grow: bool = True
) -> list[Targets]:
    """The steps that take every resource from ``served`` to ``target`` (dependents before owners).

    Shrink every rank to what it keeps, lowest rank first; then grow every
    rank to ``target``, highest first (not with ``grow=False``: a locked
    instance is never served more than before). Adjacent steps of one rank
    are one step; steps that change nothing are left out.
    """
    kept = {label: intersect(served.get(label), target) for label in ranks}
    levels = sorted(set(ranks.values()))
    raw: list[tuple[int, Targets]] = []
    for level in levels:
        raw.append((level, {lb: kept[lb] for lb, r in ranks.items() if r == level and served.get(lb) != kept[lb]}))
    for level in reversed(levels) if grow else ():
        raw.append((level, {lb: target for lb, r in ranks.items() if r == level and kept[lb] != target}))
    steps: list[tuple[int, Targets]] = []
    for level, targets in raw:
        if not targets:
            continue
        if steps and steps[-1][0] == level:
            steps[-1][1].update(targets)
        else:
            steps.append((level, dict(targets)))
    return [targets for _, targets in steps]


@dataclass(slots=True)
class Step:
    """One applied step and what it waits for: per resource, how many re-established readers it needs."""

    targets: Targets
    started: float
    #: Readers to re-establish per resource (the watches the step cut; at least one if it was ever read).
    needed: dict[str, int] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)
    #: When every reader was back (the settle time counts from here).
    taken_at: float | None = None

    def taken_in(self, label: str) -> None:
        """A reader of ``label`` re-established its view in the step's serving period."""
        if label in self.needed:
            self.done[label] = self.done.get(label, 0) + 1

    def complete(self) -> bool:
        return all(self.done.get(label, 0) >= n for label, n in self.needed.items())

    def settled(self, now: float, settle: float) -> bool:
        """Complete, and ``settle`` seconds passed since (the controller processed what it relisted)."""
        if self.taken_at is None:
            if not self.complete():
                return False
            self.taken_at = now
        return not self.needed or now - self.taken_at >= settle

    def waiting_for(self) -> list[str]:
        """The resources not taken in yet, sorted."""
        return sorted(label for label, n in self.needed.items() if self.done.get(label, 0) < n)

    def timed_out(self, now: float, timeout: float) -> bool:
        return now - self.started >= timeout
