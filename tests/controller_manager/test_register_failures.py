"""ShardInstance._register when joining fails: report "retry later", leave no lease and no state behind.

Two failure paths, both against real etcd processes:

* etcd unreachable (a port nobody listens on): granting the lease fails; the
  instance answers False (the state machine retries), keeps no keeper, no
  epoch, no range, and is not "joined";
* the lease is granted but the join is refused (the instance id is already
  registered): the fresh lease is revoked at once, so nothing of the failed
  attempt stays in etcd until a TTL runs out.

After either failure, a later attempt that can succeed joins normally; the
state machine waits between attempts by the one Backoff (doubling, reset by
a join). A
successful join is pinned too: the record carries host and pid, the owner
token and state come from the stored record, every join starts a new epoch,
and the one membership watch (started by the first join only) watches this
type under this prefix and delivers into the state machine's queue.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controller_manager import sharding
from controller_manager.shardhost import ShardHost, ShardSettings
from controller_manager.sharding import ShardInstance
from hashing import HashRange
from rangeshard.core.backoff import Backoff
from rangeshard.core.clock import ManualClock
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.ownertoken import OwnerToken
from rangeshard.core.process import free_port
from registry import LeaseKeeper, Registry, RegistryView
from tests.helpers import wait_until

CT = "replicaset"
TTL = 60


class RecordingKeeper(LeaseKeeper):
    """The real LeaseKeeper, remembering every instance _register creates."""

    made: list[LeaseKeeper] = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        RecordingKeeper.made.append(self)


@pytest.fixture
def keepers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[LeaseKeeper]]:
    RecordingKeeper.made = []
    monkeypatch.setattr(sharding, "LeaseKeeper", RecordingKeeper)
    yield RecordingKeeper.made
    for k in RecordingKeeper.made:
        if not k._stop.is_set():  # not stopped by _register or by ShardInstance.stop
            k.stop(revoke=True)


class Host(ShardHost):
    """Caches always synced; the states and owner tokens the instance reports, in order."""

    def __init__(self) -> None:
        self.states: list[str] = []
        self.tokens: list[OwnerToken] = []

    def synced(self, epoch: int) -> bool:
        return True

    def on_epoch(self) -> None:
        pass

    def on_allowed(self) -> None:
        pass

    def workload(self, rng: HashRange) -> tuple[int, dict[str, Any] | None]:
        return 0, None

    def on_state(self, state: str) -> None:
        self.states.append(state)

    def on_token(self, token: OwnerToken) -> None:
        self.tokens.append(token)


@pytest.fixture
def make_shard(key_prefix: str, keepers: list[LeaseKeeper]) -> Iterator[Callable[..., ShardInstance]]:
    made: list[ShardInstance] = []

    def make(config: EtcdConfig, name: str, ttl: int = TTL) -> ShardInstance:
        host = Host()
        settings = ShardSettings(
            etcd_config=config,
            registry_prefix=key_prefix,
            controller_type=CT,
            instance_id=name,
            lease_ttl=ttl,
            reconcile_timeout=2.0,
            hostname="node-7",
            pid=4242,
        )
        shard = ShardInstance(settings, host, clock=ManualClock(1000.0))
        shard.states, shard.tokens = host.states, host.tokens  # type: ignore[attr-defined]
        made.append(shard)
        return shard

    yield make
    for shard in made:  # before the keepers fixture's teardown (this fixture depends on it)
        shard.stop(drain_timeout=0)


def assert_not_joined(shard: ShardInstance) -> None:
    assert shard.keeper is None and shard.watch is None
    assert not shard.joined.is_set()
    assert shard.epoch == 0 and shard.counters["epochs"] == 0
    assert shard.range is None and shard.allowed is None and shard.token is None
    assert shard.join_revision == 0


def test_etcd_unreachable_at_join_answers_false_and_keeps_nothing(
    make_shard: Callable[..., ShardInstance], keepers: list[LeaseKeeper]
) -> None:
    dead = EtcdConfig.from_urls(f"http://127.0.0.1:{free_port()}", timeout=0.5)
    shard = make_shard(dead, "a")
    assert shard._register() is False
    assert_not_joined(shard)
    # The attempt's keeper never got a lease and never started its thread.
    assert len(keepers) == 1 and keepers[0].lease_id == 0 and keepers[0]._thread is None
    assert shard._register() is False  # and again: still nothing
    assert len(keepers) == 2
    assert_not_joined(shard)


def test_refused_join_revokes_the_fresh_lease_then_a_retry_joins(
    make_shard: Callable[..., ShardInstance],
    keepers: list[LeaseKeeper],
    etcd_config: EtcdConfig,
    etcd_client: EtcdClient,
    key_prefix: str,
) -> None:
    registry = Registry(etcd_client, key_prefix)
    squatter = etcd_client.grant_lease(TTL)
    registry.join(CT, "a", squatter)  # "a" is taken
    shard = make_shard(etcd_config, "a")
    assert shard._register() is False
    assert_not_joined(shard)
    (failed,) = keepers
    assert failed.lease_id != 0 and failed._thread is None
    # The lease of the failed attempt is gone at once (not left to expire in 60 s).
    assert etcd_client.lease_ttl(failed.lease_id) == -1
    assert etcd_client.lease_ttl(squatter) > 0
    assert [m.lease_id for m in registry.snapshot(CT).members] == [squatter]

    # Once the name is free, the next attempt joins with a new, kept lease.
    etcd_client.revoke_lease(squatter)
    assert shard._register() is True
    assert len(keepers) == 2 and shard.keeper is keepers[1]
    assert etcd_client.lease_ttl(keepers[1].lease_id) > 0
    assert shard.joined.is_set() and shard.epoch == 1 and shard.range == HashRange.full()
    (member,) = registry.snapshot(CT).members
    assert member.lease_id == keepers[1].lease_id and shard.join_revision == member.mod_revision


def next_view_with(shard: ShardInstance, name: str, timeout: float = 10.0) -> RegistryView:
    """The first RegistryView in the state machine's queue whose snapshot of CT has ``name``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ev = shard._events.get(timeout=0.1)
        except queue.Empty:
            continue
        if isinstance(ev, RegistryView) and ev.get(CT).get(name) is not None:
            return ev
    raise AssertionError(f"no registry view with {name} within {timeout}s")


