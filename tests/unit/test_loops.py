"""rangeshard.core.loops: a named loop that dies says so once, runs on_death, and a normal end is silent."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from rangeshard.core import loops
from rangeshard.core.loops import join_thread, probe_loop_lag, start_task, start_thread


def test_a_thread_that_dies_is_logged_and_runs_on_death(caplog: pytest.LogCaptureFixture) -> None:
    died = threading.Event()
    seen: list[str] = []

    def boom() -> None:
        seen.append(threading.current_thread().name)
        raise RuntimeError("bug")

    old_hook = threading.excepthook
    threading.excepthook = lambda _args: None  # the re-raised exception: not this test's output
    try:
        with caplog.at_level(logging.ERROR, logger="rangeshard.core.loops"):
            start_thread("loop-under-test", boom, what="the loop", on_death=died.set).join(5)
    finally:
        threading.excepthook = old_hook
    assert seen == ["loop-under-test"] and died.is_set()
    [record] = [r for r in caplog.records if r.name == "rangeshard.core.loops"]
    assert record.getMessage() == "the loop: thread died unexpectedly" and record.exc_info is not None


def test_a_thread_that_returns_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    died = threading.Event()
    with caplog.at_level(logging.DEBUG, logger="rangeshard.core.loops"):
        start_thread("quiet", lambda: None, on_death=died.set).join(5)
    assert not died.is_set() and caplog.records == []


def test_a_task_that_fails_is_logged_but_not_one_cancelled(caplog: pytest.LogCaptureFixture) -> None:
    async def fail() -> None:
        raise ValueError("bug")

    async def forever() -> None:
        await asyncio.Event().wait()

    async def main() -> None:
        failing = start_task(fail(), "failing", what="the task")
        cancelled = start_task(forever(), "forever")
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(failing, cancelled, return_exceptions=True)
        assert failing.get_name() == "failing"

    with caplog.at_level(logging.DEBUG, logger="rangeshard.core.loops"):
        asyncio.run(main())
    assert [r.getMessage() for r in caplog.records] == ["the task: task exited unexpectedly"]


def test_the_loop_lag_probe_reports_a_blocked_loop_and_warns_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop blocked for 0.3 s is observed as ~0.3 s late; a lag over the warning level is one WARNING."""
    monkeypatch.setattr(loops, "LAG_WARNING_SECONDS", 0.2)
    seen: list[float] = []

    async def scenario() -> None:
        probe = asyncio.create_task(probe_loop_lag(seen.append, "the test loop", interval=0.05))
        try:
            while len(seen) < 2:
                await asyncio.sleep(0.01)
            for _ in range(2):
                time.sleep(0.3)  # block the loop: the probe's wake-up is due meanwhile
                n = len(seen)
                while len(seen) == n:
                    await asyncio.sleep(0.01)
        finally:
            probe.cancel()

    with caplog.at_level(logging.WARNING, logger="rangeshard.core.loops"):
        asyncio.run(scenario())
    assert max(seen) >= 0.2, seen
    assert min(seen) >= 0.0
    warnings = [r.getMessage() for r in caplog.records if r.name == "rangeshard.core.loops"]
    assert len(warnings) == 1, warnings  # two blocks, one warning a minute
    assert warnings[0].startswith("the test loop: the event loop ran ") and "late" in warnings[0]


def test_join_thread_waits_for_the_end_and_passes_over_none_and_the_calling_thread() -> None:
    release = threading.Event()
    thread = start_thread("joined", lambda: release.wait(5))
    join_thread(thread, 0.05)
    assert thread.is_alive()  # bounded by the timeout
    release.set()
    join_thread(thread, 5)
    assert not thread.is_alive()
    join_thread(None, 5)
    seen: list[BaseException] = []

    def stop_from_inside() -> None:
        try:
            join_thread(threading.current_thread(), 5)  # a loop stopping itself must not deadlock or raise
        except BaseException as e:
            seen.append(e)

    start_thread("self-stop", stop_from_inside).join(5)
    assert seen == []
