"""Kubernetes watches served from etcd watches.

Purpose
    Turn one downstream ``?watch=true`` request into one etcd prefix watch
    (:class:`EtcdWatch`, on a dedicated :class:`EtcdClient` so a broken stream
    disturbs nothing else) and produce the Kubernetes event stream
    (:func:`watch_events`): ``ADDED``/``MODIFIED``/``DELETED`` filtered by
    label/field selectors (an object that stops matching is ``DELETED``, one
    that starts matching is ``ADDED``, as kube-apiserver does), ``BOOKMARK``
    when asked, and ``ERROR`` with a 410 Status when the requested revision
    was compacted.

Invariants
    * ``resourceVersion`` unset or ``"0"``: synthetic ``ADDED`` for every
      matching object at list revision R, then every change after R.
      ``resourceVersion`` N: exactly the changes with revision > N.
    * Bookmarks carry a revision R such that every event <= R was already
      sent: R comes from an etcd progress notification (a
      ``WatchProgressRequest`` answered on the same stream, which etcd sends
      only after all earlier events), never from a separate read.
    * When etcd goes away the downstream watch ends cleanly (the client
      re-lists/re-watches); it never hangs silently.

Concurrency model
    The etcd client delivers watch batches on its own thread
    (:meth:`rangeshard.core.etcd.EtcdClient.watch_prefix`); the callback turns
    them into plain tuples and hands them to the event loop with
    ``loop.call_soon_threadsafe``. Blocking etcd calls (watch creation,
    cancellation, the initial list) run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import orjson

from hashing import ShardSelector
from local_apiserver.codec import Obj, parse_resource_version
from local_apiserver.conversion import to_api
from local_apiserver.errors import ApiError, expired_status, gone, too_old_message, unavailable
from local_apiserver.resources import ResourceSpec
from local_apiserver.state import in_thread
from local_apiserver.store import Store
from rangeshard.core.errors import RegistryError, WatchCompacted
from rangeshard.core.etcd import EtcdClient, EtcdConfig, PrefixWatch, WatchBatch, WatchEvent
from rangeshard.core.kubeapi import event_line
from rangeshard.core.selectors import FieldSelector, LabelSelector
from rangeshard.core.serving import ShutdownSignal

log = logging.getLogger(__name__)

DEFAULT_WATCH_TIMEOUT = 1800.0


# Items put on the queue: ("events", [WatchEvent]), ("progress", rev), ("compacted", rev), ("error", text),
# ("closed", reason): the server is shutting down.
Item = tuple[str, Any]


class EtcdWatch:
    """One etcd prefix watch bridged to an asyncio queue (see module docstring)."""

    def __init__(self, config: EtcdConfig, prefix: str, start_revision: int) -> None:
        self.config = config
        self.prefix = prefix
        self.start_revision = start_revision
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._client: EtcdClient | None = None
        self._watch: PrefixWatch | None = None
        self._closed = False

    def deliver(self, item: Item) -> None:
        if self._closed:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closing
            self._loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def _callback(self, response: WatchBatch | RegistryError) -> None:
        """Runs on the etcd client's watch thread."""
        if isinstance(response, WatchCompacted):
            self.deliver(("compacted", response.compacted_revision))
        elif isinstance(response, RegistryError):
            self.deliver(("error", str(response)))
        elif not response.events:
            self.deliver(("progress", response.revision))
        else:
            self.deliver(("events", list(response.events)))

    def open(self) -> None:
        """Create the client and the etcd watch (blocking: run in a thread).

        Raises ``ApiError`` 410 if ``start_revision`` is compacted, or
        ``RegistryError`` if etcd is unreachable.
        """
        self._client = EtcdClient(self.config)
        try:
            self._watch = self._client.watch_prefix(
                self.prefix, self._callback, start_revision=self.start_revision, prev_kv=True
            )
        except WatchCompacted as e:
            self.close()
            raise gone(too_old_message(self.start_revision - 1, e.compacted_revision)) from e
        except BaseException:
            self.close()
            raise

    def request_progress(self) -> None:
        """Ask etcd for a progress notification on this stream (for bookmarks)."""
        watch = self._watch
        if watch is not None and not self._closed:
            watch.request_progress()

    def close(self) -> None:
        """Cancel the watch and close the client (blocking; idempotent)."""
        self._closed = True
        client, self._client = self._client, None
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()
        if client is not None:
            client.close()