def test_a_join_records_host_and_pid_sets_token_state_epoch_and_starts_one_watch(
    make_shard: Callable[..., ShardInstance],
    keepers: list[LeaseKeeper],
    etcd_config: EtcdConfig,
    etcd_client: EtcdClient,
    key_prefix: str,
) -> None:
    registry = Registry(etcd_client, key_prefix)
    shard = make_shard(etcd_config, "a")
    assert shard._register() is True
    (member,) = registry.snapshot(CT).members
    assert member.record.host == "node-7" and member.record.pid == 4242
    lease = keepers[0].lease_id
    assert member.lease_id == lease
    token = OwnerToken(CT, "a", lease, member.mod_revision)
    assert shard.token == token and shard.tokens == [token]  # type: ignore[attr-defined]
    assert shard.state == "init" and shard.states == [] and not shard.locked  # type: ignore[attr-defined]
    assert shard.epoch == 1 and shard.counters["epochs"] == 1
    watch = shard.watch
    assert watch is not None and watch.controller_type == CT
    assert watch.watch_prefix == registry.layout.type_prefix(CT)
    assert watch.probe_interval == TTL / 5
    # The watch feeds the state machine: another instance joining shows up in its queue.
    registry.join(CT, "b", etcd_client.grant_lease(TTL))
    next_view_with(shard, "b")

    # A second join (the first lease revoked: the record is gone) is a new epoch, same watch.
    registry.unlock(CT, "b", "a")  # b took over its half (a drained)
    keepers[0].stop(revoke=True)
    assert shard._register() is True
    assert shard.epoch == 2 and shard.counters["epochs"] == 2
    assert shard.watch is watch
    member_a = registry.snapshot(CT).get("a")
    assert member_a is not None and member_a.lease_id == keepers[1].lease_id
    assert shard.token == OwnerToken(CT, "a", keepers[1].lease_id, member_a.mod_revision)
    # b owned everything meanwhile: a joins locked, waiting for b, and says so.
    assert member_a.record.is_locked and member_a.record.giver == "b"
    assert shard.locked and shard.state == "locked" and shard.states == ["locked"]  # type: ignore[attr-defined]


def test_short_leases_probe_the_watch_at_least_every_half_second(
    make_shard: Callable[..., ShardInstance], keepers: list[LeaseKeeper], etcd_config: EtcdConfig
) -> None:
    shard = make_shard(etcd_config, "short", ttl=2)
    assert shard._register() is True
    assert shard.watch is not None and shard.watch.probe_interval == 0.5


class RecordingBackoff(Backoff):
    """The one Backoff, remembering the delays it handed out."""

    def __init__(self) -> None:
        super().__init__(0.01, 0.04)
        self.delays: list[float] = []

    def next_delay(self) -> float:
        self.delays.append(super().next_delay())
        return self.delays[-1]


def test_failed_registrations_back_off_and_a_join_resets_the_backoff(
    make_shard: Callable[..., ShardInstance], keepers: list[LeaseKeeper], etcd_config: EtcdConfig
) -> None:
    # The state machine's registration loop waits the Backoff's delays, doubling to its maximum.
    dead = EtcdConfig.from_urls(f"http://127.0.0.1:{free_port()}", timeout=0.2)
    shard = make_shard(dead, "a")
    assert shard.etcd_retry.initial == 1.0 and shard.etcd_retry.maximum == 4.0  # the product's policy
    shard.etcd_retry = spy = RecordingBackoff()
    shard.start()
    wait_until(lambda: len(spy.delays) >= 4, 20, "four failed registrations")
    shard.stop(drain_timeout=0)
    assert spy.delays[:4] == [0.01, 0.02, 0.04, 0.04]
    assert_not_joined(shard)
    # A join that succeeds resets it: the next failure waits the initial delay again.
    live = make_shard(etcd_config, "b")
    live.etcd_retry = spy = RecordingBackoff()
    spy.next_delay(), spy.next_delay()
    assert live._register() is True
    assert spy.failures == 0 and spy.next_delay() == 0.01
