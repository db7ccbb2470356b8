"""Pinned instances (``rangeshard rebalance pin|unpin``) against a real etcd: joins, plans, restarts, the CLI."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from hashing import MAX_HASH, ShardBy
from rangeshard.core.errors import ConfigError, NoSplittableRange
from rangeshard.core.etcd import EtcdClient
from rangeshard.core.etcdserver import EtcdServer
from registry import MainResource, Registry, State
from registry.apply import apply_plan
from registry.rebalance import Move, Plan, Strategy, make_plan
from tests.registry.test_cli import run

CT = "replicaset"


def _unlock_all(registry: Registry) -> None:
    """What the managers would do: every handover done, every instance active."""
    for m in registry.snapshot(CT):
        registry.update(CT, m.instance_id, lambda r: r.evolve(is_locked=False, giver=None, state=State.ACTIVE))


def test_a_joiner_splits_the_largest_unpinned_range(registry: Registry, leases: Callable[..., int]) -> None:
    registry.join(CT, "a", leases())
    registry.join(CT, "b", leases())  # b takes the lower half, a keeps the upper
    _unlock_all(registry)
    assert registry.pin(CT, "a") is True
    assert registry.pin(CT, "a") is False  # already pinned
    snap = registry.snapshot(CT)
    assert snap.pinned == {"a"} and snap.get("a").pinned and not snap.get("b").pinned  # type: ignore[union-attr]
    a_range = snap.get("a").range  # type: ignore[union-attr]
    c = registry.join(CT, "c", leases())
    after = registry.snapshot(CT)
    assert after.get("a").range == a_range  # type: ignore[union-attr]  # the pinned (larger) range kept whole
    assert c.record.giver == "b" and c.range is not None and c.range.lo == 0  # b's range was split
    assert c.range.hi == (MAX_HASH // 2) // 2


def test_only_pinned_ranges_make_a_joiner_wait(registry: Registry, leases: Callable[..., int]) -> None:
    registry.join(CT, "a", leases())
    registry.pin(CT, "a")
    with pytest.raises(NoSplittableRange, match=r"only pinned ranges exist.*a \(rangeshard rebalance unpin"):
        registry.join(CT, "new", leases())
    assert registry.unpin(CT, "a") is True
    assert registry.unpin(CT, "a") is False
    joined = registry.join(CT, "new", leases())
    assert joined.range is not None and joined.range.lo == 0


def test_a_pin_survives_the_record_and_a_restart_under_the_same_id(
    registry: Registry, etcd_client: EtcdClient, leases: Callable[..., int]
) -> None:
    registry.join(CT, "a", leases())
    lb = leases()
    registry.join(CT, "b", lb)
    _unlock_all(registry)
    registry.pin(CT, "b")
    b_range = registry.snapshot(CT).get("b").range  # type: ignore[union-attr]
    registry.park(CT, "b", lb, leases(), 30)  # graceful stop with rejoinGraceSeconds
    etcd_client.revoke_lease(lb)
    parked = registry.snapshot(CT).get("b")
    assert parked is not None and parked.pinned and parked.record.is_parked
    back = registry.join(CT, "b", leases())
    assert back.range == b_range
    assert registry.snapshot(CT).get("b").pinned  # type: ignore[union-attr]
    # The pin is a key of its own, not bound to the record's lease.
    _rev, kv = etcd_client.get(registry.layout.pin_key(CT, "b"))
    assert kv is not None and kv.lease_id == 0 and "pinnedAt" in json.loads(kv.value)
    with pytest.raises(ConfigError, match="--instance: 'ghost' is not a registered instance"):
        registry.pin(CT, "ghost")


def test_plans_never_move_a_pinned_range(registry: Registry, leases: Callable[..., int]) -> None:
    for name in ("a", "b", "c", "d"):
        registry.join(CT, name, leases())
        _unlock_all(registry)
    snap = registry.snapshot(CT)
    order = [m.instance_id for m in snap]
    pinned = order[1]
    registry.pin(CT, pinned)
    snap = registry.snapshot(CT)
    before = snap.get(pinned).range  # type: ignore[union-attr]
    for by in Strategy.RANGE, Strategy.WORKLOAD:
        plan = make_plan(snap, by)
        targets = dict(zip(order, plan.targets, strict=True))
        assert targets[pinned] == before.hi and targets[order[0]] == before.lo - 1  # type: ignore[union-attr]
        assert all(m.instance_id not in (pinned, order[0]) for m in plan.moves)
    # A plan made before the pin cannot move it either: apply refuses the move.
    bad = Plan(CT, Strategy.RANGE, tuple(m.record.hash_key for m in snap), (Move(pinned, 0, 1),), (), ())
    bad_targets = list(bad.targets)
    bad_targets[1] = before.hi - 1  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=f"{pinned} is pinned"):
        apply_plan(registry, Plan(CT, Strategy.RANGE, tuple(bad_targets), bad.moves, (), ()), timeout=5)
    assert registry.snapshot(CT).get(pinned).range == before  # type: ignore[union-attr]


def test_pin_cli_and_where_it_shows(
    registry: Registry, etcd_server: EtcdServer, key_prefix: str, leases: Callable[..., int]
) -> None:
    registry.join(CT, "a", leases())
    registry.join(CT, "b", leases())
    _unlock_all(registry)
    opts = ("--etcd", etcd_server.url, "--prefix", key_prefix)
    pinned = run("rebalance", "pin", "--type", CT, "--instance", "b", *opts)
    assert pinned.returncode == 0, pinned.stderr
    assert pinned.stdout.startswith(f"pinned {CT}/b: range [0, ")
    listed = json.loads(run("registry", "list", "-o", "json", *opts).stdout)
    assert {d["instanceId"]: d["pinned"] for d in listed} == {"a": False, "b": True}
    table = run("registry", "list", *opts, env={"COLUMNS": "200"})
    assert "active, pinned" in table.stdout or "locked, pinned" in table.stdout
    wide = run("registry", "list", "-o", "wide", *opts, env={"COLUMNS": "250"})
    assert ", pinned" in wide.stdout
    show = json.loads(run("rebalance", "show", "--type", CT, "--json", *opts).stdout)
    assert {i["instanceId"]: i["pinned"] for i in show["instances"]} == {"a": False, "b": True}
    unknown = run("rebalance", "pin", "--type", CT, "--instance", "zz", *opts)
    assert unknown.returncode == 2 and "not a registered instance" in unknown.stderr
    no_type = run("rebalance", "pin", "--type", "nosuch", "--instance", "b", *opts)
    assert no_type.returncode == 2 and "--type" in no_type.stderr
    unpinned = run("rebalance", "unpin", "--type", CT, "--instance", "b", *opts)
    assert unpinned.returncode == 0 and unpinned.stdout.strip() == f"unpinned {CT}/b"
    again = run("rebalance", "unpin", "--type", CT, "--instance", "b", *opts)
    assert again.returncode == 0 and "was not pinned" in again.stdout


def test_isolate_is_refused_with_one_line(
    registry: Registry, etcd_server: EtcdServer, key_prefix: str, leases: Callable[..., int]
) -> None:
    """Another rule, the first or last instance, both or neither flag: exit 2 and one line, nothing moved."""
    by_ns = MainResource(group="", resource="configmaps", by=ShardBy.NAMESPACE)
    for name in ("a", "b", "c"):
        registry.join("nsctl", name, leases(), main_resource=by_ns)
    registry.join(CT, "r", leases(), main_resource=MainResource(group="apps", resource="replicasets", by=ShardBy.UID))
    opts = ("--etcd", etcd_server.url, "--prefix", key_prefix)
    before = [(m.instance_id, m.record.hash_key) for m in registry.snapshot("nsctl")]
    order = [i for i, _ in before]
    cases = {
        ("--type", CT, "--namespace", "x", "--instance", "r"): "isolate: --namespace needs a type whose main "
        "resource is sharded by: namespace; replicaset shards replicasets.apps by: uid",
        ("--type", "nsctl", "--label", "v", "--instance", order[1]): "isolate: --label needs a type whose main "
        "resource is sharded by: label; nsctl shards configmaps by: namespace",
        ("--type", "nsctl", "--namespace", "team-a", "--instance", order[0]): f"{order[0]} is the first instance",
        ("--type", "nsctl", "--namespace", "team-a", "--instance", order[2]): f"{order[2]} is the last instance",
        ("--type", "nsctl", "--instance", order[1]): "isolate: give exactly one of --namespace NS or --label VALUE",
        ("--type", "nsctl", "--namespace", "n", "--label", "v", "--instance", order[1]): "give exactly one of",
    }
    for args, message in cases.items():
        result = run("rebalance", "isolate", *args, *opts)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, result.stderr)
    assert [(m.instance_id, m.record.hash_key) for m in registry.snapshot("nsctl")] == before
    assert not registry.snapshot("nsctl").pinned
