"""Placement by owner chain (``by: root``): the root of each cached object, and its moves.

Purpose
    A :class:`RootChain` resolves, for every object of one watch cache (the
    *dependent*, e.g. pods), the uid of the top of its chain of controller
    ownerReferences through the caches of the ``via`` kinds (e.g.
    ``replicasets.apps``), and keeps it in ``CachedObject.hashes.root`` so
    selectors, the dispatch index and the store index read it like any other
    hash (the write fence follows the same chain upstream, see below). When
    an intermediate object gains, loses or changes its controller owner, or
    appears or goes away, every dependent
    whose root moved is re-filed: the dependent cache sends ``DELETED`` to the
    watches of the range it left and ``ADDED`` to those of the range it
    entered (:meth:`WatchCache.move`), nothing to the others: the object did
    not change.

Resolution (:meth:`RootChain.root_uid`)
    From the object, follow the controller ownerReference while its uid is an
    object of a ``via`` cache; the root is the last uid reached: the object
    itself without a controller owner, else the first owner that is not an
    intermediate the proxy holds -- an owner of another kind (the top: a
    Deployment), or an intermediate not (yet) cached (the nearest known owner:
    its dependents move when it appears). Kinds are not compared: uids are
    unique across kinds, so "is it in a via cache" is the whole test. Cycles
    and chains longer than :data:`hashing.rules.MAX_CHAIN` stop there.

Order of a move (:meth:`RootChain.intermediate_changed`)
    The moves an intermediate's event at resourceVersion ``r`` causes are
    queued and filed into the dependent's stream when that stream reaches
    ``r``: before its first event with a larger resourceVersion, at a bookmark
    at or past ``r``, or at the latest ``hold_seconds`` after the event
    (then the dependent's resourceVersion advances to ``r``; an upstream event
    of the dependent with a smaller one arriving later is filed at the cache's
    resourceVersion, also sent to watches started at exactly that
    resourceVersion -- a resumed watch may get it twice, never miss it -- and
    counted in ``range_filter_proxy_root_late_events_total``).
    A move whose ``r`` the dependent's stream has already passed is filed at
    once, at the stream's resourceVersion. So the dependent's watch stream
    stays ordered by resourceVersion, and a list at resourceVersion N shows
    the placement its watch shows at N.

The write fence (:meth:`RootChain.fresh_key_of_object`)
    judges a ``root`` write by the same chain, but reads each intermediate
    from the upstream when the write arrives instead of from the via caches:
    they lag the upstream, and a write of the old root's owner decided by a
    cache that has not applied a re-parenting yet would pass after the move.

Invariants
    * ``_nodes`` holds exactly the objects of the via caches (uid -> controller
      owner uid), ``_via_children`` its inverse; ``_deps`` exactly the
      dependent cache's objects (key -> controller owner uid, one string per owner),
      ``_dep_children`` its inverse.
    * For every dependent object ``o`` in the store with no move pending,
      ``o.hashes.root == fnv1a_64(root_uid(o))``.

Concurrency model
    Single event loop, synchronous: the via caches call
    :meth:`RootChain.applied`/``replaced`` from their ``apply`` (the
    :class:`~range_filter_proxy.watchcache.CacheObserver` protocol), the
    dependent cache calls :meth:`RootChain.place` from its own; the hold timer
    is one ``call_later`` callback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from hashing import fnv1a_64, hash_key
from hashing.rules import MAX_CHAIN
from range_filter_proxy.cached import CachedObject
from range_filter_proxy.resources import ResourceInfo
from range_filter_proxy.wire import WireOwnerRef, controller_uid

log = logging.getLogger(__name__)

Key = tuple[str, str]

#: How long a move waits for the dependent's stream to reach its resourceVersion (see module docstring).
HOLD_SECONDS = 1.0

#: A consistent read of one object of a via resource from the upstream: ``(info, namespace, name)`` -> the
#: object, ``None`` when it does not exist (:meth:`range_filter_proxy.upstream.Upstream.current_object`).
ReadObject = Callable[[ResourceInfo, str | None, str], Awaitable[Mapping[str, Any] | None]]


class WatchCache(Protocol):
    """What a chain reads of a watch cache (:class:`range_filter_proxy.watchcache.WatchCache`)."""

    info: ResourceInfo
    rv: int
    upstream_rv: int
    objects: dict[Key, CachedObject]

    def add_observer(self, observer: Any) -> None: ...

    def remove_observer(self, observer: Any) -> None: ...

    def move(self, keys: Iterable[Key], rv: int) -> None: ...


class _RefMeta(msgspec.Struct, gc=False):
    """The two ``metadata`` fields a chain reads (labels and the rest are skipped, not built)."""

    uid: str = ""
    ownerReferences: tuple[WireOwnerRef, ...] = ()  # noqa: N815 (the wire name)


class _Refs(msgspec.Struct, gc=False):
    metadata: _RefMeta = msgspec.field(default_factory=_RefMeta)


_REFS = msgspec.json.Decoder(_Refs)


def refs_of(obj: CachedObject) -> tuple[str | None, str | None]:
    """``(uid, controller owner uid)`` of a cached object (``None``: absent), decoding only its metadata."""
    try:
        meta = _REFS.decode(obj.raw).metadata
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None, None
    return meta.uid or None, controller_uid(meta.ownerReferences)


class RootChain:
    """The roots of one dependent cache's objects through its via caches (see module docstring)."""

    def __init__(
        self,
        dependent: WatchCache,
        via: tuple[str, ...],
        via_caches: Iterable[WatchCache],
        hold_seconds: float = HOLD_SECONDS,
    ) -> None:
        self.dependent = dependent
        self.via = via
        self.via_caches = tuple(via_caches)
        self.hold_seconds = hold_seconds
        #: Via objects: uid -> controller owner uid; and owner uid -> child uids.
        self._nodes: dict[str, str | None] = {}
        self._via_children: dict[str, set[str]] = {}
        #: The uids each via cache holds (a relist of one replaces its share only).
        self._node_uids: dict[int, set[str]] = {}
        #: Dependent objects: key -> controller owner uid (``None``: none); and owner uid -> keys.
        self._deps: dict[Key, str | None] = {}
        #: One string per owner uid, shared by the records of its dependents (memory: one per owner).
        self._owner_strings: dict[str, str] = {}
        self._dep_children: dict[str, set[Key]] = {}
        #: Moves waiting for the dependent's stream: (rv, queued at, keys), in rv order.
        self.pending: list[tuple[int, float, set[Key]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self.started_rv = 0
        self._observers = tuple(_ViaObserver(self, c) for c in self.via_caches)

    # ---- life ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Follow the via caches (each hands its store at once); the dependent cache places its objects next."""
        for observer in self._observers:
            observer.cache.add_observer(observer)
        self.started_rv = self.dependent.rv

    def stop(self) -> None:
        for observer in self._observers:
            observer.cache.remove_observer(observer)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ---- resolution ----------------------------------------------------------------------------

    def root_uid(self, uid: str | None, owner: str | None) -> str | None:
        """The root of an object with ``uid`` and controller owner ``owner`` (see module docstring)."""
        if owner is None:
            return uid
        nodes = self._nodes
        seen = {uid} if uid else set()
        current = owner
        for _ in range(MAX_CHAIN - 1):  # the owner is the first of at most MAX_CHAIN
            if current not in nodes or current in seen:
                return current
            seen.add(current)
            parent = nodes[current]
            if parent is None:
                return current
            current = parent
        return current

    def root_hash(self, uid: str | None, owner: str | None) -> int | None:
        """The 64-bit hash of :meth:`root_uid` (``None`` without a uid and owner)."""
        root = self.root_uid(uid, owner)
        return fnv1a_64(root) if root else None

    def _placed(self, obj: CachedObject, owner: str | None) -> CachedObject:
        """``obj`` with the root of its controller ``owner`` (its own uid's hash without one)."""
        if owner is None:
            return _with_root(obj, obj.hashes.uid)
        return _with_root(obj, fnv1a_64(self.root_uid(None, owner) or owner))

    def rooted(self, key: Key, obj: CachedObject) -> CachedObject:
        """A stored dependent object with the root its recorded owner resolves to now."""
        return self._placed(obj, self._deps.get(key))

    def resolved(self, obj: CachedObject) -> CachedObject:
        """``obj`` with its root set, not recorded (objects of an upstream list the cache does not keep)."""
        return self._placed(obj, refs_of(obj)[1])

    async def fresh_key_of_object(self, obj: Any, namespace: str | None, read: ReadObject) -> int | None:
        """The 63-bit ``root`` key of a decoded object (a write's body or cached object): the write fence's.

        The chain of :meth:`root_uid`, with each intermediate read from the upstream
        now by ``read`` (a consistent read of one object) instead of from the via
        caches, which lag it: judged by a cache that has not applied a re-parenting
        yet, a write of the old root's owner would pass after the move. An owner
        is an intermediate when its kind is a via cache's (group and kind) and
        the upstream has it with that uid; otherwise it is the root (an owner of
        another kind, or the nearest known owner). The object itself without a
        controller owner; at most :data:`MAX_CHAIN` owners, cycles stop. One read
        per intermediate, in ``namespace`` (the request's, else the object's).
        """
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping):
            return None
        uid = meta.get("uid") if isinstance(meta.get("uid"), str) and meta.get("uid") else None
        ns = namespace or (meta.get("namespace") if isinstance(meta.get("namespace"), str) else None)
        kinds = {(c.info.gvr.group, c.info.kind): c.info for c in self.via_caches}
        ref = _OwnerRef.controller_of(meta)
        if ref is None:
            return hash_key(uid) if uid else None
        seen = {uid} if uid else set()
        current = ref.uid
        for _ in range(MAX_CHAIN - 1):  # the owner is the first of at most MAX_CHAIN
            info = kinds.get((ref.group, ref.kind))
            if info is None or current in seen:
                break
            seen.add(current)
            owner = await read(info, ns if info.namespaced else None, ref.name)
            owner_meta = owner.get("metadata") if isinstance(owner, Mapping) else None
            if not isinstance(owner_meta, Mapping) or owner_meta.get("uid") != current:
                break  # no such intermediate (gone, or another object of that name): the nearest known owner
            ref = _OwnerRef.controller_of(owner_meta)
            if ref is None:
                break
            current = ref.uid
        return hash_key(current)

    # ---- the dependent cache -------------------------------------------------------------------

    def place(self, etype: str, obj: CachedObject) -> CachedObject:
        """Record a dependent object's event and return it with its root (``DELETED``: forgotten)."""
        key = obj.key
        owner = refs_of(obj)[1]
        if owner is not None:
            owner = self._owner_strings.setdefault(owner, owner)
        old = self._deps.pop(key, None)
        if old is not None:
            self._unlink(old, key)
        if etype != "DELETED":
            self._deps[key] = owner
            if owner is not None:
                self._dep_children.setdefault(owner, set()).add(key)
        return self._placed(obj, owner)

    def place_all(self, objects: dict[Key, CachedObject]) -> None:
        """A new store of the dependent (its relist, or the chain's start): every object placed, in place."""
        self._deps.clear()
        self._dep_children.clear()
        self._owner_strings.clear()
        self.pending.clear()
        for key, o in objects.items():
            objects[key] = self.place("ADDED", o)

    def _unlink(self, owner: str, key: Key) -> None:
        keys = self._dep_children.get(owner)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._dep_children[owner]
                self._owner_strings.pop(owner, None)

    # ---- the via caches (through their _ViaObserver) -------------------------------------------

    def via_applied(self, cache: WatchCache, etype: str, obj: CachedObject) -> None:
        """An intermediate's event: update the node, queue the moves of the dependents below it."""
        uid, owner = refs_of(obj)
        if not uid:
            return
        uids = self._node_uids.setdefault(id(cache), set())
        before = self._nodes.get(uid, _ABSENT)
        if etype == "DELETED":
            if before is _ABSENT:
                return
            self._drop_node(uid)
            uids.discard(uid)
        else:
            if before == owner:
                return  # same owner: no root below it moves
            if before is not _ABSENT:
                self._drop_node(uid)
            self._add_node(uid, owner)
            uids.add(uid)
        self.intermediate_changed(self._below(uid), obj.rv)

    def via_replaced(self, cache: WatchCache, objects: Mapping[Key, CachedObject]) -> None:
        """A via cache's relist (or its first state): its nodes replaced, every dependent re-placed."""
        share = self._node_uids.pop(id(cache), set())
        for gone in share:
            self._drop_node(gone)
        fresh: set[str] = set()
        for o in objects.values():
            uid, owner = refs_of(o)
            if uid:
                self._add_node(uid, owner)
                fresh.add(uid)
        self._node_uids[id(cache)] = fresh
        if self._deps:
            self.intermediate_changed(set(self._deps), 0)

    def _add_node(self, uid: str, owner: str | None) -> None:
        self._nodes[uid] = owner
        if owner is not None:
            self._via_children.setdefault(owner, set()).add(uid)

    def _drop_node(self, uid: str) -> None:
        owner = self._nodes.pop(uid, None)
        if owner is not None:
            children = self._via_children.get(owner)
            if children is not None:
                children.discard(uid)
                if not children:
                    del self._via_children[owner]

    def _below(self, uid: str) -> set[Key]:
        """The dependent keys whose chain passes through ``uid`` (bounded by :data:`MAX_CHAIN` levels)."""
        found: set[Key] = set()
        level = {uid}
        seen: set[str] = set()
        for _ in range(MAX_CHAIN):
            if not level:
                break
            seen |= level
            nxt: set[str] = set()
            for u in level:
                found |= self._dep_children.get(u, set())
                nxt |= self._via_children.get(u, set())
            level = nxt - seen
        return found

    # ---- moves ---------------------------------------------------------------------------------

    def intermediate_changed(self, keys: set[Key], rv: int) -> None:
        """Queue the re-placement of ``keys`` caused by an intermediate's event at ``rv`` (0: now)."""
        if not keys:
            return
        dependent = self.dependent
        if rv <= dependent.upstream_rv:
            dependent.move(keys, dependent.rv)
            return
        self.pending.append((rv, time.monotonic(), keys))
        self.pending.sort(key=lambda p: p[0])
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a synchronous test): the next event or bookmark releases it
                return
            self._timer = loop.call_later(self.hold_seconds, self._release_due)

    def release(self, before: int, *, inclusive: bool = False) -> None:
        """File the pending moves with rv < ``before`` (``<=`` with ``inclusive``), each at its rv."""
        pending = self.pending
        while pending and (pending[0][0] < before or (inclusive and pending[0][0] == before)):
            rv, _, keys = pending.pop(0)
            self.dependent.move(keys, rv)
        if not pending and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _release_due(self) -> None:
        self._timer = None
        now = time.monotonic()
        pending = self.pending
        while pending and now - pending[0][1] >= self.hold_seconds:
            rv, _, keys = pending.pop(0)
            log.debug("%s: filing a root move at rv %d after %.1fs", self.dependent.info.gvr, rv, self.hold_seconds)
            self.dependent.move(keys, rv)
        if pending:
            wait = max(0.0, self.hold_seconds - (now - pending[0][1]))
            self._timer = asyncio.get_running_loop().call_later(wait, self._release_due)


