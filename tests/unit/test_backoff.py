"""The one retry policy (rangeshard.core.backoff): bounds, jitter, reset after a long success."""

from __future__ import annotations

import random

import pytest

from rangeshard.core.backoff import Backoff
from rangeshard.core.clock import ManualClock
from rangeshard.core.errors import ConfigError


def test_delays_double_up_to_the_maximum() -> None:
    b = Backoff(0.5, 5.0)
    assert [b.next_delay() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert b.failures == 7


def test_factor_one_is_a_constant_interval() -> None:
    b = Backoff(1.0, 1.0, factor=1.0)
    assert {b.next_delay() for _ in range(5)} == {1.0}


def test_jitter_stays_within_its_range() -> None:
    b = Backoff(1.0, 8.0, jitter=0.5, rand=random.Random(7).random)
    nominal = [1.0, 2.0, 4.0, 8.0] + [8.0] * 200
    delays = [b.next_delay() for _ in nominal]
    assert all(d * 0.5 <= got <= d * 1.5 for d, got in zip(nominal, delays, strict=True))
    assert len({round(x, 9) for x in delays[4:]}) > 100  # really spread, not one value


@pytest.mark.parametrize("r", [0.0, 0.999999])
def test_jitter_extremes(r: float) -> None:
    b = Backoff(2.0, 2.0, jitter=0.25, rand=lambda: r)
    assert 1.5 <= b.next_delay() <= 2.5


def test_reset_and_immediate_success() -> None:
    b = Backoff(0.2, 5.0)
    b.next_delay()
    b.next_delay()
    b.reset()
    assert (b.next_delay(), b.failures) == (0.2, 1)
    b.next_delay()
    b.succeeded()  # no reset_after: a success resets at once
    assert (b.failures, b.next_delay()) == (0, 0.2)


def test_success_resets_only_after_it_lasted_reset_after() -> None:
    clock = ManualClock()
    b = Backoff(1.0, 30.0, reset_after=60.0, clock=clock)
    assert [b.next_delay() for _ in range(3)] == [1.0, 2.0, 4.0]
    started = clock.monotonic()
    b.succeeded(started)
    clock.advance(5)  # a short run: keep backing off
    assert b.next_delay() == 8.0
    b.succeeded(clock.monotonic())
    clock.advance(60)  # a long run: start over
    assert b.next_delay() == 1.0
    clock.advance(120)  # a success counts for the next delay only
    assert b.next_delay() == 2.0


@pytest.mark.parametrize(
    "kwargs",
    [{"initial": 0, "maximum": 1}, {"initial": 2, "maximum": 1}, {"factor": 0.5}, {"jitter": 1.0}, {"jitter": -0.1}],
)
def test_bad_parameters_are_config_errors(kwargs: dict[str, float]) -> None:
    args = {"initial": 1.0, "maximum": 2.0, **kwargs}
    with pytest.raises(ConfigError, match="backoff"):
        Backoff(**args)
