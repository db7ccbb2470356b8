"""One downstream watch of the shared watch cache.

Purpose
    A :class:`Watcher` is a replayed backlog followed by a bounded live queue,
    consumed by one HTTP watch response; the cache's dispatch appends to it
    synchronously and it wakes its consumer.

Invariants
    * The live queue holds at most ``watcher_queue_size`` events; when it is
      full the watcher is cut off (closed with a reason) instead of blocking
      the dispatch or anybody else.

Concurrency model
    Single event loop: ``push``/``close`` are called synchronously by the
    cache's dispatch; the consumer awaits an ``asyncio.Event``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from bisect import bisect_left
from collections import deque
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import orjson

from range_filter_proxy.cached import INITIAL_EVENTS_END, WatchFilter, event_line
from range_filter_proxy.metrics import LATENCY_BUCKETS

if TYPE_CHECKING:
    from range_filter_proxy.cache import WatchCache

log = logging.getLogger(__name__)


class Watcher:
    """One downstream watch: a replayed backlog, then a bounded live queue."""

    _ids = itertools.count(1)

    def __init__(
        self,
        cache: WatchCache,
        filt: WatchFilter,
        after_rv: int,
        backlog: list[bytes],
        *,
        bookmarks: bool,
        initial_events_end: int | None,
        timeout: float | None,
    ) -> None:
        self.id = next(self._ids)
        self.cache = cache
        self.filter = filt
        self.after_rv = after_rv
        self.backlog: deque[bytes] = deque(backlog)
        self.live: deque[tuple[bytes, float]] = deque()
        self.bookmarks = bookmarks
        self.initial_events_end = initial_events_end
        self.timeout = timeout
        self.closed = False
        self.close_reason = ""
        self.error_line: bytes | None = None
        self._wakeup = asyncio.Event()
        self._max_live = cache.settings.watcher_queue_size

    def offer(self, line: bytes, received: float) -> bool:
        """Queue a live event; ``False`` if the queue is full (the caller cuts the watcher)."""
        live = self.live
        if len(live) >= self._max_live:
            return False
        live.append((line, received))
        self._wakeup.set()
        return True

    def close(self, reason: str) -> None:
        """End the stream after what is queued (idempotent)."""
        if not self.closed:
            self.closed = True
            self.close_reason = reason
            self._wakeup.set()

    def cut(self, reason: str) -> None:
        """Drop everything queued and end the stream (the client resumes from its last RV)."""
        self.live.clear()
        self.backlog.clear()
        self.close(reason)

    def _bookmark(self, rv: int, initial_end: bool = False) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {INITIAL_EVENTS_END: "true"}
        info = self.cache.info
        return event_line(
            "BOOKMARK", orjson.dumps({"kind": info.kind, "apiVersion": info.gvr.group_version, "metadata": meta})
        )

    async def stream(self) -> AsyncGenerator[bytes, None]:
        """The bytes of the watch response; unregisters the watcher when it ends.

        Queued live events are sent in one chunk (up to 256 lines), so a busy
        watcher costs one write per burst instead of one per event. The
        timeout and the next bookmark share one timer handle, re-armed only
        when its due time changes (not on every wake-up).
        """
        cache = self.cache
        stats = cache.stats
        buckets = stats.latency_buckets
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout if self.timeout is not None else None
        interval = cache.settings.bookmark_interval
        next_bookmark = loop.time() + interval
        wakeup = self._wakeup
        timer: asyncio.TimerHandle | None = None
        timer_at: float | None = None

        def on_timer() -> None:
            nonlocal timer_at
            timer_at = None
            wakeup.set()

        try:
            if self.error_line is not None:
                yield self.error_line
                return
            while self.backlog:
                chunk = self.backlog.popleft()
                stats.bytes_out += len(chunk)
                yield chunk
            if self.initial_events_end is not None and not self.closed:
                chunk = self._bookmark(self.initial_events_end, initial_end=True)
                yield chunk
            live = self.live
            while True:
                while live:
                    parts: list[bytes] = []
                    sent = time.monotonic()
                    total = 0.0
                    while live and len(parts) < 256:
                        chunk, received = live.popleft()
                        delay = sent - received
                        buckets[bisect_left(LATENCY_BUCKETS, delay)] += 1
                        total += delay
                        parts.append(chunk)
                    stats.latency_sum += total
                    data = parts[0] if len(parts) == 1 else b"".join(parts)
                    stats.bytes_out += len(data)
                    yield data
                if self.closed:
                    return
                now = loop.time()
                if deadline is not None and now >= deadline:
                    return
                if self.bookmarks and now >= next_bookmark:
                    yield self._bookmark(max(cache.rv, self.after_rv))
                    next_bookmark = now + interval
                    continue
                due = deadline
                if self.bookmarks and (due is None or next_bookmark < due):
                    due = next_bookmark
                if due != timer_at:
                    if timer is not None:
                        timer.cancel()
                    timer = loop.call_at(due, on_timer) if due is not None else None
                    timer_at = due
                wakeup.clear()
                if live or self.closed:
                    continue
                await wakeup.wait()
        finally:
            if timer is not None:
                timer.cancel()
            cache.remove_watcher(self)
