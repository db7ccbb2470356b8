"""``MainObjects``: the objects of an external entry's main resource the endpoint served, as a workload."""

from __future__ import annotations

from typing import Any

from controller_manager.external.workload import MainObjects
from hashing import MAX_HASH, HashRange, ShardBy, hash_key


def _obj(name: str, ns: str = "a", uid: str | None = None, owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": uid or f"uid-{ns}-{name}"}
    if owner:
        meta["ownerReferences"] = [{"uid": owner, "controller": True}]
    return {"metadata": meta}


def test_lists_replace_their_scope_and_events_update() -> None:
    objs = MainObjects(ShardBy.UID)
    objs.listed({"items": [_obj("x"), _obj("y"), _obj("z", "b")]}, None)
    assert len(objs) == 3
    objs.listed({"items": [_obj("w")]}, "a")  # a namespaced list replaces namespace a only
    assert len(objs) == 2
    objs.event({"type": "ADDED", "object": _obj("v", "c")})
    objs.event({"type": "DELETED", "object": _obj("z", "b")})
    objs.event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}})
    objs.event({"type": "ERROR", "object": {"kind": "Status"}})
    objs.event(None)
    count, hist = objs.workload(HashRange.full())
    assert count == 2 and hist is not None and sum(hist["objects"]) == 2 and sum(hist["counts"]) == 2


def test_only_the_range_counts_and_keys_follow_the_rule() -> None:
    owned = [_obj(f"p{i}", owner="rs-1") for i in range(5)]
    by_owner = MainObjects(ShardBy.OWNER)
    by_owner.listed({"items": [*owned, _obj("orphan")]}, None)
    key = hash_key("rs-1")
    assert by_owner.workload(HashRange(key, key))[0] == 5  # the orphan has no key: never counted
    by_ns = MainObjects(ShardBy.NAMESPACE)
    by_ns.listed({"items": [_obj("c1", "team"), _obj("c2", "team"), _obj("c3", "other")]}, None)
    team = hash_key("team")
    assert by_ns.workload(HashRange(team, team))[0] == 2
    lower = HashRange(0, MAX_HASH // 2)
    uid = MainObjects(ShardBy.UID)
    uid.listed({"items": [_obj(f"o{i}") for i in range(50)]}, None)
    expected = sum(1 for i in range(50) if lower.contains(hash_key(f"uid-a-o{i}")))
    assert uid.workload(lower)[0] == expected
