"""``rebalance isolate``'s plan: the point becomes a range of its own, neighbours pressed aside, pins honoured."""

from __future__ import annotations

import pytest

from hashing import MAX_HASH, HashRange, derive_ranges
from rangeshard.core.errors import PlanError
from registry.models import InstanceRecord, Snapshot, State
from registry.rebalance import isolate_plan, isolate_targets

CT = "ns-ctl"


def snap(keys: list[int], pinned: frozenset[str] = frozenset()) -> Snapshot:
    items = [
        (
            InstanceRecord.model_validate(
                {"instanceId": f"i{i}", "controllerType": CT, "hashKey": k, "state": State.ACTIVE}
            ),
            f"/k/{i}",
            1,
            1,
            0,
        )
        for i, k in enumerate(keys)
    ]
    return Snapshot.build(CT, 1, items, pinned)


def ranges(keys: list[int]) -> list[HashRange | None]:
    return [r for _, r in derive_ranges((k, k) for k in keys)]


@pytest.mark.parametrize("point", [1_000, MAX_HASH // 4, MAX_HASH // 2 - 1, MAX_HASH // 2 + 1, MAX_HASH - 10])
def test_the_point_is_a_range_of_its_own_whatever_the_neighbours_hold(point: int) -> None:
    keys = [MAX_HASH // 4, MAX_HASH // 2, 3 * (MAX_HASH // 4), MAX_HASH]
    targets = isolate_targets(snap(keys), "i1", point)
    assert targets[1] == point and targets[0] == point - 1
    assert targets == sorted(set(targets)) and targets[-1] == MAX_HASH  # order kept, no empty range
    assert ranges(targets)[1] == HashRange(point, point)


def test_only_the_keys_that_must_move_do() -> None:
    keys = [100, 1_000, 2_000, MAX_HASH]
    assert isolate_targets(snap(keys), "i1", 500) == [499, 500, 2_000, MAX_HASH]
    assert isolate_targets(snap(keys), "i2", 50) == [48, 49, 50, MAX_HASH]  # both below pressed down
    assert isolate_targets(snap(keys), "i1", 3_000) == [2_999, 3_000, 3_001, MAX_HASH]  # the one above pushed up
    plan = isolate_plan(snap(keys), "i1", 500)
    assert [(m.instance_id, m.new_key) for m in plan.moves] == [("i0", 499), ("i1", 500)]


def test_first_and_last_instances_and_pinned_neighbours_are_refused() -> None:
    keys = [100, 1_000, 2_000, MAX_HASH]
    with pytest.raises(PlanError, match=r"i0 is the first instance .* can be isolated: i1, i2$"):
        isolate_targets(snap(keys), "i0", 500)
    with pytest.raises(PlanError, match="i3 is the last instance"):
        isolate_targets(snap(keys), "i3", 500)
    with pytest.raises(PlanError, match="i0 is pinned"):
        isolate_targets(snap(keys, frozenset({"i0"})), "i1", 500)
    with pytest.raises(PlanError, match="i2 is pinned"):  # its range would start lower
        isolate_targets(snap(keys, frozenset({"i2"})), "i1", 500)
    assert isolate_targets(snap(keys, frozenset({"i3", "i1"})), "i1", 500)[2] == 2_000  # i3 untouched: allowed
    with pytest.raises(PlanError, match="owns no range"):
        isolate_targets(snap(keys), "zz", 500)