def _bookmark(spec: ResourceSpec, revision: int, initial_end: bool = False) -> Obj:
    meta: dict[str, Any] = {"resourceVersion": str(revision)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return {"kind": spec.kind, "apiVersion": spec.api_version, "metadata": meta}


@dataclass
class WatchRequest:
    spec: ResourceSpec
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    resource_version: str | None
    allow_bookmarks: bool
    timeout_seconds: float | None
    send_initial_events: bool
    shard: ShardSelector | None = None


class _Matcher:
    def __init__(self, store: Store, req: WatchRequest) -> None:
        self.store = store
        self.req = req

    def decode(self, value: bytes, key: str, revision: int) -> Obj | None:
        try:
            obj = orjson.loads(value)
        except orjson.JSONDecodeError:
            log.warning("skipping corrupt object at %s", key)
            return None
        if not isinstance(obj, dict):
            return None
        obj.setdefault("kind", self.req.spec.kind)
        obj.setdefault("apiVersion", self.req.spec.api_version)
        obj = to_api(self.req.spec, obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(revision)
        return obj

    def matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        return (
            self.req.labels.matches(obj["metadata"].get("labels") or {})
            and self.req.fields.matches(obj)
            and (self.req.shard is None or self.req.shard.matches(obj))
        )

    def convert(self, ev: WatchEvent) -> tuple[str, Obj] | None:
        kv = ev.kv
        prev = self.decode(ev.prev_value, kv.key, kv.mod_revision) if ev.prev_value is not None else None
        if ev.deleted:
            return ("DELETED", prev) if prev is not None and self.matches(prev) else None
        cur = self.decode(kv.value, kv.key, kv.mod_revision)
        if cur is None:
            return None
        cur_ok = self.matches(cur)
        prev_ok = self.matches(prev)
        if kv.version == 1 or prev is None:
            return ("ADDED", cur) if cur_ok else None
        if cur_ok and prev_ok:
            return ("MODIFIED", cur)
        if cur_ok:
            return ("ADDED", cur)
        if prev_ok:
            return ("DELETED", cur)
        return None


async def watch_events(
    store: Store,
    config: EtcdConfig,
    req: WatchRequest,
    *,
    bookmark_interval: float,
    on_open: Callable[[], None],
    on_close: Callable[[], None],
    shutdown: ShutdownSignal | None = None,
) -> AsyncIterator[bytes]:
    """Validate and open a watch; return the async iterator of JSON lines.

    The stream ends cleanly (the client re-watches) when ``shutdown`` is set.

    Raises ``ApiError`` for bad requests before anything is streamed, so the
    caller can still answer a plain Status.
    """
    rv = parse_resource_version(req.resource_version)
    initial: list[Obj] = []
    if rv is None or rv == 0 or req.send_initial_events:
        # Without a limit list_page reads every page at one revision.
        res = await in_thread(store.list_page, req.spec, req.namespace, req.labels, req.fields, shard=req.shard)
        initial, start = res.items, res.revision + 1
    else:
        start = rv + 1
    etcd_watch = EtcdWatch(config, store.selected_prefix(req.spec, req.namespace, req.fields), start)
    compacted: ApiError | None = None
    try:
        await anyio.to_thread.run_sync(etcd_watch.open)
    except ApiError as e:
        if e.code != 410:
            raise
        compacted = e
    except RegistryError as e:
        raise unavailable(f"cannot watch: {e}") from e
    on_open()
    if shutdown is not None:
        forget = shutdown.on_set(lambda: etcd_watch.deliver(("closed", "the server is shutting down")))
        closed = on_close

        def on_close() -> None:
            forget()
            closed()

    return _stream(etcd_watch, req, store, initial, start - 1, compacted, bookmark_interval, on_close)


async def _stream(
    etcd_watch: EtcdWatch,
    req: WatchRequest,
    store: Store,
    initial: list[Obj],
    last_rev: int,
    compacted: ApiError | None,
    bookmark_interval: float,
    on_close: Callable[[], None],
) -> AsyncIterator[bytes]:
    matcher = _Matcher(store, req)
    timeout = req.timeout_seconds if req.timeout_seconds is not None else DEFAULT_WATCH_TIMEOUT
    deadline = time.monotonic() + timeout
    try:
        if compacted is not None:
            yield event_line("ERROR", expired_status(compacted.message))
            return
        for obj in initial:
            yield event_line("ADDED", obj)
        if req.send_initial_events:
            yield event_line("BOOKMARK", _bookmark(req.spec, last_rev, initial_end=True))
        next_bookmark = time.monotonic() + bookmark_interval
        while True:
            now = time.monotonic()
            if now >= deadline:
                return
            wait = deadline - now
            if req.allow_bookmarks:
                wait = min(wait, max(next_bookmark - now, 0.0))
            try:
                kind, payload = await asyncio.wait_for(etcd_watch.queue.get(), timeout=wait if wait > 0 else 0.001)
            except TimeoutError:
                if req.allow_bookmarks and time.monotonic() >= next_bookmark:
                    await anyio.to_thread.run_sync(etcd_watch.request_progress)
                    next_bookmark = time.monotonic() + bookmark_interval
                continue
            if kind == "events":
                for ev in payload:
                    last_rev = max(last_rev, ev.kv.mod_revision)
                    converted = matcher.convert(ev)
                    if converted is not None:
                        yield event_line(converted[0], converted[1])
            elif kind == "progress":
                last_rev = max(last_rev, int(payload))
                if req.allow_bookmarks:
                    yield event_line("BOOKMARK", _bookmark(req.spec, last_rev))
            elif kind == "compacted":
                yield event_line("ERROR", expired_status(too_old_message(last_rev, int(payload))))
                return
            else:  # "closed" (the server is shutting down) or "error"
                (log.debug if kind == "closed" else log.info)("watch on %s ends: %s", etcd_watch.prefix, payload)
                return
    finally:
        on_close()
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(etcd_watch.close)
