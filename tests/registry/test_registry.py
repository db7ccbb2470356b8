"""Registry behaviour against a real etcd: joins, leases, watches, locks, key moves."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from hashing import MAX_HASH, HashRange
from rangeshard.core.errors import AlreadyRegistered, CompareFailed, ConfigError, LeaseLost, NotRegistered
from rangeshard.core.etcd import EtcdClient, EtcdConfig, PrefixWatch
from rangeshard.core.etcdserver import EtcdServer
from rangeshard.core.process import popen
from registry import LeaseKeeper, MembershipWatch, Registry, RegistryView, Snapshot, State
from tests.helpers import wait_until
from tests.relay import TcpRelay

CT = "replicaset"


def assert_partition(snap: Snapshot) -> None:
    ranges = sorted(m.range for m in snap if m.range is not None)
    assert ranges[0].lo == 0 and ranges[-1].hi == MAX_HASH
    for a, b in itertools.pairwise(ranges):
        assert a.hi + 1 == b.lo


def test_first_three_joins(registry: Registry, leases: Callable[[int], int]) -> None:
    first = registry.join(CT, "a", leases(30))
    assert first.range == HashRange.full()
    assert first.record.state is State.INIT and not first.record.is_locked
    second = registry.join(CT, "b", leases(30))
    assert second.record.hash_key == 4611686018427387903
    assert second.record.is_locked and second.record.giver == "a" and second.record.state is State.LOCKED
    third = registry.join(CT, "c", leases(30))
    assert third.record.hash_key == 2305843009213693951
    snap = registry.snapshot(CT)
    assert [m.record.hash_key for m in snap] == [2305843009213693951, 4611686018427387903, MAX_HASH]
    assert_partition(snap)
    # c split b's (locked) range: the one that may still process those keys is a.
    assert snap.get("c") is not None and snap.get("c").record.giver == "a"  # type: ignore[union-attr]
    with pytest.raises(AlreadyRegistered):
        registry.join(CT, "a", leases(30))
    with pytest.raises(ConfigError, match="instance id"):
        registry.join(CT, "Bad/Name", leases(30))


def test_rejoin_never_locks_itself(registry: Registry, leases: Callable[[int], int]) -> None:
    """An instance that lost its lease rejoins with the same id while a receiver still names it as giver."""
    old_lease = leases(30)
    registry.join(CT, "g", old_lease)
    registry.join(CT, "r", leases(30))  # r is locked, giver g
    registry.leave(old_lease)  # g's lease is gone (it fenced); r did not self-unlock yet
    # r (locked, giver g) owns everything now; g's new incarnation splits r's range.
    again = registry.join(CT, "g", leases(30))
    assert not again.record.is_locked and again.record.giver is None
    r = registry.snapshot(CT).get("r")
    assert r is not None and r.record.is_locked and r.record.giver == "g"
    registry.unlock(CT, "r", "g")  # the new g releases r once it has nothing in flight


def test_concurrent_joins_threads(registry: Registry, leases: Callable[[int], int]) -> None:
    lease_ids = [leases(30) for _ in range(10)]
    barrier = threading.Barrier(10)
    errors: list[BaseException] = []

    def join(i: int) -> None:
        try:
            barrier.wait()
            registry.join(CT, f"t{i}", lease_ids[i])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=join, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    snap = registry.snapshot(CT)
    keys = [m.record.hash_key for m in snap]
    assert len(snap) == 10 and len(set(keys)) == 10
    assert all(m.range is not None for m in snap)
    assert_partition(snap)


JOIN_SCRIPT = """
import sys
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from registry import Registry
client = EtcdClient(EtcdConfig.from_urls(sys.argv[1]))
lease = client.grant_lease(60)
sys.stdin.readline()  # start together
m = Registry(client, sys.argv[2]).join("replicaset", sys.argv[3], lease)
print(m.record.hash_key, flush=True)
"""


def test_concurrent_joins_processes(etcd_server: EtcdServer, registry: Registry, key_prefix: str) -> None:
    procs = [
        popen(
            [sys.executable, "-c", JOIN_SCRIPT, etcd_server.url, key_prefix, f"p{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(10)
    ]
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    keys = {int(o.strip()) for o in outs}
    assert len(keys) == 10
    snap = registry.snapshot(CT)
    assert {m.record.hash_key for m in snap} == keys
    assert_partition(snap)


def test_record_vanishes_on_lease_expiry_and_watch_sees_it(
    etcd_config: EtcdConfig, registry: Registry, key_prefix: str, leases: Callable[[int], int]
) -> None:
    registry.join(CT, "keeper", leases(30))
    registry.join(CT, "mortal", leases(2))
    views: list[RegistryView] = []
    watch = MembershipWatch(etcd_config, views.append, controller_type=CT, prefix=key_prefix)
    watch.start()
    try:
        assert watch.synced.wait(10)
        assert len(views[-1].get(CT)) == 2
        # Nobody renews the 2 s lease: etcd deletes the record and the watch delivers it.
        wait_until(lambda: [m.instance_id for m in views[-1].get(CT)] == ["keeper"], 10, "expiry seen by the watch")
        snap = registry.snapshot(CT)
        assert [m.instance_id for m in snap] == ["keeper"] and snap.members[0].range == HashRange.full()
    finally:
        watch.stop()


def test_watch_survives_etcd_restart(etcd_server_factory: Callable[[], EtcdServer]) -> None:
    server = etcd_server_factory()
    server.start()
    config = EtcdConfig.from_urls(server.url)
    views: list[RegistryView] = []
    with EtcdClient(config) as client:
        reg = Registry(client, "/restart")
        reg.join(CT, "a", client.grant_lease(60))
        watch = MembershipWatch(config, views.append, controller_type=CT, prefix="/restart", probe_interval=0.5)
        watch.start()
        try:
            assert watch.synced.wait(10)
            server.stop()
            wait_until(lambda: watch.restarts > 0, 15, "the watch to notice etcd is gone")
            server.start()
            reg.join(CT, "b", client.grant_lease(60))
            wait_until(lambda: len(views[-1].get(CT)) == 2, 20, "the second join after the restart")
            assert views[-1].revision == reg.snapshot(CT).revision
            assert watch.relists == 1  # resumed from its revision, no relist needed
        finally:
            watch.stop()


def test_watch_relists_after_compaction(etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str) -> None:
    relay = TcpRelay(etcd_server.client_port)
    views: list[RegistryView] = []
    reg = Registry(etcd_client, key_prefix)
    watch = MembershipWatch(
        EtcdConfig.from_urls(relay.url), views.append, controller_type=CT, prefix=key_prefix, probe_interval=0.3
    )
    watch.start()
    try:
        assert watch.synced.wait(10)
        relay.cut()
        wait_until(lambda: watch.restarts > 0, 10, "the watch to lose its connection")
        lease = etcd_client.grant_lease(60)
        reg.join(CT, "x", lease)
        reg.heartbeat(CT, "x", lease, workload_num=3)
        etcd_client.compact(etcd_client.revision())
        relay.restore()
        wait_until(lambda: watch.relists >= 2, 20, "a relist after compaction")
        wait_until(lambda: views and views[-1].get(CT).get("x") is not None, 10, "the record after relist")
        member = views[-1].get(CT).get("x")
        assert member is not None and member.record.workload_num == 3
    finally:
        watch.stop()
        relay.close()


def test_lock_unlock_compare_failures(registry: Registry, leases: Callable[[int], int]) -> None:
    registry.join(CT, "giver", leases(30))
    recv = registry.join(CT, "recv", leases(30))
    assert recv.record.is_locked and recv.record.giver == "giver"
    with pytest.raises(CompareFailed, match="not locked by"):
        registry.unlock(CT, "recv", "somebody-else")
    with pytest.raises(CompareFailed, match="record changed"):
        registry.unlock(CT, "recv", "giver", expected_mod_revision=recv.mod_revision - 1)
    with pytest.raises(CompareFailed, match="still registered"):
        registry.unlock_orphaned(CT, "recv")
    registry.unlock(CT, "recv", "giver", expected_mod_revision=recv.mod_revision)
    after = registry.snapshot(CT).get("recv")
    assert after is not None and not after.record.is_locked and after.record.giver is None
    with pytest.raises(CompareFailed):
        registry.unlock(CT, "recv", "giver")
    with pytest.raises(NotRegistered):
        registry.unlock(CT, "ghost", "giver")
    # And locked again by hand: a stale revision is refused, the current one locks it.
    with pytest.raises(CompareFailed, match="record changed"):
        registry.lock(CT, "recv", "giver", expected_mod_revision=recv.mod_revision)
    registry.lock(CT, "recv", "giver", expected_mod_revision=after.mod_revision)
    relocked = registry.snapshot(CT).get("recv")
    assert relocked is not None and relocked.record.is_locked and relocked.record.giver == "giver"
    assert relocked.record.state is State.LOCKED
    with pytest.raises(NotRegistered):
        registry.lock(CT, "ghost", "giver")


def test_orphaned_receiver_unlocks_itself(registry: Registry, leases: Callable[[int], int]) -> None:
    giver_lease = leases(30)
    registry.join(CT, "giver", giver_lease)
    registry.join(CT, "recv", leases(30))
    registry.leave(giver_lease)
    registry.unlock_orphaned(CT, "recv")
    snap = registry.snapshot(CT)
    recv = snap.get("recv")
    assert recv is not None and not recv.record.is_locked
    assert recv.range == HashRange.full()


def test_heartbeat_never_undoes_unlock(registry: Registry, leases: Callable[[int], int]) -> None:
    a_lease, b_lease = leases(30), leases(30)
    registry.join(CT, "a", a_lease)
    registry.join(CT, "b", b_lease)
    stop = threading.Event()

    def beat() -> None:
        n = 0
        while not stop.is_set() and n < 500:
            registry.heartbeat(CT, "b", b_lease, workload_num=n)
            n += 1

    t = threading.Thread(target=beat)
    t.start()
    try:

        def try_unlock() -> bool:
            try:
                registry.unlock(CT, "b", "a")
            except CompareFailed:
                return False
            return True

        wait_until(try_unlock, 10, "an unlock that wins against heartbeats")
    finally:
        stop.set()
        t.join(10)
    registry.heartbeat(CT, "b", b_lease, workload_num=1, state=State.ACTIVE)
    b = registry.snapshot(CT).get("b")
    assert b is not None and not b.record.is_locked and b.record.state is State.ACTIVE
    with pytest.raises(NotRegistered, match="another lease"):
        registry.heartbeat(CT, "b", a_lease)


def test_last_instance_normalizes_key(registry: Registry, leases: Callable[[int], int]) -> None:
    a_lease, b_lease = leases(30), leases(30)
    registry.join(CT, "a", a_lease)
    registry.join(CT, "b", b_lease)
    registry.leave(a_lease)
    rec = registry.heartbeat(CT, "b", b_lease)
    assert rec.hash_key == MAX_HASH


def test_set_key_locks_receiver_and_refuses_bad_keys(registry: Registry, leases: Callable[[int], int]) -> None:
    registry.join(CT, "a", leases(30))
    registry.join(CT, "b", leases(30))
    registry.unlock(CT, "b", "a")
    b_key = registry.snapshot(CT).get("b").record.hash_key  # type: ignore[union-attr]
    for bad, message in (
        (-1, "outside"),
        (MAX_HASH + 1, "outside"),
        (MAX_HASH, "empty range or collide"),
        (b_key, "already has key"),
    ):
        with pytest.raises(ConfigError, match=message):
            registry.set_key(CT, "b", bad)
    with pytest.raises(ConfigError, match="unknown instance"):
        registry.set_key(CT, "nobody", 5)
    with pytest.raises(ConfigError, match="last instance"):
        registry.set_key(CT, "a", 5)
    # Growing b takes keys from a: b is locked with a as giver, atomically with the move.
    registry.set_key(CT, "b", b_key + 1000)
    snap = registry.snapshot(CT)
    b = snap.get("b")
    assert b is not None and b.record.hash_key == b_key + 1000 and b.record.is_locked and b.record.giver == "a"
    assert_partition(snap)
    with pytest.raises(CompareFailed, match="locked"):
        registry.set_key(CT, "b", b_key)
    registry.unlock(CT, "b", "a")
    # Shrinking b gives keys to a: a is locked with b as giver.
    registry.set_key(CT, "b", b_key)
    a = registry.snapshot(CT).get("a")
    assert a is not None and a.record.is_locked and a.record.giver == "b"


def test_hand_written_record_without_lease(registry: Registry, etcd_client: EtcdClient, key_prefix: str) -> None:
    etcd_client.put(
        f"{key_prefix}/controllers/{CT}/manual",
        json.dumps({"hashKey": 42, "workloadNum": 7, "isLocked": False, "state": "active"}),
    )
    etcd_client.put(f"{key_prefix}/controllers/{CT}/garbage", "not json")
    snap = registry.snapshot(CT)
    assert [m.instance_id for m in snap] == ["manual"]
    m = snap.members[0]
    assert m.lease_id == 0 and m.record.controller_type == CT and m.range == HashRange.full()


def test_lease_keeper_reports_failure_deadline_and_loss(etcd_server_factory: Callable[[], EtcdServer]) -> None:
    server = etcd_server_factory()
    server.start()
    config = EtcdConfig.from_urls(server.url)
    renewed: list[float] = []
    failures: list[tuple[Exception, float]] = []
    lost = threading.Event()
    keeper = LeaseKeeper(
        config,
        3,
        name="test",
        margin=1.0,
        on_renewed=renewed.append,
        on_failure=lambda e, d: failures.append((e, d)),
        on_lost=lost.set,
    )
    start = time.monotonic()
    keeper.start()
    granted = time.monotonic()
    try:
        # Measured from the grant's send time, which lies between start and granted.
        assert start + 3 - 1.0 <= keeper.deadline <= granted + 3 - 1.0
        wait_until(lambda: len(renewed) >= 2, 10, "two renewals")
        assert renewed[-1] > renewed[0]
        server.stop()
        wait_until(lambda: failures, 10, "a reported renewal failure")
        error, deadline = failures[0]
        assert "unreachable" in str(error)
        assert deadline == renewed[-1]  # a failed renewal keeps the last good deadline
        assert keeper.remaining() < 3
        server.start()
        wait_until(lambda: len(renewed) >= 3, 15, "renewals after etcd returned")
        with EtcdClient(config) as other:
            other.revoke_lease(keeper.lease_id)
        assert lost.wait(10)
        with pytest.raises(LeaseLost):
            keeper.renew_once()
    finally:
        keeper.stop()


def test_watch_rewatches_when_the_stream_ends_without_an_error(
    etcd_config: EtcdConfig,
    registry: Registry,
    key_prefix: str,
    leases: Callable[[int], int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pyetcd reports a stream that ended cleanly as ``None``; the watch must re-watch, not die."""
    import registry.watch as watch_module  # noqa: PLC0415

    clients: list[EtcdClient] = []
    watches: list[PrefixWatch] = []

    class Recorded(EtcdClient):
        def __init__(self, config: EtcdConfig) -> None:
            super().__init__(config)
            clients.append(self)

        def watch_prefix(self, *args: Any, **kwargs: Any) -> PrefixWatch:
            watches.append(super().watch_prefix(*args, **kwargs))
            return watches[-1]

    monkeypatch.setattr(watch_module, "EtcdClient", Recorded)
    views: list[RegistryView] = []
    watch = MembershipWatch(etcd_config, views.append, controller_type=CT, prefix=key_prefix)
    watch.start()
    try:
        assert watch.synced.wait(10)
        # What pyetcd does when the server ends the stream with status OK: it calls every
        # registered callback with None (pyetcd.watch.Watcher._run). etcd has no request
        # that ends a stream that way on demand, so the callback is called as pyetcd would.
        wait_until(lambda: bool(watches), 10, "the etcd watch to be opened")
        watcher = watches[-1].member.raw.watcher
        wait_until(lambda: len(watcher._callbacks) == 1, 10, "the etcd watch to be created")
        next(iter(watcher._callbacks.values()))(None)
        wait_until(lambda: watch.restarts == 1, 10, "the watch to notice its stream ended")
        registry.join(CT, "late", leases(30))
        wait_until(lambda: views[-1].get(CT).get("late") is not None, 10, "a change after the re-watch")
        assert watch.relists == 1 and len(clients) >= 2
    finally:
        watch.stop()


