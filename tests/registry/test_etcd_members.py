"""One etcd member down costs nothing: calls, leases and watches fail over within their deadlines.

A real three-member cluster (etcd's default 1 s election timeout), started once
per session. Each fault runs while a lease keeper renews and a membership watch
follows the registry: the lease is never lost (its id never changes, the
longest gap between renewals stays inside the fencing window), reads keep
answering, the watch keeps delivering. With two members down (no quorum)
the keeper still fences within the TTL, as before.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from rangeshard.core.errors import RangeshardError
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.etcdserver import EtcdCluster, EtcdServer
from registry import LeaseKeeper, MembershipWatch
from registry.lease import default_margin
from tests.helpers import wait_until

TTL = 4


@dataclass
class Load:
    """Reads and writes against the cluster while a fault happens; the longest gap without an answer."""

    config: EtcdConfig
    prefix: str
    longest_gap: float = 0.0
    writes: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with EtcdClient(self.config) as client:
            last = time.monotonic()
            for i in range(100_000):  # bounded; stopped long before
                if self._stop.wait(0.02):
                    return
                try:
                    client.put(f"{self.prefix}/k{i % 10}", str(i))
                    client.get(f"{self.prefix}/k{i % 10}")
                    self.writes += 1
                except RangeshardError as e:
                    self.errors.append(str(e))
                    continue
                now = time.monotonic()
                self.longest_gap = max(self.longest_gap, now - last)
                last = now


@contextmanager
def under_load(cluster: EtcdCluster) -> Iterator[tuple[LeaseKeeper, Load, list[int]]]:
    """A lease keeper, a read/write load and a membership watch, all on the three members."""
    config = cluster.client_config(timeout=2.0)
    lost: list[str] = []
    keeper = LeaseKeeper(config, TTL, name="failover", on_lost=lambda: lost.append("lost"))
    keeper.start()
    load = Load(config, f"/failover-{uuid.uuid4().hex[:8]}")
    loader = threading.Thread(target=load.run, name="failover-load", daemon=True)
    loader.start()
    revisions: list[int] = []
    watch = MembershipWatch(config, lambda view: revisions.append(view.revision), name="failover")
    watch.start()
    try:
        wait_until(lambda: watch.synced.is_set() and load.writes > 5, 20, "load and watch running")
        yield keeper, load, revisions
    finally:
        load._stop.set()
        loader.join(10)
        watch.stop()
        lease_id = keeper.lease_id
        keeper.stop(revoke=True)
    assert lost == [] and not keeper.lost.is_set(), "the lease was lost"
    assert keeper.lease_id == lease_id
    # The fencing deadline was never reached: renewals never stopped for ttl - margin.
    assert keeper.longest_gap < TTL - default_margin(TTL), keeper.longest_gap


def _fault(cluster: EtcdCluster, fault: Callable[[], None], keeper: LeaseKeeper, seconds: float) -> None:
    """Run ``fault``; keep checking for ``seconds`` that the keeper's deadline stays ahead."""
    fault()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert keeper.remaining() > 0, "the fencing deadline passed"
        time.sleep(0.05)  # sampling interval of the check, not synchronisation


def _follower(cluster: EtcdCluster) -> EtcdServer:
    leader = cluster.leader()
    return next(m for m in cluster.members if m is not leader)


def test_sigkill_of_the_leader(etcd_members: EtcdCluster) -> None:
    with under_load(etcd_members) as (keeper, load, _revisions):
        leader = etcd_members.leader()
        _fault(etcd_members, leader.kill, keeper, 5.0)
        assert etcd_members.leader() is not leader
        gap = load.longest_gap
    print(f"leader SIGKILL: longest renewal gap {keeper.longest_gap:.2f}s, longest read/write gap {gap:.2f}s")
    # Reads and writes wait for the election (up to 2 s at etcd's randomised 1-2 s timeout), not much longer.
    assert gap < 4.0


def test_sigkill_of_a_follower(etcd_members: EtcdCluster) -> None:
    with under_load(etcd_members) as (keeper, load, _revisions):
        _fault(etcd_members, _follower(etcd_members).kill, keeper, 3.0)
    print(f"follower SIGKILL: longest renewal gap {keeper.longest_gap:.2f}s, read/write {load.longest_gap:.2f}s")
    assert load.longest_gap < 2.0


def test_a_member_hung_longer_than_the_ttl(etcd_members: EtcdCluster) -> None:
    with under_load(etcd_members) as (keeper, load, revisions):
        # Make the hung member the one every client talks to first.
        hung = _follower(etcd_members)
        index = etcd_members.members.index(hung)
        keeper.client._preferred = index
        _fault(etcd_members, hung.pause, keeper, TTL + 2.0)
        # A new client asks the healthy members first: the hung one is backing off.
        with EtcdClient(etcd_members.client_config(timeout=2.0)) as c:
            started = time.monotonic()
            c.revision()
            assert time.monotonic() - started < 1.0
        hung.resume()
        assert revisions, "the membership watch delivered nothing"
    print(f"follower SIGSTOP: longest renewal gap {keeper.longest_gap:.2f}s, read/write {load.longest_gap:.2f}s")


def test_rolling_restart_of_every_member(etcd_members: EtcdCluster) -> None:
    with under_load(etcd_members) as (keeper, load, _revisions):
        for m in etcd_members.members:
            _fault(etcd_members, m.stop, keeper, 1.0)
            m.start(timeout=30)
            etcd_members.leader()
    print(f"rolling restart: longest renewal gap {keeper.longest_gap:.2f}s, read/write {load.longest_gap:.2f}s")
    # A graceful stop hands leadership over before the member exits, so no call waits for an election; a call
    # to the stopping member fails at once (its connection closes) and goes to the next member. So no answer
    # waits longer than after a follower's SIGKILL (measured: 0.07 s, against 2 s for one election).
    assert load.longest_gap < 2.0, load.longest_gap


def test_without_quorum_everyone_is_fenced_within_the_ttl(etcd_members: EtcdCluster) -> None:
    config = etcd_members.client_config(timeout=2.0)
    keeper = LeaseKeeper(config, 3, name="no-quorum")
    keeper.start()
    try:
        for m in etcd_members.members[:2]:
            m.kill()
        started = time.monotonic()
        wait_until(lambda: keeper.remaining() <= 0, 10, "the fencing deadline passing")
        assert time.monotonic() - started <= 3  # within the TTL
        with pytest.raises(RangeshardError), EtcdClient(config) as c:
            c.put("/no-quorum", "x")
    finally:
        keeper.stop()
