"""One downstream watch of the shared watch cache.

Purpose
    A :class:`Watcher` is a replayed backlog followed by a bounded live queue,
    consumed by one HTTP watch response; the cache's dispatch appends to it
    synchronously.

    Two ways out for live events:

    * **task path**: the dispatch wakes the response's task, whose
      :meth:`Watcher.stream` takes everything queued and yields it as one
      chunk to the ASGI ``send`` (which waits while the connection's buffer
      is full);
    * **direct path** (issue 17): when the server offered a
      :class:`DirectSink` (the response's own chunked transport, see
      :mod:`range_filter_proxy.watchresponse`), the dispatch only marks the
      watcher dirty; once per event-loop turn the cache calls :meth:`flush`,
      which writes everything queued as one chunk straight to the sink -- no
      task switch, no ``asyncio.Event``, no generator step, no ASGI message
      per write. Whenever the sink cannot take data now (its buffer is above
      the high-water mark, the client is gone) or the task has a chunk of its
      own in flight, :meth:`flush` falls back to the task path, which waits
      for the connection to drain.

Invariants
    * The live queue holds at most ``watcher_queue_size`` events; when it is
      full the watcher is cut off (closed with a reason) instead of blocking
      the dispatch or anybody else.
    * Bytes leave in queue order on either path: the direct path is used only
      after the backlog and the initial-events bookmark are out, never while
      the task has a chunk in flight (``_in_flight``: set around every yield),
      and the task always empties the live queue before it writes a bookmark.
      When the stream ends the sink is dropped before the response's last
      chunk is sent.

Transitions of the output path (implemented in :meth:`stream` and :meth:`flush`)
    ``backlog`` --(backlog and initial bookmark sent, a sink offered)--> ``direct``;
    ``backlog`` --(no sink)--> ``task``;
    ``direct`` --(sink not ready / chunk in flight at a flush)--> one task-path
    send, then ``direct`` again; ``direct``/``task`` --(stream ends)--> ``done``.

Concurrency model
    Single event loop: ``offer``/``flush``/``close`` are called synchronously
    by the cache; the consumer task awaits an ``asyncio.Event``. :meth:`flush`
    runs in a callback of its own (``loop.call_soon``), so it only ever sees
    the task suspended: at a yield (a chunk in flight) or parked on its event.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from bisect import bisect_left
from collections import deque
from collections.abc import AsyncGenerator
from typing import Any, Protocol

import orjson

from range_filter_proxy.cached import INITIAL_EVENTS_END, CacheSettings, WatchFilter
from range_filter_proxy.metrics import LATENCY_BUCKETS, ResourceStats
from range_filter_proxy.resources import ResourceInfo
from rangeshard.core.kubeapi import event_line

log = logging.getLogger(__name__)


class Source(Protocol):
    """What a watcher needs of its cache (a :class:`~range_filter_proxy.watchcache.WatchCache`)."""

    info: ResourceInfo
    settings: CacheSettings
    stats: ResourceStats
    rv: int

    def schedule_flush(self, w: Watcher) -> None: ...
    def remove_watcher(self, w: Watcher) -> None: ...


class DirectSink(Protocol):
    """Where the direct path writes a watch's live chunks (the response's chunked transport)."""

    def ready(self) -> bool:
        """True if a chunk can be written now without waiting (buffer below high water, client connected)."""
        ...

    def write_chunk(self, parts: list[bytes], size: int) -> None:
        """Write ``parts`` (``size`` bytes in all) as one HTTP chunk."""
        ...


class Watcher:
    """One downstream watch: a replayed backlog, then a bounded live queue."""

    _ids = itertools.count(1)

    def __init__(
        self,
        cache: Source,
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
        #: Offered by the response before it starts the stream; used once the backlog is out.
        self.sink: DirectSink | None = None
        #: The sink while the direct path is on (see the module docstring).
        self._direct: DirectSink | None = None
        #: Waiting for the cache's end-of-turn flush.
        self._dirty = False
        #: The task has yielded a chunk whose send has not returned yet.
        self._in_flight = False

    def offer(self, line: bytes, received: float) -> bool:
        """Queue a live event; ``False`` if the queue is full (the caller cuts the watcher)."""
        live = self.live
        if len(live) >= self._max_live:
            return False
        live.append((line, received))
        if self._direct is None:
            self._wakeup.set()
        elif not self._dirty:
            self._dirty = True
            self.cache.schedule_flush(self)
        return True

    def flush(self) -> None:
        """Write what is queued straight to the sink, or hand it to the task (see the module docstring)."""
        self._dirty = False
        live = self.live
        if not live:
            return
        direct = self._direct
        if direct is None or self._in_flight or self.closed or not direct.ready():
            self._wakeup.set()
            return
        parts, size = self._take(len(live))
        direct.write_chunk(parts, size)
        self.cache.stats.direct_writes += 1

    def _take(self, limit: int) -> tuple[list[bytes], int]:
        """Up to ``limit`` queued lines and their total size; counts their delivery latency and bytes."""
        live = self.live
        stats = self.cache.stats
        buckets = stats.latency_buckets
        parts: list[bytes] = []
        sent = time.monotonic()
        total = 0.0
        size = 0
        while live and len(parts) < limit:
            chunk, received = live.popleft()
            delay = sent - received
            buckets[bisect_left(LATENCY_BUCKETS, delay)] += 1
            total += delay
            size += len(chunk)
            parts.append(chunk)
        stats.latency_sum += total
        stats.bytes_out += size
        return parts, size

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
            "BOOKMARK", orjson.dumps({"kind": info.kind, "apiVersion": info.gvr.api_version, "metadata": meta})
        )

    async def stream(self) -> AsyncGenerator[bytes, None]:
        """The bytes of the watch response; unregisters the watcher when it ends.

        Queued live events are sent in one chunk (up to 256 lines on the task
        path), so a busy watcher costs one write per burst instead of one per
        event. The timeout and the next bookmark share one timer handle,
        re-armed only when its due time changes (not on every wake-up).
        """
        cache = self.cache
        stats = cache.stats
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
                self._in_flight = True
                yield chunk
                self._in_flight = False
            if self.initial_events_end is not None and not self.closed:
                chunk = self._bookmark(self.initial_events_end, initial_end=True)
                self._in_flight = True
                yield chunk
                self._in_flight = False
            # Live events from here on: straight to the sink when there is one.
            self._direct = self.sink
            live = self.live
            while True:
                while live:
                    parts, _ = self._take(256)
                    stats.queued_writes += 1
                    self._in_flight = True
                    yield parts[0] if len(parts) == 1 else b"".join(parts)
                    self._in_flight = False
                if self.closed:
                    return
                now = loop.time()
                if deadline is not None and now >= deadline:
                    return
                if self.bookmarks and now >= next_bookmark:
                    self._in_flight = True
                    yield self._bookmark(max(cache.rv, self.after_rv))
                    self._in_flight = False
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
            # No direct write may follow the end of the stream (the response's last chunk comes next).
            self._direct = None
            self.sink = None
            if timer is not None:
                timer.cancel()
            cache.remove_watcher(self)
