"""The watch cache of one resource: its store, its event window, its filtered downstream watches.

Purpose
    A :class:`WatchCache` keeps the current state of one resource (objects
    with precomputed shard hashes and their JSON serialisation) and a window of
    recent events, fed by exactly one upstream list+watch. Downstream lists and
    watches -- each with its own namespace, label, field and ``shardSelector``
    filter -- are answered from it, so the upstream sees one watch per
    resource however many controller instances run. The upstream loop that
    feeds it is :mod:`range_filter_proxy.reflector`; the
    :class:`~range_filter_proxy.cache.CacheManager` starts caches on first
    use (or eagerly for configured resources). The values it stores are in
    :mod:`range_filter_proxy.cached`, one downstream watch is a
    :class:`~range_filter_proxy.watcher.Watcher`.

Semantics (those of kube-apiserver's cacher, see docs/proxy.md)
    * The history holds every event after ``history_start_rv``; a watch from
      ``N >= history_start_rv`` replays the events with ``rv > N``; an older
      ``N`` is answered with an ``ERROR`` event carrying a 410 ``Status``.
    * The window keeps at least ``history_events`` events or
      ``history_seconds`` of them, whichever is more, up to ``history_hard_cap``
      events and ``history_max_bytes`` bytes (:func:`~range_filter_proxy.cached.event_bytes`
      each): the byte bound wins over both minimums.
    * A (re)list reads the upstream in pages (``limit``/``continue``, one
      consistent snapshot) and replaces the store, clears the history (``history_start_rv``
      becomes the list's RV) and closes every downstream watch, as kube's
      cacher does; clients re-watch and get 410 if their RV is older.
    * A modification that moves an object into a watcher's filter is sent as
      ``ADDED``, out of it as ``DELETED`` (of the previous state, at the new RV).
    * A cache started on demand whose relist gets 404 (its CRD was deleted)
      closes its watchers, empties itself, answers 404 and is forgotten by
      the ``CacheManager`` with its discovery answer; a configured one
      keeps relisting.
    * Observers (:class:`CacheObserver`, e.g. the progress tracker of
      :mod:`range_filter_proxy.progress`) see every applied object event and
      every store replacement, synchronously, in the same order as the
      watchers; an observer that raises is logged and does not stop the cache.

Invariants
    * ``rv`` never decreases between relists; every event in the history has
      ``history_start_rv < event.rv <= rv``, in non-decreasing order.
    * Every event is serialised at most once per variant (``ADDED``/``MODIFIED``/
      ``DELETED`` of the current or previous object), whatever the number of watchers.
    * A watcher's live queue holds at most ``watcher_queue_size`` events; when
      it is full the watcher is cut off (closed) instead of blocking anybody.

Concurrency model
    Single event loop. Applying an upstream event, dispatching it to every
    watcher and registering a new watcher (with its replayed backlog) are
    synchronous (no ``await``), so no event is lost or duplicated between
    them. One named background task per cache runs the upstream loop
    (:func:`~range_filter_proxy.reflector.reflect`); each
    downstream watch is an async generator consuming its own bounded queue,
    or, for live events under uvicorn's httptools protocol, is written by the
    cache's end-of-turn flush (:meth:`WatchCache.schedule_flush`: one
    ``call_soon`` callback per event-loop turn; see
    :mod:`range_filter_proxy.watcher`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import orjson

from hashing import ShardBy
from range_filter_proxy.cached import (
    CachedEvent,
    CachedObject,
    CacheSettings,
    WatchFilter,
    event_bytes,
    parse_rv,
)
from range_filter_proxy.dispatch import DispatchIndex
from range_filter_proxy.errors import ApiError, UpstreamError, gone
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.reflector import reflect
from range_filter_proxy.resources import ResourceInfo
from range_filter_proxy.rootchain import RootChain
from range_filter_proxy.storeindex import StoreIndex
from range_filter_proxy.upstream import ListResult, Upstream
from range_filter_proxy.watcher import Watcher
from range_filter_proxy.watchstream import WatchEvent
from range_filter_proxy.wire import OBJECT_EVENTS
from rangeshard.core.kubeapi import event_line, expired_status, too_old_message
from rangeshard.core.loops import start_task

log = logging.getLogger(__name__)


def _root_paths(paths: Iterable[str]) -> list[str]:
    return [p for p in paths if ShardBy.of_path(p) is ShardBy.ROOT]


class CacheObserver(Protocol):
    """Something that follows a cache's store (called on the event loop, synchronously; must be quick)."""

    def applied(self, etype: str, obj: CachedObject, received: float) -> None:
        """An object event was applied (``received``: its ``time.monotonic()`` arrival)."""

    def replaced(self, objects: Mapping[tuple[str, str], CachedObject]) -> None:
        """The store was replaced (a relist; ``{}`` when the resource went away)."""


