"""``handoverResourceVersions``: what a giver published of its writes, in the records, against a real etcd (issue 46).

A giver publishes the highest resourceVersion of its writes per shard
resource with its heartbeats, when it parks, and in the very transaction
that unlocks its receiver: the registry view in which the receiver sees
itself unlocked already holds them, so the receiver's first list is not
older than the giver's last writes.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest

from rangeshard.core.errors import CompareFailed
from registry import InstanceRecord, Registry

CT = "replicaset"


def test_the_unlock_publishes_the_givers_versions_in_the_same_transaction(
    registry: Registry, leases: Callable[[int], int]
) -> None:
    lease = leases(30)
    registry.join(CT, "giver", lease)
    recv = registry.join(CT, "recv", leases(30))
    assert recv.record.is_locked
    registry.heartbeat(CT, "giver", lease, versions={"pods": 10, "replicasets.apps": 0})
    giver = registry.snapshot(CT).get("giver")
    assert giver is not None and giver.record.handover_resource_versions == {"pods": "10"}, "0: nothing written"

    registry.unlock(CT, "recv", "giver", versions={"pods": 42, "replicasets.apps": 17})
    snap = registry.snapshot(CT)
    g, r = snap.get("giver"), snap.get("recv")
    assert g is not None and r is not None and not r.record.is_locked
    assert g.record.handover_resource_versions == {"pods": "42", "replicasets.apps": "17"}
    assert g.mod_revision == r.mod_revision, "one transaction: no view shows the unlock without the versions"

    registry.heartbeat(CT, "giver", lease, workload_num=3)  # without versions: the published ones stay
    g = registry.snapshot(CT).get("giver")
    assert g is not None and g.record.handover_resource_versions == {"pods": "42", "replicasets.apps": "17"}


def test_an_unlock_with_unchanged_versions_writes_only_the_receiver_and_a_refused_one_writes_nothing(
    registry: Registry, leases: Callable[[int], int]
) -> None:
    lease = leases(30)
    registry.join(CT, "giver", lease)
    recv = registry.join(CT, "recv", leases(30))
    registry.heartbeat(CT, "giver", lease, versions={"pods": 5})
    before = registry.snapshot(CT).get("giver")
    assert before is not None
    with pytest.raises(CompareFailed):  # a stale read of the receiver: neither record is written
        registry.unlock(CT, "recv", "giver", expected_mod_revision=recv.mod_revision - 1, versions={"pods": 9})
    after = registry.snapshot(CT).get("giver")
    assert after is not None and after.mod_revision == before.mod_revision
    registry.unlock(CT, "recv", "giver", versions={"pods": 5})
    after = registry.snapshot(CT).get("giver")
    assert after is not None and after.mod_revision == before.mod_revision, "nothing new to publish"


def test_a_parked_record_keeps_what_it_published(registry: Registry, leases: Callable[[int], int]) -> None:
    lease = leases(30)
    registry.join(CT, "p", lease)
    registry.heartbeat(CT, "p", lease, versions={"pods": 7})
    registry.park(CT, "p", lease, leases(30), 30.0, {"pods": 8, "replicasets.apps": 3})
    p = registry.snapshot(CT).get("p")
    assert p is not None and p.record.is_parked
    assert p.record.handover_resource_versions == {"pods": "8", "replicasets.apps": "3"}


@pytest.mark.parametrize(
    ("stored", "read"),
    [
        ({"pods": "12", "replicasets.apps": "3"}, {"pods": "12", "replicasets.apps": "3"}),
        ({"pods": "12", "bad": "x1", "neg": "-4", "num": 5, "wide": "\uff11\uff12"}, {"pods": "12"}),
        ("pods=12", None),
        ({}, None),
        (None, None),
    ],
)
def test_a_malformed_handover_versions_field_reads_as_absent_never_unreadable(stored: object, read: object) -> None:
    doc = {"hashKey": 5, "handoverResourceVersions": stored}
    rec = InstanceRecord.from_kv(CT, "x", orjson.dumps(doc))
    assert rec.hash_key == 5
    assert rec.handover_resource_versions == read
