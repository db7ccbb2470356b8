"""Parked records (``rejoinGraceSeconds``) against a real etcd: park, rejoin, expiry, no split, guards."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest

from hashing import MAX_HASH, HashRange
from rangeshard.core.errors import AlreadyRegistered, ConfigError, NoSplittableRange, NotRegistered
from rangeshard.core.etcd import EtcdClient
from rangeshard.core.etcdserver import EtcdServer
from registry import Registry, State
from tests.helpers import wait_until
from tests.registry.test_cli import run

CT = "replicaset"


def _two(registry: Registry, leases: Callable[..., int]) -> tuple[int, int]:
    la, lb = leases(30), leases(30)
    registry.join(CT, "a", la)
    registry.join(CT, "b", lb)
    registry.unlock(CT, "b", "a")
    return la, lb


def test_park_keeps_the_key_and_a_rejoin_takes_it_back_without_a_handover(
    registry: Registry, etcd_client: EtcdClient, leases: Callable[..., int]
) -> None:
    la, lb = _two(registry, leases)
    before = registry.snapshot(CT)
    grace = leases(30)
    registry.park(CT, "b", lb, grace, 30)
    etcd_client.revoke_lease(lb)  # what the stopping process does next: the record lives on the grace lease
    parked = registry.snapshot(CT)
    b = parked.get("b")
    assert b is not None and b.record.state is State.PARKED and b.record.is_parked
    assert b.lease_id == grace and b.record.parked_until is not None
    assert [(m.instance_id, m.record.hash_key, m.range) for m in parked] == [
        (m.instance_id, m.record.hash_key, m.range) for m in before
    ]
    a = parked.get("a")
    assert a is not None and a.range == before.get("a").range  # type: ignore[union-attr]  # nobody absorbs it

    new_lease = leases(30)
    back = registry.join(CT, "b", new_lease, host="h", pid=7)
    assert back.record.hash_key == b.record.hash_key and back.range == b.range
    assert back.record.state is State.ACTIVE and not back.record.is_locked and back.record.giver is None
    assert back.lease_id == new_lease and back.record.parked_until is None
    assert back.record.host == "h" and back.record.pid == 7
    after = registry.snapshot(CT)
    assert after.get("a").mod_revision == parked.get("a").mod_revision  # type: ignore[union-attr]  # untouched
    assert etcd_client.lease_ttl(grace) < 0  # the grace lease was revoked
    with pytest.raises(AlreadyRegistered, match=r"b is already registered \(state active, host h, pid 7"):
        registry.join(CT, "b", leases(30))
    assert la


def test_a_parked_range_is_never_split_by_a_newcomer(registry: Registry, leases: Callable[..., int]) -> None:
    la = leases(30)
    registry.join(CT, "a", la)
    registry.park(CT, "a", la, leases(30), 30)
    with pytest.raises(NoSplittableRange, match="parked"):
        registry.join(CT, "new", leases(30))
    lb = leases(30)
    back = registry.join(CT, "a", lb)  # the owner itself may come back
    assert back.range == HashRange(0, MAX_HASH)
    # b joins (splits a's range), then a parks: c must split b's half, not a's.
    registry.join(CT, "b", leases(30))
    registry.unlock(CT, "b", "a")
    registry.park(CT, "a", lb, leases(30), 30)
    snap = registry.snapshot(CT)
    a_range = snap.get("a").range  # type: ignore[union-attr]
    c = registry.join(CT, "c", leases(30))
    assert c.record.giver == "b"
    assert registry.snapshot(CT).get("a").range == a_range  # type: ignore[union-attr]


def test_park_unlocks_the_receivers_in_the_same_transaction(registry: Registry, leases: Callable[..., int]) -> None:
    la = leases(30)
    registry.join(CT, "a", la)
    b = registry.join(CT, "b", leases(30))
    assert b.record.is_locked and b.record.giver == "a"
    registry.park(CT, "a", la, leases(30), 30)
    snap = registry.snapshot(CT)
    assert snap.get("a").record.is_parked  # type: ignore[union-attr]
    b_now = snap.get("b")
    assert b_now is not None and not b_now.record.is_locked and b_now.record.giver is None


def test_park_is_refused_for_another_lease(registry: Registry, leases: Callable[..., int]) -> None:
    la = leases(30)
    registry.join(CT, "a", la)
    with pytest.raises(NotRegistered):
        registry.park(CT, "a", la + 1, leases(30), 30)
    assert registry.snapshot(CT).get("a").record.state is State.INIT  # type: ignore[union-attr]


def test_the_grace_runs_out_and_the_neighbour_absorbs_the_range(
    registry: Registry, etcd_client: EtcdClient, leases: Callable[..., int]
) -> None:
    la, lb = _two(registry, leases)
    grace = etcd_client.grant_lease(2)
    registry.park(CT, "a", la, grace, 2)
    etcd_client.revoke_lease(la)
    assert registry.snapshot(CT).get("a") is not None
    wait_until(lambda: registry.snapshot(CT).get("a") is None, 15, "the parked record to expire")
    snap = registry.snapshot(CT)
    assert [m.instance_id for m in snap] == ["b"] and snap.get("b").range == HashRange(0, MAX_HASH)  # type: ignore[union-attr]
    assert lb


def test_set_key_refuses_to_move_a_parked_range(registry: Registry, leases: Callable[..., int]) -> None:
    la, lb = _two(registry, leases)  # b owns the lower half, a the upper
    registry.park(CT, "b", lb, leases(30), 30)
    with pytest.raises(ConfigError, match="b is parked"):
        registry.set_key(CT, "b", MAX_HASH // 4)  # the parked instance itself
    back = registry.join(CT, "b", leases(30))
    registry.park(CT, "a", la, leases(30), 30)
    with pytest.raises(ConfigError, match="a is parked"):
        registry.set_key(CT, "b", MAX_HASH // 4 * 3)  # its successor is parked: a's range would change
    assert registry.snapshot(CT).get("b").record.hash_key == back.record.hash_key  # type: ignore[union-attr]


def test_a_receiver_locked_by_a_parked_giver_may_unlock_itself(registry: Registry, leases: Callable[..., int]) -> None:
    la = leases(30)
    registry.join(CT, "a", la)
    registry.join(CT, "b", leases(30))
    # Park a with a hand-made record (as an older manager might leave it): b still names a as giver.
    registry.park(CT, "a", la, leases(30), 30)
    registry.lock(CT, "b", "a")
    registry.unlock_orphaned(CT, "b")
    b = registry.snapshot(CT).get("b")
    assert b is not None and not b.record.is_locked


def test_registry_list_shows_parked_and_release_ends_the_grace(
    etcd_server: EtcdServer, registry: Registry, etcd_client: EtcdClient, leases: Callable[..., int], key_prefix: str
) -> None:
    la, lb = _two(registry, leases)
    env = {"COLUMNS": "200"}
    registry.park(CT, "b", lb, leases(30), 30)
    table = run("registry", "list", "--etcd", etcd_server.url, "--prefix", key_prefix, env=env)
    assert table.returncode == 0, table.stderr
    line = next(x for x in table.stdout.splitlines() if " b " in x)
    assert re.search(r"PARKED \((2\d|30)s left\)", line), table.stdout
    listed = json.loads(run("registry", "list", "-o", "json", "--etcd", etcd_server.url, "--prefix", key_prefix).stdout)
    b = next(d for d in listed if d["instanceId"] == "b")
    assert b["state"] == "parked" and 20 <= b["parkedSecondsLeft"] <= 30
    assert next(d for d in listed if d["instanceId"] == "a")["parkedSecondsLeft"] is None
    # Only a parked record is released (exit 2, the record untouched) ...
    refused = run(
        "registry", "release", "--type", CT, "--instance", "a", "--etcd", etcd_server.url, "--prefix", key_prefix
    )
    assert refused.returncode == 2 and "not parked" in refused.stderr and "Traceback" not in refused.stderr
    # ... and releasing it hands its range to the neighbour at once.
    done = run(
        "registry", "release", "--type", CT, "--instance", "b", "--etcd", etcd_server.url, "--prefix", key_prefix
    )
    assert done.returncode == 0, done.stderr
    assert "released replicaset/b" in done.stdout
    snap = registry.snapshot(CT)
    assert [m.instance_id for m in snap] == ["a"] and snap.get("a").range == HashRange(0, MAX_HASH)  # type: ignore[union-attr]
    assert la
