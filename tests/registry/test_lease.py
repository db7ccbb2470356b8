"""LeaseKeeper against a real etcd, timed by a ManualClock: the fencing deadline's exact arithmetic.

The deadline must be ``keepalive SEND time + TTL - margin``: a reply that
arrives late must not extend it, and the margin must always be taken off. The
clock only moves when the test (or a slow call wrapped around the real etcd
client) moves it, so the expected deadlines are exact numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from rangeshard.core.clock import ManualClock
from rangeshard.core.errors import LeaseLost
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from registry import LeaseKeeper
from registry.lease import ELECTION_ALLOWANCE, default_margin, renewal_interval

T0 = 1000.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def keeper_factory(etcd_config: EtcdConfig, clock: ManualClock) -> Iterator[Callable[..., LeaseKeeper]]:
    made: list[LeaseKeeper] = []

    def make(ttl: int = 10, **kwargs: object) -> LeaseKeeper:
        keeper = LeaseKeeper(etcd_config, ttl, name="unit", clock=clock, **kwargs)  # type: ignore[arg-type]
        made.append(keeper)
        return keeper

    yield make
    for k in made:
        k.stop(revoke=True)


def slow_replies(client: EtcdClient, clock: ManualClock, seconds: float) -> None:
    """Make every grant and keepalive of ``client`` take ``seconds`` of the manual clock (sent, then answered late)."""
    grant, keepalive = client.grant_lease, client.keepalive_once

    def slow_grant(ttl: int) -> int:
        lease = grant(ttl)
        clock.advance(seconds)
        return lease

    def slow_keepalive(lease_id: int) -> int:
        ttl = keepalive(lease_id)
        clock.advance(seconds)
        return ttl

    client.grant_lease = slow_grant  # type: ignore[method-assign]
    client.keepalive_once = slow_keepalive  # type: ignore[method-assign]


def test_default_margin_is_thirty_percent_and_at_least_one_second() -> None:
    assert default_margin(2) == 1.0
    assert default_margin(3) == 1.0
    assert default_margin(10) == pytest.approx(3.0)
    assert default_margin(60) == pytest.approx(18.0)


def test_keepalives_every_third_of_the_ttl_each_bounded_below_the_interval(
    keeper_factory: Callable[..., LeaseKeeper],
) -> None:
    for ttl in (5, 10, 60):
        keeper = keeper_factory(ttl)
        assert keeper.interval == pytest.approx(ttl / 3)
        # A hung keepalive is given up before the next one is due.
        assert keeper.client.config.timeout < keeper.interval


def test_small_ttls_renew_often_enough_to_ride_out_an_etcd_leader_election(
    keeper_factory: Callable[..., LeaseKeeper],
) -> None:
    assert renewal_interval(3, default_margin(3)) == pytest.approx(0.5)
    assert renewal_interval(4, default_margin(4)) == pytest.approx(1.3)
    for ttl in range(3, 301):
        margin = default_margin(ttl)
        interval = renewal_interval(ttl, margin)
        # The last renewal, a failure noticed one interval later, then an election's worth of retries:
        # all before the fencing deadline (ttl - margin after the last renewal).
        assert interval + ELECTION_ALLOWANCE <= ttl - margin + 1e-9, ttl
        assert 0.5 <= interval <= ttl / 3 + 1e-9
    keeper = keeper_factory(3)
    assert keeper.interval == pytest.approx(0.5)
    assert keeper.client.config.timeout <= keeper.interval


def test_grant_deadline_is_send_time_plus_ttl_minus_margin(
    keeper_factory: Callable[..., LeaseKeeper], clock: ManualClock
) -> None:
    keeper = keeper_factory(10)
    slow_replies(keeper.client, clock, 2.5)
    keeper.grant()
    assert clock.monotonic() == T0 + 2.5
    # Sent at T0: not T0 + 2.5 (the reply), and never without the 3 s margin.
    assert keeper.deadline == pytest.approx(T0 + 10 - 3.0)
    assert keeper.remaining() == pytest.approx(10 - 3.0 - 2.5)


def test_renewal_deadline_is_keepalive_send_time_plus_ttl_minus_margin(
    keeper_factory: Callable[..., LeaseKeeper], clock: ManualClock
) -> None:
    keeper = keeper_factory(10, margin=1.5)
    keeper.grant()
    assert keeper.deadline == pytest.approx(T0 + 10 - 1.5)
    clock.advance(4.0)
    slow_replies(keeper.client, clock, 3.0)
    deadline = keeper.renew_once()
    sent = T0 + 4.0
    assert clock.monotonic() == sent + 3.0
    assert deadline == keeper.deadline == pytest.approx(sent + 10 - 1.5)
    assert keeper.remaining() == pytest.approx(10 - 1.5 - 3.0)


def test_a_renewal_never_moves_the_deadline_back(
    keeper_factory: Callable[..., LeaseKeeper], clock: ManualClock
) -> None:
    keeper = keeper_factory(10)
    keeper.grant()
    first = keeper.deadline
    # Renewed at the very same instant: the deadline stays, it does not shrink or grow.
    assert keeper.renew_once() == pytest.approx(first)
    clock.advance(1.0)
    assert keeper.renew_once() == pytest.approx(first + 1.0)


def test_renewing_a_revoked_lease_is_lease_lost(
    keeper_factory: Callable[..., LeaseKeeper], etcd_client: EtcdClient
) -> None:
    keeper = keeper_factory(10)
    keeper.grant()
    etcd_client.revoke_lease(keeper.lease_id)
    before = keeper.deadline
    with pytest.raises(LeaseLost):
        keeper.renew_once()
    assert keeper.deadline == before


def test_stop_twice_is_harmless_and_the_first_revoke_counts(
    keeper_factory: Callable[..., LeaseKeeper], etcd_client: EtcdClient
) -> None:
    keeper = keeper_factory(10)
    lease = keeper.start()
    keeper.stop(revoke=True)
    keeper.stop(revoke=True)  # was: grpc ValueError "Cannot invoke RPC on closed channel"
    keeper.stop()
    assert etcd_client.keepalive_once(lease) <= 0, "the lease was revoked by the first stop"


@pytest.mark.parametrize(
    ("ttl", "margin", "problem"),
    [(1, None, "at least 2 seconds"), (5, 5.0, "must be below the TTL"), (5, 7.5, "must be below the TTL")],
)
def test_bad_ttl_or_margin_is_a_clear_error(
    etcd_config: EtcdConfig, ttl: int, margin: float | None, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        LeaseKeeper(etcd_config, ttl, margin=margin)
