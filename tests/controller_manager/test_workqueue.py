"""WorkQueue: client-go semantics (dirty + processing sets), delays, back-off, shutdown, wait_idle."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict

import pytest

from controller_manager.workqueue import WorkQueue

# Generous upper bound for "this should happen promptly" on a loaded CI machine.
SLACK = 2.0


def drain(q: WorkQueue[str]) -> list[str]:
    """Get and finish every queued key, in order."""
    out: list[str] = []
    while len(q):
        key = q.get(timeout=0)
        assert key is not None
        out.append(key)
        q.done(key)
    return out


def test_fifo_for_distinct_keys() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    for k in ["c", "a", "b", "d"]:
        q.add(k)
    assert len(q) == 4
    assert drain(q) == ["c", "a", "b", "d"]


def test_dirty_keys_are_deduplicated() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    for k in ["a", "b", "a", "a", "c", "b"]:
        q.add(k)
    assert len(q) == 3
    assert drain(q) == ["a", "b", "c"]


def test_key_added_while_processing_is_requeued_after_done() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add("a")
    q.add("b")
    assert q.get(timeout=0) == "a"
    assert q.processing() == frozenset({"a"})
    q.add("a")  # only marks it dirty: it must not be handed to a second worker
    q.add("a")
    assert len(q) == 1
    assert q.get(timeout=0) == "b"
    assert q.get(timeout=0) is None  # "a" is still processing
    q.done("a")
    assert len(q) == 1
    assert q.get(timeout=0) == "a"
    q.done("a")
    q.done("b")
    assert len(q) == 0
    assert q.processing() == frozenset()


def test_done_without_readd_does_not_requeue() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.done("a")
    assert len(q) == 0
    assert q.get(timeout=0.01) is None


def test_done_for_unknown_key_is_ignored() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.done("never")
    assert len(q) == 0 and q.processing() == frozenset()


def test_get_times_out() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    t0 = time.monotonic()
    assert q.get(timeout=0.05) is None
    assert 0.04 <= time.monotonic() - t0 < SLACK


def test_invalid_delays_are_rejected() -> None:
    with pytest.raises(ValueError, match="base_delay"):
        WorkQueue("t", base_delay=0)
    with pytest.raises(ValueError, match="max_delay"):
        WorkQueue("t", base_delay=1.0, max_delay=0.5)


def test_add_after_delays_the_key() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    t0 = time.monotonic()
    q.add_after("a", 0.05)
    assert len(q) == 0
    assert q.get(timeout=SLACK) == "a"
    assert time.monotonic() - t0 >= 0.05
    q.done("a")
    q.shutdown()


def test_add_after_zero_adds_at_once() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add_after("a", 0)
    q.add_after("b", -1)
    assert drain(q) == ["a", "b"]


def test_add_after_keeps_the_earlier_ready_time_and_delivers_once() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    t0 = time.monotonic()
    q.add_after("a", 10.0)
    q.add_after("a", 0.02)
    q.add_after("a", 5.0)  # later than the pending one: dropped
    assert q.get(timeout=SLACK) == "a"
    assert 0.02 <= time.monotonic() - t0 < SLACK
    q.done("a")
    assert q.get(timeout=0.1) is None
    q.shutdown()


def test_delayed_keys_come_out_in_ready_order() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add_after("late", 0.06)
    q.add_after("early", 0.02)
    q.add("now")
    got = []
    for _ in range(3):
        k = q.get(timeout=SLACK)
        assert k is not None
        got.append(k)
        q.done(k)
    assert got == ["now", "early", "late"]
    q.shutdown()


def test_delayed_add_of_a_processing_key_only_marks_it_dirty() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add("a")
    assert q.get() == "a"
    q.add_after("a", 0.01)
    q.add_after("b", 0.03)
    assert q.get(timeout=SLACK) == "b"  # "a" fired first, but it is still processing
    assert len(q) == 0
    q.done("b")
    q.done("a")
    assert q.get(timeout=0) == "a"
    q.done("a")
    assert q.get(timeout=0.05) is None
    q.shutdown()


def test_exponential_backoff_timing_and_forget() -> None:
    base = 0.02
    q: WorkQueue[str] = WorkQueue("t", base_delay=base, max_delay=0.1)
    expected = [0.02, 0.04, 0.08, 0.1, 0.1]  # capped at max_delay
    for n, delay in enumerate(expected):
        assert q.num_requeues("k") == n
        t0 = time.monotonic()
        q.add_rate_limited("k")
        assert q.get(timeout=delay + SLACK) == "k"
        elapsed = time.monotonic() - t0
        assert delay <= elapsed < delay + SLACK, (n, delay, elapsed)
        q.done("k")
    assert q.num_requeues("k") == len(expected)
    q.forget("k")
    assert q.num_requeues("k") == 0
    before = time.monotonic()
    q.add_rate_limited("k")
    after = time.monotonic()
    # Back to the base delay (not max_delay): read the scheduled time, no wall-clock upper bound to flake.
    ready_at = q._waiting["k"][0]
    assert ready_at - after <= base <= ready_at - before
    assert q.get(timeout=SLACK) == "k"
    assert time.monotonic() - before >= base
    q.done("k")
    q.shutdown()


def test_backoff_counters_are_per_key_and_huge_counts_do_not_overflow() -> None:
    q: WorkQueue[str] = WorkQueue("t", base_delay=0.001, max_delay=0.002)
    q.add_rate_limited("a")
    q.add_rate_limited("a")
    assert q.num_requeues("a") == 2
    assert q.num_requeues("b") == 0
    assert q._backoff(10_000) == 0.002
    q.shutdown()


def test_shutdown_wakes_blocked_getters() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    results: list[str | None] = []
    lock = threading.Lock()

    def getter() -> None:
        k = q.get()  # no timeout: only shutdown can end this
        with lock:
            results.append(k)

    threads = [threading.Thread(target=getter) for _ in range(4)]
    for t in threads:
        t.start()
    q.shutdown()
    for t in threads:
        t.join(timeout=SLACK)
        assert not t.is_alive()
    assert results == [None] * 4
    assert q.shutting_down


def test_after_shutdown_adds_are_ignored_and_delayed_adds_dropped() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add("queued")
    q.add_after("delayed", 0.02)
    q.shutdown()
    q.add("late")
    q.add_after("late2", 0)
    q.add_rate_limited("late3")
    # Keys queued before the shutdown are still handed out, then None.
    assert q.get(timeout=0) == "queued"
    q.done("queued")
    assert q.get(timeout=0.1) is None
    assert q.get() is None  # shut down and empty: does not block
    q.shutdown()  # idempotent


def test_key_dirtied_while_processing_is_still_delivered_after_shutdown() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add("a")
    assert q.get() == "a"
    q.add("a")
    q.shutdown()
    q.done("a")
    assert q.get() == "a"
    q.done("a")
    assert q.get() is None


def test_wait_idle() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add("a")
    q.add("b")
    assert q.get() == "a"
    assert q.get() == "b"
    # Nothing matching is processing: returns at once.
    assert q.wait_idle(lambda k: k == "z", timeout=0)
    t0 = time.monotonic()
    assert not q.wait_idle(lambda k: k == "a", timeout=0.03)
    assert time.monotonic() - t0 >= 0.03

    started = threading.Event()
    result: list[bool] = []

    def waiter() -> None:
        started.set()
        result.append(q.wait_idle(lambda k: k in ("a", "b"), timeout=SLACK * 5))

    t = threading.Thread(target=waiter)
    t.start()
    assert started.wait(SLACK)
    q.done("a")  # "b" still processing
    assert q.processing() == frozenset({"b"})
    q.done("b")
    t.join(timeout=SLACK * 5)
    assert not t.is_alive()
    assert result == [True]


def test_wait_idle_ignores_queued_keys() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add("a")  # queued, not processing
    assert q.wait_idle(lambda k: True, timeout=0)


def test_stress_one_key_is_never_held_by_two_workers() -> None:
    """Many producers and workers: per key at most one holder, and no add is lost."""
    q: WorkQueue[int] = WorkQueue("stress", base_delay=0.0005, max_delay=0.002)
    n_keys, n_producers, adds_per_producer, n_workers = 20, 4, 1500, 8
    stats = threading.Lock()
    holders: dict[int, int] = defaultdict(int)
    max_holders: dict[int, int] = defaultdict(int)
    clock = 0
    last_add: dict[int, int] = {}
    starts: dict[int, list[int]] = defaultdict(list)
    errors: list[BaseException] = []

    def tick() -> int:
        nonlocal clock
        clock += 1
        return clock

    def producer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for i in range(adds_per_producer):
                key = rng.randrange(n_keys)
                with stats:
                    last_add[key] = max(last_add.get(key, 0), tick())
                if i % 10 == 0:
                    q.add_rate_limited(key)
                else:
                    q.add(key)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def worker() -> None:
        try:
            while (key := q.get()) is not None:
                with stats:
                    starts[key].append(tick())
                    holders[key] += 1
                    max_holders[key] = max(max_holders[key], holders[key])
                time.sleep(0)  # yield, so other workers run while we "hold" the key
                with stats:
                    holders[key] -= 1
                q.forget(key)
                q.done(key)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    workers = [threading.Thread(target=worker, name=f"w{i}") for i in range(n_workers)]
    producers = [threading.Thread(target=producer, args=(i,)) for i in range(n_producers)]
    for t in workers + producers:
        t.start()
    for t in producers:
        t.join(timeout=30)
        assert not t.is_alive()
    # Let rate-limited adds (<= 2 ms) fire and the workers drain everything.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if q.wait_idle(lambda k: True, timeout=1) and len(q) == 0:
            with q._cond:
                pending = bool(q._waiting)
            if not pending:
                break
    q.shutdown()
    for t in workers:
        t.join(timeout=SLACK * 5)
        assert not t.is_alive()

    assert not errors
    assert max(max_holders.values()) == 1, dict(max_holders)
    assert all(v == 0 for v in holders.values())
    # Level triggering: after the last add of every key, a processing of that key started.
    for key, added_at in last_add.items():
        assert starts[key] and max(starts[key]) > added_at, key
    assert sum(len(s) for s in starts.values()) <= n_producers * adds_per_producer