def test_apply_plan_replans_a_move_that_lost_a_race(registry: Registry, leases: Callable[[int], int]) -> None:
    """A heartbeat landing between set-key's read and its guarded write fails the move; apply retries it."""
    from registry.apply import apply_plan  # noqa: PLC0415
    from registry.rebalance import Move, Plan  # noqa: PLC0415

    class Racing(Registry):
        """Our Registry with one concurrent write injected, and the managers' unlock done by hand."""

        races = 1
        attempts = 0

        def snapshot(self, controller_type: str) -> Snapshot:
            snap = super().snapshot(controller_type)
            if self.racing and self.races:
                self.races -= 1
                super().heartbeat(CT, "b", lease_b, workload_num=3)  # a write after the read
            return snap

        racing = False

        def set_key(self, controller_type: str, instance_id: str, new_key: int, *, dry_run: bool = False, **kw):  # type: ignore[no-untyped-def]
            self.attempts += 1
            self.racing = True
            try:
                result = super().set_key(controller_type, instance_id, new_key, dry_run=dry_run, **kw)
            finally:
                self.racing = False
            receiver = result[1]
            assert receiver is not None
            giver = super().snapshot(CT).get(receiver.instance_id).record.giver  # type: ignore[union-attr]
            self.unlock(CT, receiver.instance_id, giver)  # type: ignore[arg-type]
            self.update(CT, receiver.instance_id, lambda r: r.evolve(state=State.ACTIVE))
            return result

    racing = Racing(registry.client, registry.layout.prefix)
    lease_a, lease_b = leases(30), leases(30)
    racing.join(CT, "a", lease_a)
    racing.join(CT, "b", lease_b)
    racing.unlock(CT, "b", "a")
    for name in ("a", "b"):
        racing.update(CT, name, lambda r: r.evolve(state=State.ACTIVE))
    lower = racing.snapshot(CT).members[0]
    target = lower.record.hash_key // 2
    plan = Plan(
        CT, "workload", (target, MAX_HASH), (Move(lower.instance_id, lower.record.hash_key, target),), (1, 1), (1, 1)
    )
    assert apply_plan(racing, plan, timeout=10) == 1
    assert racing.attempts == 2 and racing.races == 0
    assert racing.snapshot(CT).members[0].record.hash_key == target
