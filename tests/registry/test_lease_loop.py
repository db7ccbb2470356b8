"""LeaseKeeper's keepalive thread (``_run``) against a real etcd: pacing, failure, recovery, loss.

The deadlines are read from a ManualClock, so each callback's argument is an
exact number. The thread itself waits in real time (``interval``), so the
tests shorten ``keeper.interval`` (a plain attribute: ``ttl / 3`` by
default) to run in well under a second. A renewal failure is a real one: the
keeper's etcd client is swapped for one pointing at a port nobody listens on,
then swapped back.

* every interval one keepalive, each reported with ``send time + TTL - margin``;
* a failure reports the error and the deadline that still holds, and the
  next attempt comes after ``min(interval, RETRY_WAIT)``, not a whole interval;
  after a success the normal pacing resumes;
* a revoked lease is reported once as lost, sets ``lost`` and ends the thread;
* ``stop`` ends the thread without further keepalives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from rangeshard.core.clock import ManualClock
from rangeshard.core.errors import RegistryUnavailable
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.process import free_port
from registry import LeaseKeeper
from registry.lease import RETRY_WAIT
from tests.helpers import wait_until

T0 = 1000.0
TTL = 30
MARGIN = 9.0  # default_margin(30)


class Calls:
    """What the keeper reported, with the real time of each report."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.renewed: list[tuple[float, float]] = []  # (real time, deadline)
        self.failures: list[tuple[float, Exception, float]] = []
        self.lost: list[float] = []
        self.hooks: dict[str, Callable[[], None]] = {}

    def on_renewed(self, deadline: float) -> None:
        with self.lock:
            self.renewed.append((time.monotonic(), deadline))
        if "renewed" in self.hooks:
            self.hooks["renewed"]()

    def on_failure(self, e: Exception, deadline: float) -> None:
        with self.lock:
            self.failures.append((time.monotonic(), e, deadline))
        if "failure" in self.hooks:
            self.hooks["failure"]()

    def on_lost(self) -> None:
        with self.lock:
            self.lost.append(time.monotonic())


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
def keeper(etcd_config: EtcdConfig, clock: ManualClock, calls: Calls) -> Iterator[LeaseKeeper]:
    k = LeaseKeeper(
        etcd_config,
        TTL,
        name="loop",
        clock=clock,
        on_renewed=calls.on_renewed,
        on_failure=calls.on_failure,
        on_lost=calls.on_lost,
    )
    real = k.client
    yield k
    k.client = real
    if not k._stop.is_set():  # the test did not stop it itself
        k.stop(revoke=True)


@pytest.fixture
def dead_client() -> Iterator[EtcdClient]:
    client = EtcdClient(EtcdConfig.from_urls(f"http://127.0.0.1:{free_port()}", timeout=0.5))
    yield client
    client.close()


def _count_keepalives(client: EtcdClient, when: Callable[[], bool]) -> list[float]:
    """Record the time of every keepalive ``client`` sends while ``when()`` holds."""
    sent: list[float] = []
    real = client.keepalive_once

    def keepalive_once(lease_id: int) -> int:
        if when():
            sent.append(time.monotonic())
        return real(lease_id)

    client.keepalive_once = keepalive_once  # type: ignore[method-assign]
    return sent


def test_keepalive_every_interval_each_reporting_send_time_plus_ttl_minus_margin(
    keeper: LeaseKeeper, clock: ManualClock, calls: Calls, etcd_client: EtcdClient
) -> None:
    assert keeper.margin == MARGIN
    keeper.interval = 0.05

    def renewed() -> None:
        clock.advance(1.0)  # each keepalive is sent one clock-second later
        if len(calls.renewed) == 3:
            keeper.interval = 20.0  # after the fourth renewal the thread waits 20 s: stop must wake it

    calls.hooks["renewed"] = renewed
    keeper.start()
    sent_after_stop = _count_keepalives(keeper.client, keeper._stop.is_set)
    wait_until(lambda: len(calls.renewed) >= 4, message="four renewals")
    lease = keeper.lease_id
    started = time.monotonic()
    keeper.stop(revoke=True)
    assert time.monotonic() - started < 5.0  # the 20 s wait was cut short, not waited out
    with calls.lock:
        deadlines = [d for _t, d in calls.renewed]
    assert deadlines == [T0 + k + TTL - MARGIN for k in range(4)]
    assert keeper.deadline == deadlines[-1]
    assert calls.failures == [] and calls.lost == [] and not keeper.lost.is_set()
    assert keeper._thread is not None and not keeper._thread.is_alive()
    assert sent_after_stop == []  # stop() sent no keepalive (the thread left its wait without one)
    assert etcd_client.lease_ttl(lease) <= 0  # and revoked the lease


