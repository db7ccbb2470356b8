"""Background loops with a name that log their unexpected end: one helper for threads, one for tasks.

Also :func:`probe_loop_lag`, the task that measures how late an asyncio event
loop runs what is due (a busy or CPU-starved process: every await on it waits
that much longer).

Purpose
    Every background loop of ours (lease keepers, membership watches,
    informers, workers, the state machine, the proxy's caches...) must have a
    name and must say so when it dies of a bug, instead of vanishing.
    :func:`start_thread` and :func:`start_task` are the one way to start one;
    :func:`join_thread` the one way to wait for a thread's end when stopping it.

Invariants
    * The thread or task carries ``name`` (``threadName`` in every log line).
    * An exception that ends the loop is logged once at ERROR with its
      traceback, as ``<what>: thread died unexpectedly`` (``task exited
      unexpectedly``); ``on_death`` then runs (e.g. to stop dependent work) and
      the exception propagates (threading's excepthook sees it too).
    * A normal return and a task's cancellation are not logged.

Concurrency model
    Threads are daemons by default (shutdown stops them explicitly); tasks are
    created on the running loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def start_thread(
    name: str,
    target: Callable[[], None],
    *,
    what: str | None = None,
    on_death: Callable[[], None] | None = None,
    daemon: bool = True,
) -> threading.Thread:
    """Start ``target`` on a thread called ``name``; log (as ``what``) and run ``on_death`` if it raises."""
    label = what or name

    def run() -> None:
        try:
            target()
        except BaseException:
            log.exception("%s: thread died unexpectedly", label)
            if on_death is not None:
                on_death()
            raise

    thread = threading.Thread(target=run, name=name, daemon=daemon)
    thread.start()
    return thread


def join_thread(thread: threading.Thread | None, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``thread`` to end; nothing for ``None`` or the calling thread itself."""
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout)


def start_task(coro: Coroutine[Any, Any, T], name: str, *, what: str | None = None) -> asyncio.Task[T]:
    """Create a task called ``name`` on the running loop; log (as ``what``) if it ends with an exception."""
    label = what or name
    task = asyncio.create_task(coro, name=name)

    def done(t: asyncio.Task[T]) -> None:
        if not t.cancelled() and t.exception() is not None:
            log.error("%s: task exited unexpectedly", label, exc_info=t.exception())

    task.add_done_callback(done)
    return task


#: The loop-lag probe's period and the lag it reports at WARNING (at most once per ``LAG_WARNING_EVERY`` s).
LAG_PROBE_INTERVAL = 0.25
LAG_WARNING_SECONDS = 1.0
LAG_WARNING_EVERY = 60.0


async def probe_loop_lag(observe: Callable[[float], None], what: str, *, interval: float = LAG_PROBE_INTERVAL) -> None:
    """Forever: sleep ``interval``, then ``observe`` how much later than due the loop woke this task (seconds).

    A lag over ``LAG_WARNING_SECONDS`` is logged at WARNING (naming ``what``),
    at most once a minute: the process is blocked or starved of CPU, and each
    of its requests waits a multiple of that.
    """
    loop = asyncio.get_running_loop()
    warned_at = -LAG_WARNING_EVERY
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        now = loop.time()
        lag = max(0.0, now - due)
        observe(lag)
        if lag > LAG_WARNING_SECONDS and now - warned_at >= LAG_WARNING_EVERY:
            warned_at = now
            log.warning("%s: the event loop ran %.2fs late (blocked or starved of CPU)", what, lag)
