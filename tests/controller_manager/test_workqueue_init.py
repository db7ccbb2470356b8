"""WorkQueue's constructor: which delays it accepts, the defaults it backs off with, its name.

Pins the argument checks exactly at their boundaries (a positive base delay,
a maximum not below the base) and the default back-off (5 ms doubling up to
60 s), so a changed comparison or default is noticed. No threads, no sleeps
beyond one short delayed delivery.
"""

from __future__ import annotations

import pytest

from controller_manager.workqueue import WorkQueue


@pytest.mark.parametrize("base", [0, 0.0, -0.001, -1])
def test_base_delay_must_be_positive(base: float) -> None:
    with pytest.raises(ValueError, match=r"^workqueue 'pods': base_delay must be positive, got "):
        WorkQueue("pods", base_delay=base)


@pytest.mark.parametrize("base", [1e-9, 0.5, 1.0, 2.0])
def test_any_positive_base_delay_is_accepted(base: float) -> None:
    q: WorkQueue[str] = WorkQueue("pods", base_delay=base, max_delay=base * 8)
    assert q._backoff(0) == base
    assert q._backoff(1) == base * 2
    assert q._backoff(10) == base * 8  # capped


def test_max_delay_below_base_delay_is_refused_equal_is_accepted() -> None:
    with pytest.raises(ValueError, match=r"^workqueue 'pods': max_delay \(0\.5\) must be >= base_delay \(1\.0\)$"):
        WorkQueue("pods", base_delay=1.0, max_delay=0.5)
    with pytest.raises(ValueError, match="max_delay"):
        WorkQueue("pods", base_delay=0.2, max_delay=0.19999)
    q: WorkQueue[str] = WorkQueue("pods", base_delay=0.25, max_delay=0.25)
    assert [q._backoff(n) for n in (0, 1, 5)] == [0.25, 0.25, 0.25]
    # The default maximum (60 s) is below a base delay of 100 s.
    with pytest.raises(ValueError, match="max_delay"):
        WorkQueue("pods", base_delay=100)


def test_defaults_back_off_from_five_milliseconds_doubling_up_to_a_minute() -> None:
    q: WorkQueue[str] = WorkQueue("pods")
    assert q.name == "pods"
    assert [q._backoff(n) for n in range(4)] == [0.005, 0.01, 0.02, 0.04]
    assert q._backoff(13) == 40.96
    assert q._backoff(14) == 60.0
    assert q._backoff(10_000) == 60.0
    # The first rate-limited add of a key arrives after the 5 ms base delay.
    q.add_rate_limited("k")
    assert q.num_requeues("k") == 1
    assert q.get(timeout=2.0) == "k"
    q.shutdown()


def test_integer_delays_are_kept_as_floats() -> None:
    q: WorkQueue[str] = WorkQueue("ints", base_delay=1, max_delay=4)
    assert [q._backoff(n) for n in range(4)] == [1.0, 2.0, 4.0, 4.0]
    assert isinstance(q._backoff(0), float) and isinstance(q._backoff(9), float)
    assert q.name == "ints" and len(q) == 0 and q.processing() == frozenset() and q.shutting_down is False
