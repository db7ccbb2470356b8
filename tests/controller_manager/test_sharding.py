"""ShardInstance's handover rules against a real etcd, timed by a ManualClock.

The tests drive the state machine one evaluation at a time (``step``: read a
snapshot, evaluate) instead of starting its thread, so every assertion is
about a known sequence of registry states and clock readings:

* a reconcile is refused when ``now + reconcile_timeout`` passes the fencing
  deadline (``grant send time + TTL - margin``), accepted just before;
* the fencing deadline passing fences (nothing starts), a renewal unfences;
* a giver unlocks its receiver only when no in-flight reconcile is outside
  its new range (in-range work does not hold the receiver);
* a locked receiver unlocks itself only once its giver's record is gone;
* a lost registration rejoins only after the running reconciles ended;
* with ``rejoinGraceSeconds`` a graceful stop parks only a drained, unfenced
  instance (otherwise it leaves as without a grace).

The lease TTL is long (60 s: keepalives every 20 real seconds), so the
keeper's own renewals cannot move the deadline under a test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controller_manager.controller import Expectations, ReconcileContext
from controller_manager.shardhost import ShardHost, ShardSettings
from controller_manager.sharding import FENCED, ShardInstance
from hashing import MAX_HASH, HashRange
from rangeshard.core.clock import ManualClock
from rangeshard.core.errors import ReconcileTimeout
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from registry import Registry, State
from tests.helpers import wait_until

CT = "replicaset"
T0 = 1000.0
TTL = 60
MARGIN = 18.0  # default_margin(60)
TIMEOUT = 2.0
LOW = 5  # a hash a receiver splitting [0, MAX_HASH] takes over
HIGH = MAX_HASH - 5  # a hash the giver keeps


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


class Host(ShardHost):
    """The informers relist at once: synced exactly at the current epoch; each resume recorded."""

    def __init__(self) -> None:
        self.shard: ShardInstance | None = None
        self.allowed_calls: list[int] = []
        #: What the controller wrote (``written_versions``); the pods floor each new epoch relisted from.
        self.written: dict[str, int] = {}
        self.epoch_floors: list[int] = []

    def synced(self, epoch: int) -> bool:
        return self.shard is not None and epoch == self.shard.epoch

    def on_epoch(self) -> None:
        if self.shard is not None:
            self.epoch_floors.append(self.shard.floor("pods"))

    def written_versions(self) -> dict[str, int]:
        return dict(self.written)

    def on_allowed(self) -> None:
        assert self.shard is not None
        self.allowed_calls.append(self.shard.epoch)

    def workload(self, rng: HashRange) -> tuple[int, dict[str, Any] | None]:
        return 0, None


@pytest.fixture
def make_shard(etcd_config: EtcdConfig, key_prefix: str, clock: ManualClock) -> Iterator[Callable[..., ShardInstance]]:
    made: list[ShardInstance] = []

    def make(name: str, rejoin_grace: float = 0.0) -> ShardInstance:
        host = Host()
        settings = ShardSettings(
            etcd_config=etcd_config,
            registry_prefix=key_prefix,
            controller_type=CT,
            instance_id=name,
            lease_ttl=TTL,
            reconcile_timeout=TIMEOUT,
            rejoin_grace=rejoin_grace,
        )
        shard = host.shard = ShardInstance(settings, host, clock=clock)
        shard.allowed_calls = host.allowed_calls  # type: ignore[attr-defined]
        made.append(shard)
        return shard

    yield make
    for shard in made:
        if shard._stop.is_set():
            continue  # the test stopped it
        with shard._cond:
            shard.inflight.clear()
        shard.stop(drain_timeout=0)


@pytest.fixture
def registry(etcd_client: EtcdClient, key_prefix: str) -> Registry:
    return Registry(etcd_client, key_prefix)


def step(shard: ShardInstance, registry: Registry) -> None:
    """One turn of the state machine on the registry as it is now."""
    shard.snapshot = registry.snapshot(CT)
    shard._evaluate()


def active(make_shard: Callable[[str], ShardInstance], registry: Registry, name: str = "a") -> ShardInstance:
    shard = make_shard(name)
    before_join = registry.snapshot(CT)
    assert shard._register()
    # The informers list the new range at a new epoch (relist) before anything is allowed.
    assert shard.informer_range() == (1, HashRange.full()) and shard.counters["epochs"] == 1
    # A snapshot older than our join says nothing about us: ignored, not "our record is gone".
    shard.snapshot = before_join
    shard._evaluate()
    assert not shard.fenced and shard.allowed is None and shard.counters["rejoins"] == 0
    step(shard, registry)
    assert shard.allowed == HashRange.full()
    step(shard, registry)
    # Allowed once per epoch: no resync storm on every evaluation.
    assert shard.allowed_calls == [shard.epoch]  # type: ignore[attr-defined]
    return shard


def locked(registry: Registry, name: str) -> bool:
    member = registry.snapshot(CT).get(name)
    assert member is not None, f"{name} is not registered"
    return member.record.is_locked


def test_try_begin_refuses_a_reconcile_that_could_outlive_the_fencing_deadline(
    make_shard: Callable[[str], ShardInstance], registry: Registry, clock: ManualClock
) -> None:
    shard = active(make_shard, registry)
    assert shard.keeper is not None
    deadline = shard.keeper.deadline
    assert deadline == pytest.approx(T0 + TTL - MARGIN)  # the grant's send time, minus the margin
    assert shard.try_begin("ns/a", HIGH) == pytest.approx(T0 + TIMEOUT)
    shard.end("ns/a")
    clock.set(deadline - TIMEOUT - 0.01)
    assert shard.try_begin("ns/a", HIGH) == pytest.approx(deadline - 0.01)
    shard.end("ns/a")
    clock.set(deadline - TIMEOUT)  # ends exactly at the deadline: still allowed (exact in binary floats)
    assert shard.try_begin("ns/a", HIGH) == deadline
    shard.end("ns/a")
    clock.set(deadline - TIMEOUT + 0.01)
    assert shard.try_begin("ns/a", HIGH) is None
    assert shard.inflight == {}
    assert shard.fenced is False  # refusing is not fencing: the deadline itself has not passed


def test_the_deadline_passing_fences_and_a_renewal_unfences(
    make_shard: Callable[[str], ShardInstance], registry: Registry, clock: ManualClock
) -> None:
    shard = active(make_shard, registry)
    assert shard.keeper is not None
    epochs = shard.counters["epochs"]
    clock.set(shard.keeper.deadline)
    step(shard, registry)
    assert shard.fenced and shard.state == FENCED and shard.allowed is None
    assert shard.counters["fences"] == 1
    assert shard.try_begin("ns/a", HIGH) is None
    step(shard, registry)
    assert shard.counters["fences"] == 1  # counted once per fencing
    # The keepalive goes through: the deadline moves from its send time, the record is intact.
    assert shard.keeper.renew_once() == pytest.approx(clock.monotonic() + TTL - MARGIN)
    step(shard, registry)
    assert not shard.fenced and shard.state != FENCED
    assert shard.counters["epochs"] == epochs + 1  # caches relisted before processing again
    assert shard.allowed == HashRange.full()
    assert shard.try_begin("ns/a", HIGH) is not None
    assert shard.counters["rejoins"] == 0


def test_giver_unlocks_its_receiver_only_after_draining_the_keys_it_gave_away(
    make_shard: Callable[[str], ShardInstance], registry: Registry, etcd_client: EtcdClient
) -> None:
    giver = active(make_shard, registry)
    assert giver.try_begin("ns/low", LOW) is not None
    assert giver.try_begin("ns/high", HIGH) is not None
    receiver = registry.join(CT, "b", etcd_client.grant_lease(TTL))
    assert receiver.record.is_locked and receiver.record.giver == "a"
    assert receiver.range is not None and receiver.range.contains(LOW) and not receiver.range.contains(HIGH)
    epochs = giver.counters["epochs"]
    for _ in range(3):
        step(giver, registry)
        assert giver.state == State.WAIT.value
        assert locked(registry, "b"), "receiver unlocked while a key it received was still being reconciled"
    assert giver.counters["drain_waits"] == 3 and giver.counters["unlocks"] == 0
    assert giver.counters["epochs"] == epochs + 1  # one relist for the range change, not one per evaluation
    assert giver.informer_range() == (giver.epoch, HashRange(receiver.range.hi + 1, MAX_HASH))
    # While draining, the giver keeps working inside its new range and starts nothing outside it.
    assert giver.try_begin("ns/low2", LOW + 1) is None
    assert giver.try_begin("ns/high2", HIGH - 1) is not None
    giver.end("ns/low")
    step(giver, registry)
    # In-range work ("ns/high", "ns/high2") does not hold the receiver.
    assert not locked(registry, "b")
    assert giver.counters["unlocks"] == 1
    step(giver, registry)
    assert giver.state == State.ACTIVE.value
    assert giver.counters["unlocks"] == 1


def test_receiver_self_unlocks_only_when_its_givers_record_is_gone(
    make_shard: Callable[[str], ShardInstance], registry: Registry, etcd_client: EtcdClient
) -> None:
    giver_lease = etcd_client.grant_lease(TTL)
    registry.join(CT, "a", giver_lease)
    registry.unlock_orphaned(CT, "a")  # the first instance is not locked: a no-op
    receiver = make_shard("b")
    assert receiver._register()
    assert receiver.locked
    for _ in range(3):
        step(receiver, registry)
        assert receiver.state == State.LOCKED.value and receiver.allowed is None
        assert locked(registry, "b")
    assert receiver.counters["self_unlocks"] == 0
    assert receiver.try_begin("ns/low", LOW) is None
    etcd_client.revoke_lease(giver_lease)  # the giver is gone (fenced itself, lease expired)
    step(receiver, registry)
    assert receiver.counters["self_unlocks"] == 1
    assert not locked(registry, "b")
    step(receiver, registry)
    assert receiver.allowed == HashRange.full()
    assert receiver.try_begin("ns/low", LOW) is not None


def test_rejoin_waits_for_running_reconciles(
    make_shard: Callable[[str], ShardInstance], registry: Registry, etcd_client: EtcdClient
) -> None:
    shard = active(make_shard, registry)
    assert shard.keeper is not None
    old_lease = shard.keeper.lease_id
    assert shard.try_begin("ns/a", HIGH) is not None
    assert registry.remove(CT, "a")  # our record vanishes (deleted by hand: the lease itself is still alive)
    for _ in range(3):
        step(shard, registry)
        assert shard.fenced and shard.allowed is None
        assert shard.counters["rejoins"] == 0, "rejoined while a reconcile of the old registration ran"
        assert shard.keeper is not None and shard.keeper.lease_id == old_lease
        assert registry.snapshot(CT).get("a") is None
    assert shard.counters["fences"] == 1
    old_keeper = shard.keeper
    shard.end("ns/a")
    step(shard, registry)
    assert shard.counters["rejoins"] == 1 and shard.counters["fences"] == 1
    assert not shard.fenced and shard.state != FENCED
    assert shard.keeper is not None and shard.keeper.lease_id != old_lease
    # The old registration is given up for good: its keeper stopped, its lease revoked.
    assert old_keeper._stop.is_set()
    assert etcd_client.lease_ttl(old_lease) == -1
    member = registry.snapshot(CT).get("a")
    assert member is not None and member.lease_id == shard.keeper.lease_id
    step(shard, registry)
    assert not shard.fenced and shard.allowed == HashRange.full()


def test_reconcile_context_timeout_follows_its_clock(clock: ManualClock) -> None:
    ctx = ReconcileContext("ns/a", T0 + 2.0, clock)
    assert ctx.timeout() == pytest.approx(2.0)
    clock.advance(1.9)
    assert ctx.remaining() == pytest.approx(0.1)
    assert ctx.timeout() == pytest.approx(0.1)
    clock.advance(0.06)
    with pytest.raises(ReconcileTimeout, match="ns/a: reconcile deadline reached"):
        ctx.timeout()


def test_expectations_until_observed_or_expired(clock: ManualClock) -> None:
    exp = Expectations(ttl=10.0, clock=clock)
    assert exp.satisfied("ns/a")
    exp.expect("ns/a", adds=2, dels=1)
    assert not exp.satisfied("ns/a")
    exp.observe("ns/a", adds=2)
    assert not exp.satisfied("ns/a")
    exp.observe("ns/a", dels=1)
    assert exp.satisfied("ns/a")
    exp.expect("ns/b", adds=1)
    clock.advance(9.9)
    assert not exp.satisfied("ns/b")
    clock.advance(0.2)
    assert exp.satisfied("ns/b")  # expired: look again rather than wait forever
    exp.expect("ns/c", dels=3)
    exp.forget("ns/c")
    assert exp.satisfied("ns/c")


def test_graceful_leave_drains_then_revokes(
    make_shard: Callable[[str], ShardInstance], registry: Registry, etcd_client: EtcdClient
) -> None:
    shard = active(make_shard, registry)
    assert shard.keeper is not None
    lease = shard.keeper.lease_id
    assert shard.try_begin("ns/a", HIGH) is not None
    ended = threading.Event()

    def finish_later() -> None:
        # The reconcile ends only once the leave has stopped new work.
        wait_until(lambda: shard.leaving and shard.allowed is None, 10, "the leave to begin")
        assert shard.try_begin("ns/b", HIGH) is None
        assert registry.snapshot(CT).get("a") is not None, "record gone while a reconcile still ran"
        ended.set()
        shard.end("ns/a")

    worker = threading.Thread(target=finish_later)
    worker.start()
    shard.stop(drain_timeout=30)
    worker.join(10)
    assert ended.is_set()
    # Drained: the lease is revoked, so the neighbour inherits at once.
    assert registry.snapshot(CT).get("a") is None
    assert etcd_client.lease_ttl(lease) == -1


def test_leave_with_a_stuck_reconcile_keeps_the_lease_to_expire(
    make_shard: Callable[[str], ShardInstance], registry: Registry, etcd_client: EtcdClient
) -> None:
    shard = active(make_shard, registry)
    assert shard.keeper is not None
    lease = shard.keeper.lease_id
    assert shard.try_begin("ns/a", HIGH) is not None
    shard.stop(drain_timeout=0.2)
    # Not revoked: the record stays until the lease expires (after the reconcile's fencing deadline).
    assert registry.snapshot(CT).get("a") is not None
    assert etcd_client.lease_ttl(lease) > 0
    etcd_client.revoke_lease(lease)


def test_a_drained_stop_with_a_grace_parks_on_a_grace_lease(
    make_shard: Callable[..., ShardInstance], registry: Registry, etcd_client: EtcdClient
) -> None:
    shard = make_shard("a", rejoin_grace=30.0)
    assert shard._register()
    assert shard.keeper is not None
    old_lease = shard.keeper.lease_id
    shard.stop(drain_timeout=0)
    parked = registry.snapshot(CT).get("a")
    assert parked is not None and parked.record.state is State.PARKED and parked.lease_id != old_lease
    assert shard.state == State.PARKED.value
    assert etcd_client.lease_ttl(old_lease) == -1  # the instance's own lease is revoked after parking
    etcd_client.revoke_lease(parked.lease_id)


def test_a_stop_with_work_still_running_leaves_instead_of_parking(
    make_shard: Callable[..., ShardInstance], registry: Registry, etcd_client: EtcdClient
) -> None:
    """Not drained: no park (a successor would take a range whose old work still runs); the lease just expires."""
    shard = active(make_shard, registry)
    shard.rejoin_grace = 30.0
    assert shard.keeper is not None
    old_lease = shard.keeper.lease_id
    assert shard.try_begin("ns/a", HIGH) is not None
    shard.stop(drain_timeout=0)
    member = registry.snapshot(CT).get("a")
    assert member is not None and member.record.state is not State.PARKED and member.lease_id == old_lease
    assert shard.state != State.PARKED.value
    assert etcd_client.lease_ttl(old_lease) > 0  # not revoked under running work: it expires by itself
    etcd_client.revoke_lease(old_lease)
    assert registry.snapshot(CT).get("a") is None  # nothing parked survives the lease


def test_a_fenced_stop_with_a_grace_leaves(
    make_shard: Callable[..., ShardInstance], registry: Registry, clock: ManualClock
) -> None:
    """Fenced (past its deadline, the lease may be gone at etcd): it leaves; its range is taken over at once."""
    shard = active(make_shard, registry)
    shard.rejoin_grace = 30.0
    assert shard.keeper is not None
    clock.set(shard.keeper.deadline)
    step(shard, registry)
    assert shard.fenced
    shard.stop(drain_timeout=0)
    assert registry.snapshot(CT).get("a") is None
    assert shard.state != State.PARKED.value


def test_the_receiver_relists_not_older_than_what_its_giver_wrote_before_the_unlock(
    make_shard: Callable[[str], ShardInstance], registry: Registry
) -> None:
    """Issue 46: the unlock publishes the giver's write versions in its transaction; the epoch the receiver
    starts on seeing itself unlocked lists "not older than" them (controller_manager.freshness)."""
    giver = active(make_shard, registry)
    giver_host = giver.host
    assert isinstance(giver_host, Host)
    giver_host.written = {"pods": 30}
    receiver = make_shard("b")
    receiver_host = receiver.host
    assert isinstance(receiver_host, Host)
    assert receiver._register() and receiver.locked
    assert receiver_host.epoch_floors == [0], "nothing written yet when it joined"
    giver_host.written = {"pods": 57, "replicasets.apps": 12}  # its last writes, before it unlocks
    step(giver, registry)  # the range shrank: a new epoch; nothing in flight: drained, unlocked
    assert giver.counters["unlocks"] == 1 and not locked(registry, "b")
    giver_host.written = {"pods": 80}  # after the unlock: of its own keys, nothing the receiver needs
    step(receiver, registry)
    assert not receiver.locked
    assert receiver_host.epoch_floors == [0, 57]
    assert receiver.floor("replicasets.apps") == 12
    receiver_host.written = {"replicasets.apps": 90}
    assert receiver.floor("replicasets.apps") == 90, "its own writes count too"
    step(receiver, registry)
    assert receiver.allowed == receiver.range


def test_a_parked_instances_successor_lists_not_older_than_its_writes_and_a_leave_publishes_them(
    make_shard: Callable[..., ShardInstance], registry: Registry, etcd_client: EtcdClient
) -> None:
    """A rolling restart moves no key, but the new process must not list older than the old one wrote."""
    first = make_shard("p", rejoin_grace=30.0)
    assert first._register()
    assert isinstance(first.host, Host)
    first.host.written = {"pods": 44}
    first.stop(drain_timeout=0)
    parked = registry.snapshot(CT).get("p")
    assert parked is not None and parked.record.handover_resource_versions == {"pods": "44"}
    successor = make_shard("p", rejoin_grace=30.0)
    assert successor._register()
    assert isinstance(successor.host, Host)
    assert successor.host.epoch_floors == [44], "its very first lists, before any registry view"
    # A leave without a grace publishes before the lease goes (the neighbour absorbs the range).
    successor.rejoin_grace = 0.0
    successor.host.written = {"pods": 61}
    seen: list[dict[str, str] | None] = []
    original = successor.registry.heartbeat

    def heartbeat(*args: Any, **kwargs: Any) -> Any:
        record = original(*args, **kwargs)
        seen.append(record.handover_resource_versions)
        return record

    successor.registry.heartbeat = heartbeat  # type: ignore[method-assign]
    successor.stop(drain_timeout=0)
    assert seen[-1] == {"pods": "61"}
    assert registry.snapshot(CT).get("p") is None
