"""ShardInstance._register when joining fails: report "retry later", leave no lease and no state behind.

Two failure paths, both against real etcd processes:

* etcd unreachable (a port nobody listens on): granting the lease fails; the
  instance answers False (the state machine retries), keeps no keeper, no
  epoch, no range, and is not "joined";
* the lease is granted but the join is refused (the instance id is already
  registered): the fresh lease is revoked at once, so nothing of the failed
  attempt stays in etcd until a TTL runs out.

After either failure, a later attempt that can succeed joins normally.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from controller_manager import sharding
from controller_manager.sharding import ShardInstance
from hashing import HashRange
from rangeshard.core.clock import ManualClock
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.process import free_port
from registry import LeaseKeeper, Registry

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


@pytest.fixture
def make_shard(key_prefix: str, keepers: list[LeaseKeeper]) -> Iterator[Callable[[EtcdConfig, str], ShardInstance]]:
    made: list[ShardInstance] = []

    def make(config: EtcdConfig, name: str) -> ShardInstance:
        shard = ShardInstance(
            etcd_config=config,
            registry_prefix=key_prefix,
            controller_type=CT,
            instance_id=name,
            lease_ttl=TTL,
            reconcile_timeout=2.0,
            synced=lambda _epoch: True,
            on_epoch=lambda: None,
            on_allowed=lambda: None,
            workload=lambda _rng: (0, None),
            clock=ManualClock(1000.0),
        )
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
    make_shard: Callable[[EtcdConfig, str], ShardInstance], keepers: list[LeaseKeeper]
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
    make_shard: Callable[[EtcdConfig, str], ShardInstance],
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