class WatchCache:
    """The cache of one resource, fed by one upstream list+watch."""

    def __init__(
        self,
        info: ResourceInfo,
        upstream: Upstream,
        metrics: ProxyMetrics,
        settings: CacheSettings,
        on_gone: Callable[[WatchCache], None] | None = None,
    ) -> None:
        self.info = info
        #: Called once if a relist finds the resource gone upstream (404): the cache has then
        #: closed its watchers, dropped its store and ended its upstream loop (``gone`` is set).
        self.on_gone = on_gone
        self.gone = False
        self.upstream = upstream
        self.metrics = metrics
        self.settings = settings
        self.objects: dict[tuple[str, str], CachedObject] = {}
        #: ``objects``' keys by shard hash, so a select with a ``shardSelector`` visits only its
        #: slice (:mod:`range_filter_proxy.storeindex`); updated with ``objects``, never apart.
        self.store_index = StoreIndex()
        self.history: deque[CachedEvent] = deque()
        #: The bytes the history's events are counted at (:func:`event_bytes`), kept with ``history``.
        self.history_bytes = 0
        self.history_start_rv = 0
        self.rv = 0
        #: The largest resourceVersion of the upstream's own events and bookmarks (``rv`` may be
        #: ahead of it only by a root move filed before the upstream got there).
        self.upstream_rv = 0
        #: The placement by owner chain of this cache's objects (``by: root``), once asked for.
        self.chain: RootChain | None = None
        self.synced = asyncio.Event()
        self.watchers: dict[int, Watcher] = {}
        #: Set (and dropped) when ``rv`` advances; created only while somebody waits for it.
        self._progress: asyncio.Event | None = None
        #: The watchers by shard range; ``None`` after one was added or removed, rebuilt at the
        #: next dispatch (once for a run of watch requests, never per event).
        self._index: DispatchIndex | None = DispatchIndex(())
        self._task: asyncio.Task[None] | None = None
        self._label = info.gvr.label
        #: Hot-path counters (plain integers; see range_filter_proxy.metrics).
        self.stats = metrics.stats(self._label)
        #: Watchers with live events for the end-of-turn flush (direct path), and whether it is scheduled.
        self._dirty: list[Watcher] = []
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        #: History length above which eviction is considered (checked inline per event).
        self._evict_above = min(settings.history_events, settings.history_hard_cap)
        #: Followers of the store (:meth:`add_observer`); empty for almost every cache.
        self.observers: list[CacheObserver] = []

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the upstream loop (idempotent)."""
        if self._task is None:
            feed = reflect(self, self.upstream, self.metrics, self.settings)
            self._task = start_task(feed, f"watch-cache:{self.info.gvr}", what=f"watch cache {self.info.gvr}")

    async def stop(self) -> None:
        """Stop the upstream loop and close every downstream watch."""
        for w in list(self.watchers.values()):
            w.close("proxy shutting down")
        if self.chain is not None:
            self.chain.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def replace(self, listed: ListResult) -> None:
        """Install a fresh list: new store, empty history, every watcher closed."""
        built = (CachedObject.build(item, self.info) for item in listed.items)
        self.install({o.key: o for o in built}, listed.resource_version)

    def install(self, objects: dict[tuple[str, str], CachedObject], resource_version: str) -> None:
        """Install a fresh list (the upstream loop's): new store, empty history, every watcher closed."""
        rv = parse_rv(resource_version) if resource_version else 0
        if self.chain is not None:
            self.chain.place_all(objects)
        self._reset(objects, "watch cache relisted")
        self.rv = self.upstream_rv = rv
        self.history_start_rv = rv
        self.synced.set()
        self._notify_progress()
        # The cached objects live long and hold no reference cycles: move them out of
        # the cyclic collector's sight, so full collections stay cheap (seconds at 100k objects).
        gc.freeze()
        log.info("watch cache %s synced: %d objects at resourceVersion %d", self.info.gvr, len(objects), rv)

    def vanished(self, reason: str) -> bool:
        """The resource is gone upstream (e.g. its CRD was deleted): a cache started on demand ends every watch,
        forgets everything and tells ``on_gone`` (``True``: its upstream loop ends); a configured one keeps going."""
        if self.on_gone is None:
            return False
        log.info("watch cache %s dropped: %s", self.info.gvr, reason)
        self.gone = True
        self._reset({}, "resource no longer served by the upstream")
        self.synced.set()  # wakes requests waiting for a first sync: they answer 404 (wait_synced)
        self.on_gone(self)
        return True

    def _reset(self, objects: dict[tuple[str, str], CachedObject], reason: str) -> None:
        """Close and forget every watcher (``reason``), replace the store, clear the history."""
        for w in list(self.watchers.values()):
            w.close(reason)
        self.watchers.clear()
        self._index = DispatchIndex(())
        self.metrics.downstream_watches.labels(self._label).set(0)
        self.objects = objects
        self.store_index.rebuild(objects)
        self.history.clear()
        self.history_bytes = self.stats.history_bytes = self.stats.history_events = 0
        for observer in self.observers:
            try:
                observer.replaced(objects)
            except Exception:
                log.exception("watch cache %s: an observer failed on a relist", self.info.gvr)

    def add_observer(self, observer: CacheObserver) -> None:
        """Follow the store from now on; a synced cache hands its current store at once (``replaced``)."""
        if observer in self.observers:
            return
        self.observers.append(observer)
        if self.synced.is_set():
            observer.replaced(self.objects)

    def remove_observer(self, observer: CacheObserver) -> None:
        with contextlib.suppress(ValueError):
            self.observers.remove(observer)

    def _observe(self, etype: str, obj: CachedObject, received: float) -> None:
        for observer in self.observers:
            try:
                observer.applied(etype, obj, received)
            except Exception:
                log.exception("watch cache %s: an observer failed on %s %s", self.info.gvr, etype, obj.key)

    def apply(self, event: WatchEvent) -> None:
        """Apply one upstream watch event and dispatch it to every watcher."""
        if event.type == "BOOKMARK":
            self._bookmark(event)
            return
        etype = event.type
        if etype not in OBJECT_EVENTS:
            raise UpstreamError(f"{self.info.gvr}: unknown watch event type {etype!r}")
        received = time.monotonic()
        self.stats.events_received += 1
        objects = self.objects
        wire, data = event.wire, event.data
        if wire is not None and data is not None and wire.metadata is not None:
            meta = wire.metadata
            key = (meta.namespace, meta.name)
            prev = objects.get(key)
            cur = CachedObject.from_wire(wire, data, self.info, prev, event.start, event.end, event.line_type)
        else:
            cur = CachedObject.build(event.object, self.info, event.raw, objects)
            key = cur.key
            prev = objects.get(key)
        rv = cur.rv
        fresh = rv > self.upstream_rv
        if fresh:
            self.upstream_rv = rv
        else:
            if etype != "DELETED" or prev is None:
                log.debug("%s: ignoring event at rv %d <= cache rv %d", self.info.gvr, rv, self.upstream_rv)
                return
            # A deletion reported with the object's last RV rather than the deletion's:
            # never keep a deleted object; file the event at the current RV.
            log.warning("%s: DELETED event at stale rv %d (cache rv %d)", self.info.gvr, rv, self.rv)
            rv = cur.rv = self.rv
        late = False
        if self.chain is not None:
            rv, prev, cur, late = self._placed(self.chain, etype, key, rv, prev, cur, fresh)
        if etype == "DELETED":
            if prev is not None:
                del objects[key]
                self.store_index.removed(key, prev.hashes)
        elif prev is not None:
            objects[key] = cur  # the entry keeps its key
            self.store_index.moved(key, prev.hashes, cur.hashes)
        else:
            # A new entry gets the object's interned key, shared with the store index.
            stored = cur.key
            objects[stored] = cur
            self.store_index.added(stored, cur.hashes)
        if self.observers:
            self._observe(etype, cur, received)
        ev = CachedEvent.of(etype, rv, cur, prev, received)
        if late:
            ev.late = True
        self.rv = rv
        self._file(ev, received)
        if self._progress is not None:
            self._notify_progress()

    def _bookmark(self, event: WatchEvent) -> None:
        meta = event.object.get("metadata")
        try:
            rv = parse_rv(meta.get("resourceVersion") if isinstance(meta, dict) else None)
        except ValueError as e:
            raise UpstreamError(f"{self.info.gvr}: bookmark without a valid resourceVersion") from e
        if self.chain is not None and self.chain.pending:
            self.chain.release(rv, inclusive=True)
        self.upstream_rv = max(self.upstream_rv, rv)
        if rv > self.rv:
            self.rv = rv
            self._notify_progress()

    def _file(self, ev: CachedEvent, now: float) -> None:
        """Keep ``ev`` in the history (evicting the oldest past the window) and dispatch it."""
        history = self.history
        history.append(ev)
        self.history_bytes += event_bytes(ev)
        if len(history) > self._evict_above or self.history_bytes > self.settings.history_max_bytes:
            self._evict(now)
        stats = self.stats
        stats.history_events = len(history)
        stats.history_bytes = self.history_bytes
        self._dispatch(ev)

    # ---- placement by owner chain ------------------------------------------------------------

    def _placed(
        self,
        chain: RootChain,
        etype: str,
        key: tuple[str, str],
        rv: int,
        prev: CachedObject | None,
        cur: CachedObject,
        fresh: bool,
    ) -> tuple[int, CachedObject | None, CachedObject, bool]:
        """An event of a root-placed cache: pending moves before it, its RV, its root (see rootchain)."""
        late = False
        if fresh:
            if chain.pending:
                chain.release(rv)  # the moves of intermediates' events before this one go first
                prev = self.objects.get(key)  # as a move may have left it
            if rv <= self.rv:  # a move was filed past this event's RV (its hold ran out)
                self.metrics.root_late_events.labels(self._label).inc()
                rv = cur.rv = self.rv
                late = True
        # The root as the chain resolves it now; a deletion leaves the ranges that hold it (prev's root).
        cur = chain.place(etype, cur)
        if etype == "DELETED" and prev is not None:
            cur.hashes = prev.hashes
        return rv, prev, cur, late

    def set_chain(self, chain: RootChain) -> None:
        """Place this cache's objects by ``chain`` from now on (every object re-filed, no event sent)."""
        chain.start()
        chain.place_all(self.objects)
        self.store_index.rebuild(self.objects)
        self.chain = chain
        chain.started_rv = self.rv

    def move(self, keys: Iterable[tuple[str, str]], rv: int) -> None:
        """Re-place ``keys`` by their chain at ``rv`` (at least the cache's): a move of each whose root changed.

        A moved object is sent as ``DELETED`` to the watches of the range it
        left and ``ADDED`` to those of the range it entered, both at the
        move's resourceVersion (:attr:`CachedEvent.moved`); the history keeps
        the move so a watch resumed before it replays it.
        """
        chain = self.chain
        if chain is None:
            return
        if rv > self.rv:
            self.rv = rv
            self._notify_progress()
        rv = self.rv
        objects = self.objects
        now = time.monotonic()
        moved = 0
        for key in sorted(keys):
            prev = objects.get(key)
            if prev is None:
                continue
            cur = chain.rooted(key, prev)
            if cur is prev:
                continue
            objects[key] = cur
            self.store_index.moved(key, prev.hashes, cur.hashes)
            ev = CachedEvent.of("MODIFIED", rv, cur, prev, now)
            ev.moved = True
            self._file(ev, now)
            moved += 1
        if moved:
            self.metrics.root_moves.labels(self._label).inc(moved)
            log.debug("%s: %d objects moved with their root at rv %d", self.info.gvr, moved, rv)

    def _evict(self, now: float) -> None:
        s = self.settings
        history = self.history
        n = len(history)
        cap, keep, seconds, max_bytes = s.history_hard_cap, s.history_events, s.history_seconds, s.history_max_bytes
        size = self.history_bytes
        while n and (n > cap or size > max_bytes or (n > keep and now - history[0].received > seconds)):
            oldest = history.popleft()
            self.history_start_rv = oldest.rv
            size -= event_bytes(oldest)
            n -= 1
        self.history_bytes = size

    def _dispatch(self, ev: CachedEvent) -> None:
        index = self._index
        if index is None:
            index = self._index = DispatchIndex(self.watchers.values())
        targets = index.candidates(ev)
        delivered = 0
        filtered = index.size - len(targets)  # the index proved they filter it out
        for w in targets:
            if ev.rv <= w.after_rv and not (ev.late and ev.rv == w.after_rv):
                continue
            variant = w.filter.variant(ev)
            if variant is None:
                filtered += 1
                continue
            if w.offer(ev.line(variant), ev.received):
                delivered += 1
            else:
                log.warning("cutting off watcher %d of %s: %d events unread", w.id, self.info.gvr, len(w.live))
                self.metrics.slow_watchers_cut.labels(self._label).inc()
                w.cut("watcher too slow")
                self.remove_watcher(w)
        stats = self.stats
        stats.events_delivered += delivered
        stats.events_filtered += filtered

    def schedule_flush(self, w: Watcher) -> None:
        """Flush ``w`` once the current event-loop callback is done (with every other watcher marked by then).

        One flush per turn writes each dirty watcher's events as one chunk:
        all the events of one upstream read (or of several reads handled in
        the same turn) go out in one write per watcher.
        """
        self._dirty.append(w)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, []
        for w in dirty:
            try:
                w.flush()
            except Exception:  # a broken connection must not strand the other watchers' events
                log.exception("watch %d of %s: direct write failed; cutting it off", w.id, self.info.gvr)
                w.cut("write failed")
                self.remove_watcher(w)

    def _notify_progress(self) -> None:
        if self._progress is not None:
            self._progress.set()
            self._progress = None

    # ---- reading ----------------------------------------------------------------------------

    async def wait_synced(self) -> None:
        """Wait for the first sync; 503 if it does not come in time, 404 if the resource went away upstream."""
        if not self.synced.is_set():  # a cache that went away is synced (``vanished``)
            try:
                await asyncio.wait_for(self.synced.wait(), timeout=self.settings.sync_timeout)
            except TimeoutError as e:
                raise ApiError(
                    503, "ServiceUnavailable", f"the watch cache of {self.info.gvr.label} is not synced yet; retry"
                ) from e
        if self.gone:
            raise ApiError(404, "NotFound", f"the upstream no longer serves {self.info.gvr.label}")

    async def wait_for_rv(self, rv: int, timeout: float) -> bool:
        """Wait until the cache has seen ``rv``; ``False`` on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.rv < rv:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if self._progress is None:
                self._progress = asyncio.Event()
            try:
                await asyncio.wait_for(self._progress.wait(), timeout=remaining)
            except TimeoutError:
                return False
        return True

    def select(self, filt: WatchFilter) -> list[CachedObject]:
        """The objects of the current state that pass ``filt``, ordered by (namespace, name).

        With a ``shardSelector`` only the objects of the hash buckets its
        ranges overlap are looked at (:attr:`store_index`), each through the
        whole filter, so the answer is the scan's: at a million pods a 1/64
        range looks at ~1.6 % of the store instead of all of it. Without one,
        every object is. Counted in ``stats.select_examined``.
        """
        objects = self.objects
        matches = filt.matches
        if filt.shard is None:
            keys = [k for k, o in objects.items() if matches(o)]
            self.stats.select_examined += len(objects)
        else:
            keys = []
            examined = 0
            for k in self.store_index.candidates(filt.shard, objects):
                examined += 1
                if matches(objects[k]):
                    keys.append(k)
            self.stats.select_examined += examined
        # Filter first, then sort only what is returned (the whole-store sort dominated LIST time),
        # by the store's keys (sorting the objects by their ``key`` property built a tuple per object).
        keys.sort()
        return [objects[k] for k in keys]

    def add_watcher(
        self,
        filt: WatchFilter,
        *,
        resume_from: int | None,
        initial: Iterable[CachedObject] | None = None,
        initial_rv: int | None = None,
        bookmarks: bool,
        initial_events_end: bool,
        timeout: float | None,
    ) -> Watcher:
        """Register a watcher (synchronously, so no event slips between backlog and live queue).

        Either ``resume_from`` (replay history events after that RV, 410 if it
        is older than the window) or ``initial`` objects at ``initial_rv``
        (sent as ``ADDED``; when ``initial`` is ``None`` the current state is used).
        """
        backlog: list[bytes] = []
        if resume_from is not None:
            # A root-placed watch cannot be replayed from before its chain placed the history's objects.
            oldest = self.history_start_rv
            if self.chain is not None and filt.shard is not None and _root_paths(filt.shard.paths):
                oldest = max(oldest, self.chain.started_rv)
            if resume_from < oldest:
                w = Watcher(self, filt, resume_from, [], bookmarks=False, initial_events_end=None, timeout=timeout)
                status = expired_status(too_old_message(resume_from, oldest))
                w.error_line = event_line("ERROR", orjson.dumps(status))
                w.closed = True
                return w
            after = resume_from
        else:
            if initial is None:
                objs: Iterable[CachedObject] = self.select(filt)
                after = self.rv
            else:
                objs = initial
                after = initial_rv if initial_rv is not None else self.rv
            backlog.extend(event_line("ADDED", o.raw) for o in objs)
            # Events the cache has already applied beyond ``after`` (when the
            # snapshot came from elsewhere and is older than the cache) are replayed below.
            if after < self.rv and after < self.history_start_rv:
                raise gone(too_old_message(after, self.history_start_rv))
        if after < self.rv:  # replay the history after ``after``
            for ev in self.history:
                if ev.rv > after or (ev.late and ev.rv == after):
                    variant = filt.variant(ev)
                    if variant is not None:
                        backlog.append(ev.line(variant))
        w = Watcher(
            self,
            filt,
            after,
            backlog,
            bookmarks=bookmarks,
            initial_events_end=max(after, self.rv) if initial_events_end else None,
            timeout=timeout,
        )
        self.watchers[w.id] = w
        self._index = None
        self.metrics.downstream_watches.labels(self._label).set(len(self.watchers))
        return w

    def remove_watcher(self, w: Watcher) -> None:
        """Unregister a watcher (idempotent)."""
        if self.watchers.pop(w.id, None) is not None:
            self._index = None
            self.metrics.downstream_watches.labels(self._label).set(len(self.watchers))
