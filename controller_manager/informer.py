"""Informer: list + watch one resource through the proxy, restricted to the instance's hash range.

Purpose
    Keeps a local store of the objects of one resource whose shard-selector
    path (own uid for the main resource, controller-owner uid for dependents)
    falls in the instance's range, and calls ``on_event(type, obj)`` for every
    change. Lists and watches over the generic REST path of the resource
    (``GET /apis/<group>/<version>/<plural>?shardSelector=...[&watch=true]``)
    through the official client's ``ApiClient.call_api`` (its auth, TLS and
    connection pool), so built-in resources and CRDs work alike. What to do
    next (the next page of ``limit``/``continue``, where a watch starts,
    re-watch, relist on 410, the backoff of 0.2 s doubling to 5 s after a
    failure) is decided by :class:`rangeshard.core.reflector.Reflector`, the
    one the proxy's watch caches use; this module keeps the requests, the
    store and the events (the reflector's sync driver).

Invariants
    * Every list starts from the range and *epoch* the instance publishes;
      ``synced_epoch`` is set to that epoch only once the list has been applied
      to the store. The instance processes a range only when every informer is
      synced at its current epoch, i.e. the caches were listed after the range
      became its own.
    * A list is "not older than" the highest resourceVersion known of the
      resource (:func:`controller_manager.freshness.list_params`): the
      informer's own last one and ``floor_source()``, what the instance and
      its peers published of their writes (a giver's last writes before it
      unlocked us); the proxy serves it from its cache, no consistent read
      upstream. With nothing known yet, any version (``0``, as client-go's
      first list); after a list at a floor timed out (``504``), one
      consistent read.
    * A relist replaces the store: objects that left the range (or were
      deleted while the watch was down) are reported as ``DELETED``.
    * :meth:`reset` makes the informer relist at once (range change): the
      blocking watch read is interrupted by shutting the response down.
    * A watch's connection goes back to the client's pool only if the server
      ended the stream; a watch the informer leaves (a reset, an ``ERROR``
      event, a stop) is closed first, so no later request reads its rest.
    * While a watch is open, :meth:`silence` is the time since it last
      brought anything (an event or a bookmark; the proxy bookmarks quiet
      watches): the manager's watchdog calls an informer silent for long
      stuck (:mod:`controller_manager.watchdog`). An informer blocked in its
      event handler reads nothing either, so it is silent too.

Concurrency model
    One named daemon thread per informer (``informer-<controller>-<resource>``).
    The store is an :class:`~controller_manager.indexer.Indexer` (its lock guards
    the objects and their indexes); readers get copies of references (objects
    are never mutated in place, only replaced).

Indexes
    The store keeps client-go style indexes (by namespace, by controller-owner
    uid, orphans by namespace, and the controller's own), updated with every
    watch event and rebuilt with every relist, so a reconcile reads its own
    objects in O(their number): :meth:`Informer.by_owner`,
    :meth:`Informer.by_namespace`, :meth:`Informer.orphans`,
    :meth:`Informer.by_index`. :meth:`Informer.by_root` walks the owner
    indexes down a chain of controller owners through the informers of the
    ``via`` kinds (:attr:`Informer.via`, set by the runtime for a ``by: root``
    informer): the objects below a root in O(the objects of that chain).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from controller_manager.freshness import as_version, list_params
from controller_manager.indexer import Indexer, IndexFunc, Obj
from controller_manager.resources import Resource, object_key, raw_request
from hashing import MAX_CHAIN, HashRange, range_to_selector
from rangeshard.core.backoff import Backoff
from rangeshard.core.kubeapi import status_message
from rangeshard.core.loops import start_thread
from rangeshard.core.reflector import LIST_PAGE_SIZE, Phase, Reflector

log = logging.getLogger(__name__)

_iter_lines: Callable[[Any], Iterator[str]] = iter_resp_lines

EventHandler = Callable[[str, dict[str, Any]], None]
RangeSource = Callable[[], tuple[int, HashRange | None]]


class Informer:
    """List/watch one resource within the instance's range (see module docstring)."""

    def __init__(
        self,
        api_client: Any,
        resource: Resource,
        *,
        path: str,
        range_source: RangeSource,
        on_event: EventHandler,
        name: str,
        watch_timeout: int = 60,
        request_timeout: float = 30.0,
        indexers: Mapping[str, IndexFunc] | None = None,
        floor_source: Callable[[], int] | None = None,
    ) -> None:
        self.resource = resource
        self.path = path
        self.range_source = range_source
        self.on_event = on_event
        self.name = name
        self.watch_timeout = watch_timeout
        self.request_timeout = request_timeout
        #: Objects per list page (``limit``); the proxy serves pages from its cache.
        self.page_size = LIST_PAGE_SIZE
        self._api = api_client
        self._store = Indexer(indexers)
        #: For a ``by: root`` informer: the informers of its ``via`` kinds, which :meth:`by_root` walks down.
        self.via: tuple[Informer, ...] = ()
        self._stop = threading.Event()
        self._reset = threading.Event()
        self._resp: Any = None
        self._thread: threading.Thread | None = None
        self.synced_epoch = -1
        #: The last list/watch failure (``404 no resource 'secrets' in core/v1``), ``None`` once a list succeeded:
        #: what the manager's ``/readyz`` (and ``rangeshard up``) say when this informer keeps it not ready.
        self.last_error: str | None = None
        #: ``time.monotonic()`` when the open watch was opened or last brought a line; ``None``: no watch open.
        self._heard_at: float | None = None
        #: What a list is not older than besides our own last version: the peers' and our writes' (the giver's).
        self.floor_source = floor_source
        #: The highest resourceVersion this informer saw (lists, events, bookmarks): its next list is not older.
        self.last_rv = 0
        #: The last list at a floor timed out (504: the proxy's cache never got there): a consistent read next.
        self._floor_unreachable = False

    def _get(self, selector: str, timeout: Any, **params: Any) -> Any:
        """``GET`` the collection (all namespaces) with ``shardSelector`` and the non-empty ``params``; raw response."""
        query = [("shardSelector", selector), *((k, v) for k, v in params.items() if v not in (None, ""))]
        return raw_request(self._api, "GET", self.resource.gvr.path(), query=query, timeout=timeout)

    # -- store access ---------------------------------------------------------
    def get(self, key: str) -> dict[str, Any] | None:
        return self._store.get(key)

    def items(self) -> list[dict[str, Any]]:
        """Every cached object: O(the cache). In a reconcile read through an index instead."""
        return self._store.items()

    def __len__(self) -> int:
        return len(self._store)

    @property
    def indexer(self) -> Indexer:
        """The indexed store itself (client-go ``GetIndexer``)."""
        return self._store

    def by_namespace(self, namespace: str) -> list[Obj]:
        """The cached objects of ``namespace`` (``""``: cluster-scoped ones)."""
        return self._store.by_namespace(namespace)

    def by_owner(self, uid: str) -> list[Obj]:
        """The cached objects whose controller ownerReference has ``uid``."""
        return self._store.by_owner(uid)

    def orphans(self, namespace: str) -> list[Obj]:
        """The cached objects of ``namespace`` without a controller ownerReference (adoption candidates)."""
        return self._store.orphans(namespace)

    def by_index(self, name: str, value: str) -> list[Obj]:
        """The cached objects filed under ``value`` in the index ``name`` (client-go ``ByIndex``)."""
        return self._store.by_index(name, value)

    def index_keys(self, name: str, value: str) -> list[str]:
        """The keys filed under ``value`` in the index ``name`` (client-go ``IndexKeys``)."""
        return self._store.index_keys(name, value)

    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        """Add index functions; the objects already cached are filed at once (client-go ``AddIndexers``)."""
        self._store.add_indexers(indexers)

    def by_root(self, uid: str) -> list[Obj]:
        """The cached objects whose chain of controller owners passes through ``uid`` (the objects below it).

        Down the owner indexes: the objects owned by ``uid``, then those owned by the objects of the
        :attr:`via` informers owned by ``uid``, and so on (at most :data:`hashing.MAX_CHAIN` levels, each
        uid once): for a Deployment's uid in a pod informer chained through ``replicasets.apps``, its pods.
        Without ``via`` informers it is :meth:`by_owner` (a chain of one step). Each store is read under
        its own lock: an event just applied to one informer may not be in another yet (as with client-go's
        listers); the next event of either enqueues the main object again.
        """
        found: list[Obj] = []
        level = [uid]
        seen = {uid}
        for _ in range(MAX_CHAIN):
            nxt: list[str] = []
            for u in level:
                found.extend(self._store.by_owner(u))
                for via in self.via:
                    for o in via.by_owner(u):
                        child = (o.get("metadata") or {}).get("uid")
                        if isinstance(child, str) and child not in seen:
                            seen.add(child)
                            nxt.append(child)
            if not nxt:
                break
            level = nxt
        return found

    def silence(self, now: float) -> float | None:
        """Seconds since the open watch last brought an event or a bookmark (``None``: no watch open)."""
        heard = self._heard_at
        return None if heard is None else max(0.0, now - heard)

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = start_thread(f"informer-{self.name}", self._run, what=f"informer {self.name}")

    def stop(self) -> None:
        self._stop.set()
        self.reset()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.request_timeout + 5)

    def reset(self) -> None:
        """Relist now (the range or epoch changed): interrupt the current watch."""
        self._reset.set()
        resp = self._resp
        if resp is not None:
            shutdown = getattr(resp, "shutdown", None)  # where urllib3 has it: wakes a blocked read
            with contextlib.suppress(Exception):
                if shutdown is not None:
                    shutdown()
                resp.close()

    # -- the loop -------------------------------------------------------------
    def _run(self) -> None:
        """The sync driver of the foundation's :class:`~rangeshard.core.reflector.Reflector` (module docstring)."""
        r = Reflector(Backoff(0.2, 5.0), page_size=self.page_size)
        selector = ""
        while not self._stop.is_set():
            try:
                if r.phase is Phase.LIST:
                    self._reset.clear()
                    epoch, rng = self.range_source()
                    if rng is None:
                        self._replace({}, epoch)
                        self._reset.wait(0.5)
                        continue
                    selector = range_to_selector(rng, self.path)
                    self._list(selector, epoch, r)
                    self.last_error = None
                elif r.phase is Phase.WATCH:
                    self._watch(selector, r)
                else:
                    self._stop.wait(r.delay)
                    r.relist()
            except ApiException as e:
                self._floor_unreachable = e.status == 504 and r.phase is Phase.LIST
                if r.failed(e.status) is Phase.LIST:
                    log.info("informer %s: watch expired (410); relisting", self.name)
                    continue
                self.last_error = f"{e.status} {_status_message(e)}"
                log.warning("informer %s: API error %s: %s", self.name, e.status, (e.body or e.reason or "")[:200])
            except Exception as e:
                if self._stop.is_set() or self._reset.is_set():
                    r.relist()
                    continue
                r.failed()
                self.last_error = f"{type(e).__name__}: {e}"[:300]
                log.warning("informer %s: %s: %s; relisting", self.name, type(e).__name__, e)

    def _list(self, selector: str, epoch: int, r: Reflector) -> None:
        """List the range in the reflector's pages (``limit``/``continue``), as the proxy's cache lists its
        upstream: no single answer holds the whole range in memory. The pages are one consistent list at the
        first page's resourceVersion; an expired ``continue`` (410) fails the list and the loop relists."""
        items: dict[str, dict[str, Any]] = {}
        floor = max(self.last_rv, self.floor_source() if self.floor_source is not None else 0)
        first = list_params(floor, unreachable=self._floor_unreachable)
        while r.phase is Phase.LIST:
            params = r.list_params()
            resp = self._get(selector, self.request_timeout, **params, **({} if "continue" in params else first))
            if resp.status != 200:
                raise ApiException(status=resp.status, reason=resp.data[:300].decode("utf-8", "replace"))
            body = orjson.loads(resp.data)
            for o in body.get("items") or []:
                o.setdefault("apiVersion", self.resource.api_version)
                o.setdefault("kind", self.resource.kind)
                items[object_key(o)] = o
            meta = body.get("metadata") or {}
            r.page(str(meta.get("resourceVersion") or ""), meta.get("continue"))
        self._floor_unreachable = False
        self._seen(r.resource_version)
        self._replace(items, epoch)
        log.debug(
            "informer %s: listed %s objects at rv %s (not older than %s, epoch %s)",
            self.name,
            len(items),
            r.resource_version,
            first.get("resourceVersion", "the API server's"),
            epoch,
        )

    def _seen(self, resource_version: str) -> None:
        found = as_version(resource_version)
        if found is not None and found > self.last_rv:
            self.last_rv = found

    def _replace(self, items: dict[str, dict[str, Any]], epoch: int) -> None:
        old = self._store.replace(items)
        for key, obj in old.items():
            if key not in items:
                self._emit("DELETED", obj)
        for key, obj in items.items():
            prev = old.get(key)
            if prev is None:
                self._emit("ADDED", obj)
            elif (prev.get("metadata") or {}).get("resourceVersion") != (obj.get("metadata") or {}).get(
                "resourceVersion"
            ):
                self._emit("MODIFIED", obj)
        # Unchanged objects are not re-emitted: when a relist follows a range change
        # the instance resyncs every main object as soon as processing resumes.
        self.synced_epoch = epoch

    def _apply(self, etype: str, obj: dict[str, Any]) -> None:
        """One watch event (``ADDED``/``MODIFIED``/``DELETED``): the store and its indexes, then the handler."""
        obj.setdefault("apiVersion", self.resource.api_version)
        obj.setdefault("kind", self.resource.kind)
        key = object_key(obj)
        if etype == "DELETED":
            self._store.pop(key)
        else:
            self._store.put(key, obj)
        self._emit(etype, obj)

    def _emit(self, kind: str, obj: dict[str, Any]) -> None:
        try:
            self.on_event(kind, obj)
        except Exception:
            log.exception("informer %s: event handler failed", self.name)

    def _watch(self, selector: str, r: Reflector) -> None:
        """One watch from the reflector's resourceVersion; the reflector says what follows its end."""
        if self._reset.is_set() or self._stop.is_set():
            return r.relist()
        rv = r.resource_version
        started = time.monotonic()
        lines = 0
        ended = False  # the server ended the stream: the connection may go back to the pool
        resp = self._get(
            selector,
            (self.request_timeout, self.watch_timeout + self.request_timeout),
            watch="true",
            resourceVersion=rv,
            allowWatchBookmarks="true",
            timeoutSeconds=self.watch_timeout,
        )
        self._resp = resp
        try:
            if self._reset.is_set():
                return r.relist()
            if resp.status != 200:
                raise ApiException(status=resp.status, reason=str(resp.data[:300]))
            self._heard_at = time.monotonic()
            for line in _iter_lines(resp):
                self._heard_at = time.monotonic()
                if not line:
                    continue
                lines += 1
                event = orjson.loads(line)
                etype = event.get("type")
                obj = event.get("object") or {}
                if etype == "ERROR":
                    raise ApiException(status=obj.get("code"), reason=status_message(obj, "watch error"))
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if etype not in ("ADDED", "MODIFIED", "DELETED"):
                    continue
                self._apply(etype, obj)
                if self._reset.is_set() or self._stop.is_set():
                    break
            else:
                ended = True
        finally:
            self._resp = None
            self._heard_at = None
            _give_back(resp, ended)
            self._seen(rv)
        if self._reset.is_set() or self._stop.is_set():
            r.relist()
        elif r.watch_ended(lines, time.monotonic() - started, rv) is Phase.WAIT:
            log.warning("informer %s: watch ended immediately; relisting in %.1fs", self.name, r.delay)


def _give_back(resp: Any, ended: bool) -> None:
    """Return a watch's connection to the pool; one whose stream the server did not end is closed first.

    urllib3's ``release_conn`` does not drain: a connection given back in the middle of a chunked stream
    (a reset, an ERROR event, a handler's stop) would hand the next request the rest of that stream as its
    status line (``BadStatusLine('62\\r\\n')``), and that request would wait for the stream's next chunk.
    """
    with contextlib.suppress(Exception):
        if not ended:
            resp.close()
        resp.release_conn()


def _status_message(e: ApiException) -> str:
    """The ``message`` of the Kubernetes ``Status`` in an API error's body, else its reason."""
    return status_message(e.body, str(e.reason or ""))[:300]
