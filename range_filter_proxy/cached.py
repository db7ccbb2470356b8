"""The values of the shared watch cache: cached objects, cached events, watch filters, settings.

Purpose
    :class:`CachedObject` is one object as the cache stores it (its JSON bytes
    once, its shard hashes and filter fields precomputed); :class:`CachedEvent`
    one event of the history, serialised at most once per variant;
    :class:`WatchFilter` one downstream watch's namespace/label/field/shard
    filter, compiled to a predicate; :class:`CacheSettings` the tunables.

Invariants
    * A cached object is immutable once built; ``MODIFIED`` events keep the
      previous object so a watcher can be told ``DELETED`` when an object
      leaves its filter.

Concurrency model
    Plain values, used from the proxy's single event loop.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import msgspec
import orjson

from hashing import ObjectHashes, ShardSelector
from range_filter_proxy.errors import UpstreamError
from range_filter_proxy.resources import ResourceInfo
from range_filter_proxy.wire import WireObject
from rangeshard.core.kubeapi import event_line
from rangeshard.core.selectors import FieldSelector, LabelSelector

log = logging.getLogger(__name__)

INITIAL_EVENTS_END = "k8s.io/initial-events-end"


@dataclass(slots=True)
class CacheSettings:
    """Tunables of every watch cache (defaults are production values)."""

    history_events: int = 10_000
    history_seconds: float = 300.0
    history_hard_cap: int = 100_000
    #: The most bytes of events the history holds (:func:`event_bytes` each), whatever the two minimums
    #: above say: 64 MiB keeps kube-apiserver's 75 s window for a resource changing at ~870 KiB/s, e.g.
    #: ~147 status updates/s of 5.8 KiB pods (docs/proxy.md, docs/benchmarks.md: issue 49).
    history_max_bytes: int = 64 * 1024 * 1024
    bookmark_interval: float = 10.0
    watcher_queue_size: int = 1_000
    #: How long a consistent read waits for the cache before listing upstream instead.
    consistent_read_timeout: float = 0.5
    #: How long a read "not older than N" waits for the cache to reach N (then 504).
    rv_wait_timeout: float = 3.0
    #: How long a request waits for a cache's first sync (then 503).
    sync_timeout: float = 10.0
    relist_backoff_initial: float = 0.2
    relist_backoff_max: float = 10.0


def parse_rv(value: Any) -> int:
    """Parse a resourceVersion; ``ValueError`` if it is not a non-negative integer."""
    if isinstance(value, str):  # the usual case first
        if value.isascii() and value.isdigit() and len(value) < 40:
            return int(value)
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"invalid resource version {value!r}")


_NO_LABELS: Mapping[str, str] = MappingProxyType({})


class CachedObject(msgspec.Struct, eq=False, gc=False):
    """One object as stored: serialised once, hashes and filter fields precomputed.

    Only the JSON bytes are kept, not the decoded dict (which cost ~9x the
    JSON size in memory); the few fields filters need are extracted at build
    time, and :attr:`obj` decodes on demand (field selectors, ``at_rv``).

    ``data`` is the object's JSON (``end == -1``) or, for an object that came
    in a watch line read by the fast path, that whole line with the object at
    ``data[start:end]``: the line is kept instead of a copy of the object.
    When ``line_type`` is set, ``data`` is exactly the watch line
    ``{"type":"<line_type>","object":<raw>}\\n`` and is what a watcher is sent
    for that event (:meth:`CachedEvent.line`), again without a copy.

    Cached objects and events are structs the cyclic garbage collector does
    not track (``gc=False``): they refer only to bytes, strings, numbers,
    shared immutable hashes and label mappings, and to each other from newer
    to older, so they can never form a reference cycle; reference counting
    frees them. With 100,000 history events tracked, every collection (and
    the heap keeper's passes, :mod:`range_filter_proxy.heap`) walked two
    objects per event: 4-8 ms pauses at 30,000 events/s (issue 17).
    """

    data: bytes
    hashes: ObjectHashes
    rv: int
    namespace: str | None
    name: str
    labels: Mapping[str, str]
    start: int = 0
    end: int = -1
    line_type: str | None = None

    @property
    def raw(self) -> bytes | memoryview:
        """The object's JSON (a zero-copy view when it sits inside a watch line)."""
        if self.end < 0:
            return self.data
        return memoryview(self.data)[self.start : self.end]

    @classmethod
    def build(
        cls,
        obj: dict[str, Any],
        info: ResourceInfo,
        raw: bytes | None = None,
        previous: Mapping[tuple[str, str], CachedObject] | None = None,
    ) -> CachedObject:
        """Wrap an upstream object (``kind``/``apiVersion`` filled in if missing).

        ``raw`` is the object's JSON as received (:attr:`WatchEvent.raw`); it is
        kept as is when the object needs no filling in, instead of encoding
        ``obj`` again. ``previous`` (the cache's store) lends the labels and
        hashes of the object's previous version when they did not change, so
        an update neither re-interns its labels nor holds a second copy.
        """
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            raise UpstreamError(f"{info.gvr}: object without metadata")
        try:
            rv = parse_rv(meta.get("resourceVersion"))
        except ValueError as e:
            raise UpstreamError(f"{info.gvr}: object {meta.get('name')!r}: {e}") from e
        if "kind" not in obj or "apiVersion" not in obj:
            obj = {"kind": info.kind, "apiVersion": info.gvr.api_version, **obj}
            raw = None
        labels = meta.get("labels")
        ns = meta.get("namespace")
        namespace = sys.intern(ns) if isinstance(ns, str) and ns else None
        name = sys.intern(str(meta.get("name") or ""))
        if raw is None:
            # orjson's result keeps its growth buffer (~8 KiB resident for a 1 KiB pod);
            # an exact-size copy is what we keep.
            raw = bytes(memoryview(orjson.dumps(obj)))
        prev = previous.get((namespace or "", name)) if previous is not None else None
        kept: Mapping[str, str]
        if not isinstance(labels, dict) or not labels:
            kept = _NO_LABELS
        elif prev is not None and prev.labels == labels:
            kept = prev.labels
        else:
            kept = {sys.intern(str(k)): sys.intern(str(v)) for k, v in labels.items()}
        # The labels kept are the ones ``by: label`` hashes (one mapping, shared with the object).
        hashes = _labelled(ObjectHashes.of(obj, with_labels=False), kept, prev)
        return cls(raw, hashes, rv, namespace, name, kept)

    @classmethod
    def from_wire(
        cls,
        wire: WireObject,
        data: bytes,
        info: ResourceInfo,
        prev: CachedObject | None = None,
        start: int = 0,
        end: int = -1,
        line_type: str | None = None,
    ) -> CachedObject:
        """The same as :meth:`build` for an object the fast decoder read (``prev``: its version in the store).

        ``data`` is its exact JSON, or the watch line holding it at
        ``[start:end]`` (see the class docstring). ``wire`` carries kind,
        apiVersion and metadata (:func:`range_filter_proxy.wire.decode_line`
        guarantees they are present), so nothing is filled in and the bytes
        are kept as they are.
        """
        meta = wire.metadata
        if meta is None:
            raise UpstreamError(f"{info.gvr}: object without metadata")
        try:
            rv = parse_rv(meta.resourceVersion)
        except ValueError as e:
            raise UpstreamError(f"{info.gvr}: object {meta.name!r}: {e}") from e
        ns = meta.namespace
        if prev is not None and prev.name == meta.name and (prev.namespace or "") == ns:
            namespace, name = prev.namespace, prev.name  # the previous version's interned strings
        else:
            namespace = sys.intern(ns) if ns else None
            name = sys.intern(meta.name)
        hashes = ObjectHashes.of_fields(meta.uid, ns, meta.controller_uid() if meta.ownerReferences else None)
        labels = meta.labels
        kept: Mapping[str, str]
        if not labels:
            kept = _NO_LABELS
        elif prev is not None and prev.labels == labels:
            kept = prev.labels
        else:
            kept = {sys.intern(k): sys.intern(v) for k, v in labels.items()}
        hashes = _labelled(hashes, kept, prev)  # with the labels ``by: label`` hashes
        return cls(data, hashes, rv, namespace, name, kept, start, end, line_type)

    @property
    def obj(self) -> dict[str, Any]:
        """The object, decoded from its bytes (a fresh dict on every access)."""
        decoded: dict[str, Any] = orjson.loads(self.raw)
        return decoded

    @property
    def key(self) -> tuple[str, str]:
        """``(namespace, name)``; the namespace is ``""`` for cluster-scoped objects."""
        return (self.namespace or "", self.name)

    def at_rv(self, rv: int) -> bytes:
        """The serialisation of this object with ``metadata.resourceVersion`` set to ``rv``."""
        obj = self.obj
        obj["metadata"] = {**obj["metadata"], "resourceVersion": str(rv)}
        return orjson.dumps(obj)


def _labelled(base: ObjectHashes, labels: Mapping[str, str], prev: CachedObject | None) -> ObjectHashes:
    """``base`` with ``labels`` kept: the previous version's hashes when nothing of them changed (no new value).

    An update that keeps its labels (their mapping is the previous version's) and its hashes, nearly every
    update, allocates nothing: this runs once per event on the proxy's hot path.
    """
    if prev is not None:
        old = prev.hashes
        if (
            (old.labels is labels or (not old.labels and not labels))
            and old.uid == base.uid
            and old.owner == base.owner
            and old.root == base.root
            and old.namespace == base.namespace
        ):
            return old
    return base.with_labels(labels)


#: What one history event holds besides its object's bytes (the event and object structs, the
#: deque slot, the name string; measured: docs/benchmarks.md, issue 49), for :func:`event_bytes`.
EVENT_OVERHEAD_BYTES = 256


def event_bytes(ev: CachedEvent) -> int:
    """The bytes a history event is counted at: its object's bytes (JSON or watch line) plus the overhead."""
    return len(ev.cur.data) + EVENT_OVERHEAD_BYTES


class CachedEvent(msgspec.Struct, eq=False, gc=False):
    """One event of the history; serialisations are computed lazily and shared."""

    type: str
    rv: int
    cur: CachedObject
    prev: CachedObject | None
    received: float
    #: ``prev`` exists and agrees with ``cur`` on everything but field selectors look at
    #: (namespace, labels, hashes): then a filter without field selector matches both or neither.
    stable: bool = False
    #: A move of a root-placed object (:mod:`range_filter_proxy.rootchain`): the object did not
    #: change, its root did; watchers get ``ADDED_AT``/``DELETED_PREV`` or nothing, never ``MODIFIED``.
    moved: bool = False
    #: An upstream event filed at the cache's RV because a root move was forced past its own RV
    #: (:mod:`range_filter_proxy.rootchain`): also sent to watches that start at exactly that RV.
    late: bool = False
    #: Serialisations by variant, made on first use (most events only ever need one).
    _lines: dict[str, bytes] | None = None

    @classmethod
    def of(cls, etype: str, rv: int, cur: CachedObject, prev: CachedObject | None, received: float) -> CachedEvent:
        """An event of ``cur`` replacing ``prev``, with :attr:`stable` worked out."""
        stable = (
            prev is not None
            and (prev.hashes is cur.hashes or prev.hashes == cur.hashes)
            and prev.namespace == cur.namespace
            and (prev.labels is cur.labels or prev.labels == cur.labels)
        )
        return cls(etype, rv, cur, prev, received, stable)

    def line(self, variant: str) -> bytes:
        """``ADDED``/``MODIFIED``/``DELETED`` of ``cur``; ``DELETED_PREV``/``ADDED_AT``: prev/cur at this rv."""
        cur = self.cur
        if variant == cur.line_type:
            return cur.data  # the upstream's own line (see CachedObject)
        lines = self._lines
        if lines is None:
            lines = self._lines = {}
        cached = lines.get(variant)
        if cached is None:
            if variant == "DELETED_PREV" and self.prev is not None:
                cached = event_line("DELETED", self.prev.at_rv(self.rv))
            elif variant == "ADDED_AT":
                cached = event_line("ADDED", self.cur.at_rv(self.rv))
            else:
                cached = event_line(variant, self.cur.raw)
            lines[variant] = cached
        return cached


@dataclass(frozen=True, slots=True)
class WatchFilter:
    """What one downstream request selects: namespace, labels, fields, shard ranges.

    :attr:`matches` is a predicate compiled once from the parts that are set
    (the dispatcher runs it for every watcher on every event).
    """

    namespace: str | None = None
    labels: LabelSelector = field(default_factory=LabelSelector)
    fields: FieldSelector = field(default_factory=FieldSelector)
    shard: ShardSelector | None = None
    #: True if the object passes every part of the filter.
    matches: Callable[[CachedObject], bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "matches", self._compile())

    def _compile(self) -> Callable[[CachedObject], bool]:
        ns = self.namespace
        shard = self.shard.predicate() if self.shard is not None else None
        labels = None if self.labels.empty else self.labels
        fields = None if self.fields.empty else self.fields
        if shard is not None and ns is None and labels is None and fields is None:
            # The controller manager's case: a shard selector and nothing else.
            def shard_only(o: CachedObject) -> bool:
                return shard(o.hashes)

            return shard_only

        def full(o: CachedObject) -> bool:
            if ns is not None and o.namespace != ns:
                return False
            if shard is not None and not shard(o.hashes):
                return False
            if labels is not None and not labels.matches(o.labels):
                return False
            return fields is None or fields.matches(o.obj)

        return full

    def variant(self, ev: CachedEvent) -> str | None:
        """Which form of ``ev`` this filter's watcher gets, or ``None`` (filtered out)."""
        matches = self.matches
        if ev.moved:  # only the root changed: in or out of this filter, or nothing
            cur_ok = matches(ev.cur)
            if cur_ok == (ev.prev is not None and matches(ev.prev)):
                return None
            return "ADDED_AT" if cur_ok else "DELETED_PREV"
        if ev.type == "DELETED":
            return "DELETED" if matches(ev.cur) else None
        if ev.stable and self.fields.empty:
            return "MODIFIED" if matches(ev.cur) else None
        cur_ok = matches(ev.cur)
        prev_ok = ev.prev is not None and matches(ev.prev)
        if cur_ok:
            return "MODIFIED" if prev_ok else "ADDED"
        return "DELETED_PREV" if prev_ok else None