def test_nothing_is_sent_before_the_first_interval(keeper: LeaseKeeper, calls: Calls) -> None:
    keeper.interval = 0.4
    started = time.monotonic()
    keeper.start()
    wait_until(lambda: calls.renewed, message="first renewal")
    assert calls.renewed[0][0] - started >= 0.35


def test_failure_reports_the_standing_deadline_and_retries_after_a_fifth_of_a_second(
    keeper: LeaseKeeper, clock: ManualClock, calls: Calls, dead_client: EtcdClient
) -> None:
    keeper.grant()
    real = keeper.client
    keeper.client = dead_client
    keeper.interval = 0.05

    def first_failure() -> None:
        # Back to the real etcd, and a long interval: the retry must not wait for it.
        keeper.client = real
        keeper.interval = 20.0
        clock.advance(5.0)
        calls.hooks.pop("failure")

    calls.hooks["failure"] = first_failure
    keeper.start()
    wait_until(lambda: calls.renewed, timeout=15.0, message="renewal after the failure")
    (failed_at, error, standing), *_ = calls.failures
    assert isinstance(error, RegistryUnavailable)
    assert standing == T0 + TTL - MARGIN  # the grant's deadline still holds
    (renewed_at, deadline), *_ = calls.renewed
    assert deadline == T0 + 5.0 + TTL - MARGIN
    assert RETRY_WAIT * 0.9 <= renewed_at - failed_at < 1.2  # min(interval, RETRY_WAIT), not the 20 s interval
    assert calls.lost == [] and not keeper.lost.is_set() and keeper._thread is not None and keeper._thread.is_alive()


def test_after_failures_a_success_resumes_the_normal_pacing(
    keeper: LeaseKeeper, calls: Calls, dead_client: EtcdClient
) -> None:
    keeper.grant()
    real = keeper.client
    keeper.client = dead_client
    keeper.interval = 0.05

    def failing() -> None:
        if len(calls.failures) >= 2:
            keeper.client = real

    calls.hooks["failure"] = failing
    keeper.start()
    wait_until(lambda: len(calls.renewed) >= 3, timeout=15.0, message="three renewals after recovering")
    assert len(calls.failures) == 2
    assert all(isinstance(e, RegistryUnavailable) for _t, e, _d in calls.failures)
    assert calls.lost == []


def test_a_revoked_lease_is_reported_lost_once_and_ends_the_thread(
    keeper: LeaseKeeper, calls: Calls, etcd_client: EtcdClient
) -> None:
    keeper.interval = 0.05
    keeper.start()
    sent_after_loss = _count_keepalives(keeper.client, keeper.lost.is_set)
    wait_until(lambda: calls.renewed, message="first renewal")
    etcd_client.revoke_lease(keeper.lease_id)
    assert keeper.lost.wait(10.0)
    assert keeper._thread is not None
    keeper._thread.join(5.0)
    assert not keeper._thread.is_alive()
    assert len(calls.lost) == 1 and calls.failures == []
    # Nothing after the loss: no keepalive sent, no renewal reported after it.
    assert sent_after_loss == []
    assert all(t < calls.lost[0] for t, _deadline in calls.renewed)


def test_without_callbacks_the_loop_renews_and_notices_loss(
    etcd_config: EtcdConfig, clock: ManualClock, etcd_client: EtcdClient, dead_client: EtcdClient
) -> None:
    keeper = LeaseKeeper(etcd_config, TTL, name="bare", clock=clock)
    try:
        keeper.grant()
        real = keeper.client
        keeper.client = dead_client
        keeper.interval = 0.05
        attempts = _count_keepalives(dead_client, lambda: True)
        keeper.start()
        wait_until(lambda: len(attempts) >= 3, timeout=15.0, message="three failed attempts")
        assert keeper._thread is not None and keeper._thread.is_alive()  # with no on_failure to call
        keeper.client = real
        clock.advance(2.0)
        wait_until(lambda: keeper.deadline == T0 + 2.0 + TTL - MARGIN, message="renewed deadline")
        etcd_client.revoke_lease(keeper.lease_id)
        assert keeper.lost.wait(10.0)
        keeper._thread.join(5.0)
        assert not keeper._thread.is_alive()
    finally:
        keeper.stop()
