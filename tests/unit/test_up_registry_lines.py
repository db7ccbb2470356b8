"""``up`` with stdout not a terminal: one line per registry change (instance, state, range), never whole tables."""

from __future__ import annotations

from hashing import MAX_HASH, HashRange
from rangeshard.cli.up import registry_changes
from registry import RegistryView, Snapshot
from registry.models import InstanceRecord, Member, State


def _member(
    instance: str, key: int, rng: HashRange | None, state: State = State.ACTIVE, giver: str | None = None
) -> Member:
    record = InstanceRecord.model_validate(
        {
            "instanceId": instance,
            "controllerType": "replicaset",
            "hashKey": key,
            "state": state.value,
            "isLocked": giver is not None,
            "giver": giver,
        }
    )
    return Member(record, rng, f"/k/{instance}", 1, 1, 1)


def _view(rev: int, *members: Member) -> RegistryView:
    return RegistryView(rev, {"replicaset": Snapshot("replicaset", rev, members)} if members else {})


def test_each_change_is_one_line_and_nothing_repeats() -> None:
    shown: dict[tuple[str, str], str] = {}
    a = _member("a", MAX_HASH, HashRange(0, MAX_HASH))
    assert registry_changes(shown, _view(5, a)) == [
        f"registry: replicaset a joined, active range [0, {MAX_HASH}] (revision 5)"
    ]
    assert registry_changes(shown, _view(6, a)) == []  # a revision without a change prints nothing
    half = MAX_HASH // 2
    b = _member("b", half, HashRange(0, half), State.ACTIVE, giver="a")
    a2 = _member("a", MAX_HASH, HashRange(half + 1, MAX_HASH), State.WAIT)
    lines = registry_changes(shown, _view(7, b, a2))
    assert lines == [
        f"registry: replicaset b joined, active (locked by a) range [0, {half}] (revision 7)",
        f"registry: replicaset a wait range [{half + 1}, {MAX_HASH}] (revision 7)",
    ]
    lines = registry_changes(shown, _view(9, a))
    assert lines == [
        f"registry: replicaset a active range [0, {MAX_HASH}] (revision 9)",
        "registry: replicaset b left (revision 9)",
    ]
    assert registry_changes(shown, _view(10)) == ["registry: replicaset a left (revision 10)"]
    assert shown == {}
