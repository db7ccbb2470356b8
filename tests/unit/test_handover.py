"""The handover's decisions without processes: controller_manager.handover.

* :func:`decide` on every kind of view: fencing, rejoining, a new range
  (never allowed on the same view), locked receivers, the giver's drain
  (unlock only when drained and nothing in flight outside), and the states.
* :func:`serving_steps`: dependents before owners when a range grows, owners
  first when it shrinks, chains by rank, a shrink-and-grow in one change, and
  the property that no resource is widened before every higher rank has its
  final range nor narrowed before every lower rank was narrowed (hypothesis).
* :class:`Step`: complete when every reader it cut re-established, bounded.
* The transitions the state machine may make, as drawn.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller_manager.handover import (
    TRANSITIONS,
    Allow,
    DrainWait,
    Fence,
    Phase,
    Receiver,
    Rejoin,
    SelfUnlock,
    SetState,
    Step,
    TakeRange,
    Unfence,
    Unlock,
    View,
    allowed_transition,
    decide,
    intersect,
    rank,
    serving_steps,
)
from hashing import MAX_HASH, HashRange, ShardBy

FULL = HashRange.full()
LOW, HIGH = FULL.split()
R = Receiver("b", 42)


def test_fencing_and_rejoining_come_first() -> None:
    assert decide(View(lease_lost=True, allowed=True)) == [Fence("lease lost"), Rejoin()]
    assert decide(View(deadline_passed=True)) == [Fence("lease could not be renewed before the fencing deadline")]
    assert decide(View(current=False, range=FULL)) == [], "a snapshot older than our join says nothing"
    assert decide(View(registered=False)) == [Fence("our registry record is gone"), Rejoin()]


def test_a_new_range_is_taken_and_processing_waits_for_the_next_view() -> None:
    view = View(range=FULL, held_range=None, revision=7, synced=True)
    assert decide(view) == [TakeRange(FULL, False, 7)], "no Allow on the view that starts the epoch"
    settled = View(range=FULL, held_range=FULL, synced=True)
    assert decide(settled) == [Allow(FULL), SetState(Phase.ACTIVE)]
    assert decide(View(range=FULL, held_range=FULL, synced=False)) == [], "not synced: wait"
    assert decide(View(range=FULL, held_range=FULL, allowed=True)) == [SetState(Phase.ACTIVE)]
    assert decide(View(range=FULL, held_range=FULL, synced=True, leaving=True)) == [], "leaving: nothing new"


def test_an_unfence_is_a_new_epoch() -> None:
    actions = decide(View(fenced=True, range=FULL, held_range=FULL, synced=True))
    assert actions == [Unfence()]


def test_a_locked_receiver_waits_and_unlocks_itself_only_when_its_giver_is_gone() -> None:
    waiting = View(range=LOW, held_range=LOW, locked=True, held_locked=True, giver_present=True, synced=True)
    assert decide(waiting) == [SetState(Phase.LOCKED)], "locked: never allowed, even when synced"
    orphaned = View(range=LOW, held_range=LOW, locked=True, held_locked=True, giver_present=False)
    assert decide(orphaned) == [SetState(Phase.LOCKED), SelfUnlock()]
    unlocked = View(range=LOW, held_range=LOW, locked=False, held_locked=True, revision=9)
    assert decide(unlocked) == [TakeRange(LOW, False, 9)]


def test_a_giver_unlocks_only_when_drained_and_nothing_in_flight_is_outside() -> None:
    base = View(range=HIGH, held_range=HIGH, receivers=(R,), allowed=True)
    assert decide(base) == [SetState(Phase.WAIT), Unlock((R,))]
    outside = View(range=HIGH, held_range=HIGH, receivers=(R,), allowed=True, inflight_outside=True)
    assert decide(outside) == [SetState(Phase.WAIT), DrainWait()]
    undrained = View(range=HIGH, held_range=HIGH, receivers=(R,), allowed=True, drained=False)
    assert decide(undrained) == [SetState(Phase.WAIT), DrainWait()]
    shrinking = View(range=HIGH, held_range=FULL, receivers=(R,), allowed=True, revision=3)
    assert decide(shrinking) == [TakeRange(HIGH, False, 3), SetState(Phase.WAIT), DrainWait()], (
        "never unlock on the view that shrinks the range: the host's drain is measured at the old epoch"
    )
    resumed = View(range=HIGH, held_range=HIGH, receivers=(R,), synced=True)
    assert decide(resumed) == [SetState(Phase.WAIT), Unlock((R,)), Allow(HIGH)], "still WAIT while receivers wait"


def test_the_transitions_drawn_are_the_ones_allowed() -> None:
    assert allowed_transition("init", "active") and allowed_transition("locked", "active")
    assert allowed_transition("active", "wait") and allowed_transition("wait", "active")
    assert allowed_transition("active", "fenced") and allowed_transition("fenced", "active")
    assert not allowed_transition("parked", "active"), "parked is final"
    assert not allowed_transition("active", "init-ish")
    assert all(new is not Phase.INIT or old is not Phase.INIT for old, new in TRANSITIONS)


# -- the order of a range change ---------------------------------------------------------------------------

RS_CONTROLLER = {"replicasets.apps": rank(ShardBy.UID), "pods": rank(ShardBy.OWNER)}
DEPLOY_CONTROLLER = {
    "deployments.apps": rank(ShardBy.UID),
    "replicasets.apps": rank(ShardBy.OWNER),
    "pods": rank(ShardBy.ROOT, ["replicasets.apps"]),
}


def test_ranks() -> None:
    assert rank(ShardBy.UID) == rank(ShardBy.NAMESPACE) == 0
    assert rank(ShardBy.OWNER) == 1 and rank(ShardBy.ROOT) == 1 and rank(ShardBy.ROOT, ["a", "b"]) == 3
    assert intersect(LOW, HIGH) is None and intersect(FULL, LOW) == LOW and intersect(None, FULL) is None


def test_a_join_brings_pods_before_their_replicasets() -> None:
    served = dict.fromkeys(RS_CONTROLLER, None)
    assert serving_steps(served, LOW, RS_CONTROLLER) == [{"pods": LOW}, {"replicasets.apps": LOW}]


def test_a_giver_lets_its_replicasets_go_before_their_pods() -> None:
    served = dict.fromkeys(RS_CONTROLLER, FULL)
    assert serving_steps(served, HIGH, RS_CONTROLLER) == [{"replicasets.apps": HIGH}, {"pods": HIGH}]


def test_chains_follow_the_ranks() -> None:
    grow = serving_steps(dict.fromkeys(DEPLOY_CONTROLLER, HIGH), FULL, DEPLOY_CONTROLLER)
    assert grow == [{"pods": FULL}, {"replicasets.apps": FULL}, {"deployments.apps": FULL}]
    shrink = serving_steps(dict.fromkeys(DEPLOY_CONTROLLER, FULL), None, DEPLOY_CONTROLLER)
    assert shrink == [{"deployments.apps": None}, {"replicasets.apps": None}, {"pods": None}]


def test_a_change_that_shrinks_and_grows_shrinks_first() -> None:
    old = HashRange(0, 100)
    new = HashRange(50, 200)
    steps = serving_steps(dict.fromkeys(RS_CONTROLLER, old), new, RS_CONTROLLER)
    kept = HashRange(50, 100)
    assert steps == [{"replicasets.apps": kept}, {"pods": new}, {"replicasets.apps": new}]


def test_a_locked_instance_only_narrows() -> None:
    old, new = HashRange(0, 100), HashRange(50, 200)
    steps = serving_steps(dict.fromkeys(RS_CONTROLLER, old), new, RS_CONTROLLER, grow=False)
    assert steps == [{"replicasets.apps": HashRange(50, 100)}, {"pods": HashRange(50, 100)}]
    assert serving_steps(dict.fromkeys(RS_CONTROLLER, None), LOW, RS_CONTROLLER, grow=False) == []


def test_nothing_to_do_is_no_step() -> None:
    assert serving_steps(dict.fromkeys(RS_CONTROLLER, LOW), LOW, RS_CONTROLLER) == []
    assert serving_steps({}, LOW, {}) == []


ranges = st.one_of(
    st.none(),
    st.tuples(st.integers(0, 1000), st.integers(0, 1000)).map(lambda t: HashRange(min(t), max(t))),
)


@given(
    served=st.lists(ranges, min_size=3, max_size=3),
    target=ranges,
    levels=st.lists(st.integers(0, 3), min_size=3, max_size=3),
)
def test_steps_never_widen_before_higher_ranks_nor_narrow_before_lower_ones(
    served: list[HashRange | None], target: HashRange | None, levels: list[int]
) -> None:
    labels = ["a", "b", "c"]
    ranks = dict(zip(labels, levels, strict=True))
    now = dict(zip(labels, served, strict=True))
    for targets in serving_steps(now, target, ranks):
        for label, new in targets.items():
            old = now[label]
            grows = new is not None and (old is None or new.lo < old.lo or new.hi > old.hi)
            if grows:  # every higher rank already has its final range
                assert all(now[o] == target for o in labels if ranks[o] > ranks[label])
            else:  # a narrowing: every lower rank was narrowed to what it keeps
                assert all(now[o] == intersect(now[o], target) for o in labels if ranks[o] < ranks[label])
            now[label] = new
    assert now == dict.fromkeys(labels, target)


def test_a_step_is_complete_when_every_reader_came_back_or_its_time_ran_out() -> None:
    step = Step({"pods": LOW}, started=10.0, needed={"pods": 2})
    assert not step.complete() and step.waiting_for() == ["pods"]
    step.taken_in("pods")
    step.taken_in("configmaps")  # not part of the step
    assert not step.complete()
    step.taken_in("pods")
    assert step.complete() and step.waiting_for() == []
    assert Step({}, 0.0).complete(), "a step nobody reads is taken in at once"
    assert not step.timed_out(19.9, 10.0) and step.timed_out(20.0, 10.0)
    assert not step.settled(11.0, 1.0) and step.taken_at == 11.0, "the settle time counts from the first look"
    assert not step.settled(11.9, 1.0) and step.settled(12.0, 1.0)
    assert Step({}, 0.0).settled(0.0, 5.0), "nothing read: nothing to settle"
    assert not Step({"pods": LOW}, 0.0, needed={"pods": 1}).settled(99.0, 0.0), "not taken in: not settled"


@pytest.mark.parametrize("target", [None, LOW, FULL, HashRange(5, MAX_HASH)])
def test_steps_end_at_the_target(target: HashRange | None) -> None:
    now: dict[str, HashRange | None] = dict.fromkeys(DEPLOY_CONTROLLER, HashRange(3, 77))
    for targets in serving_steps(now, target, DEPLOY_CONTROLLER):
        now.update(targets)
    assert set(now.values()) == {target}