_ABSENT = object()


class _ViaObserver:
    """The chain's follower of one via cache (a :class:`~range_filter_proxy.watchcache.CacheObserver`)."""

    __slots__ = ("cache", "chain")

    def __init__(self, chain: RootChain, cache: WatchCache) -> None:
        self.chain = chain
        self.cache = cache

    def applied(self, etype: str, obj: CachedObject, received: float) -> None:
        self.chain.via_applied(self.cache, etype, obj)

    def replaced(self, objects: Mapping[Key, CachedObject]) -> None:
        self.chain.via_replaced(self.cache, objects)


@dataclass(frozen=True, slots=True)
class _OwnerRef:
    """The controller ownerReference of an object, as the fence follows it upstream."""

    group: str
    kind: str
    uid: str
    name: str

    @classmethod
    def controller_of(cls, meta: Mapping[str, Any]) -> _OwnerRef | None:
        """The first ownerReference of ``meta`` with ``controller: true`` and a uid, if any."""
        refs = meta.get("ownerReferences")
        for ref in refs if isinstance(refs, list) else ():
            if isinstance(ref, Mapping) and ref.get("controller") is True:
                uid, api_version = ref.get("uid"), ref.get("apiVersion")
                if isinstance(uid, str) and uid:
                    group = api_version.rpartition("/")[0] if isinstance(api_version, str) else ""
                    return cls(group, str(ref.get("kind") or ""), uid, str(ref.get("name") or ""))
        return None


def _with_root(obj: CachedObject, root: int | None) -> CachedObject:
    hashes = obj.hashes.with_root(root)
    if hashes is obj.hashes:
        return obj
    return msgspec.structs.replace(obj, hashes=hashes)
