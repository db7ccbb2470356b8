"""Progress measured from outside: per controller type and instance, the changes its controller has not answered.

Purpose
    The registry guarantees every key an owner on paper; it cannot see whether
    that owner does any work (issue 38: a SIGSTOPped operator kept its range,
    its lease and ``/readyz`` for minutes). The proxy holds every object and,
    with ``--etcd``, the registry: for the main resource of each controller
    type (``mainResource`` of the records) it follows the proxy's watch cache
    of that resource (started here if no client asked for it yet) and keeps
    the objects whose change is unanswered: ``metadata.generation`` newer
    than ``status.observedGeneration``. Each is attributed to the instance
    whose range holds its key under the type's shard rule
    (:meth:`hashing.ShardBy.key`), and ``/metrics`` publishes, per type and
    instance (labels ``type``, ``instance``):

    * ``rangeshard_unreconciled_objects``: how many of its objects are unanswered;
    * ``rangeshard_unreconciled_oldest_seconds``: the age of the oldest unanswered change
      (0 when there is none);
    * ``rangeshard_unreconciled_measurable``: 1 when the type's controller is known to write
      ``status.observedGeneration``, else 0, and then the two above are NaN ("not measurable",
      never "healthy");
    * ``rangeshard_unreconciled_stuck``: 1 when measurable and the oldest unanswered change is
      older than the instance's ``stuckAfterSeconds`` (published in its record; default 120);
    * ``rangeshard_stuck_after_seconds``: that threshold.

Invariants
    * *Since when* is the time the proxy first saw the object with a
      generation at least that high and unanswered: an object first seen
      unanswered at generation 3 has waited since then for 3, however often
      it changes afterwards, until ``observedGeneration`` reaches 3 (then the
      next unanswered generation's own time counts). A relist keeps the times
      of the objects it finds again (same uid).
    * An object without ``metadata.generation``, or being deleted
      (``deletionTimestamp``), is never unanswered.
    * Measurable is decided per type: once any object of its main resource
      has shown ``status.observedGeneration`` (in this proxy's life), its
      controller writes it, and an object without one is an unanswered change
      (a new object nobody handled yet). Until then every instance of the type
      is reported not measurable, as is a type whose records name no main
      resource or whose cache has not synced.
    * An object whose key is absent under the rule (an orphan under
      ``owner``, seen by every instance) is attributed to nobody.

Concurrency model
    Registry views arrive on the ``membership-watch-proxy-progress`` thread and
    are handed over by one reference assignment plus a
    ``call_soon_threadsafe`` wake-up; everything else runs on the proxy's
    event loop: the cache observers (synchronous, inside the cache's event
    application), the ``progress-caches`` task that starts and follows the
    caches of the main resources, and the scrape (the collector).

State of one tracked main resource (:class:`ResourceProgress`)::

    detached ──(resolved by discovery; cache started or found)──► following
    following ──(its cache went away: CRD deleted)──► detached (retried every few seconds)
    following ──(no type names it any more)──► detached (the cache keeps running for its watchers)
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hashing import ObjectHashes, ShardBy
from range_filter_proxy.cache import CacheManager
from range_filter_proxy.cached import CachedObject
from range_filter_proxy.errors import UpstreamError
from range_filter_proxy.watchcache import WatchCache
from rangeshard.core.backoff import Backoff
from rangeshard.core.etcd import EtcdConfig
from rangeshard.core.loops import start_task
from registry import DEFAULT_PREFIX, DEFAULT_STUCK_AFTER_SECONDS, MainResource, MembershipWatch, RegistryView, Snapshot

log = logging.getLogger(__name__)

#: Seconds between passes, and at most between attempts to start the cache of a main resource not served (yet).
RETRY_SECONDS = 5.0

METRIC_OBJECTS = "rangeshard_unreconciled_objects"
METRIC_OLDEST = "rangeshard_unreconciled_oldest_seconds"
METRIC_MEASURABLE = "rangeshard_unreconciled_measurable"
METRIC_STUCK = "rangeshard_unreconciled_stuck"
METRIC_STUCK_AFTER = "rangeshard_stuck_after_seconds"


# -- reading the two numbers of an object --------------------------------------------------


class _Meta(msgspec.Struct, gc=False):
    uid: str = ""
    generation: int | None = None
    deletionTimestamp: str | None = None  # noqa: N815 (the wire name)


class _Status(msgspec.Struct, gc=False):
    observedGeneration: int | None = None  # noqa: N815


class _Object(msgspec.Struct, gc=False):
    metadata: _Meta | None = None
    status: _Status | None = None


_DECODER = msgspec.json.Decoder(_Object)


@dataclass(frozen=True, slots=True)
class Generations:
    """What progress needs of one object."""

    uid: str
    generation: int | None
    observed: int | None
    deleting: bool

    @property
    def unanswered(self) -> bool:
        """Its generation is newer than what its controller answered (no answer at all counts)."""
        if self.generation is None or self.deleting:
            return False
        return self.observed is None or self.observed < self.generation


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_generations(raw: bytes | memoryview) -> Generations:
    """``metadata.uid``/``generation``/``deletionTimestamp`` and ``status.observedGeneration`` of an object's JSON.

    Only those members are decoded (the rest is skipped by the C parser); an
    object whose members have other types than Kubernetes gives them is read
    leniently (a field of the wrong type reads as absent).
    """
    try:
        obj = _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _read_lenient(raw)
    meta = obj.metadata or _Meta()
    observed = obj.status.observedGeneration if obj.status is not None else None
    return Generations(meta.uid, meta.generation, observed, meta.deletionTimestamp is not None)


def _read_lenient(raw: bytes | memoryview) -> Generations:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Generations("", None, None, False)
    meta = data.get("metadata") if isinstance(data, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    status = data.get("status") if isinstance(data, dict) else None
    observed = _int(status.get("observedGeneration")) if isinstance(status, dict) else None
    uid = meta.get("uid")
    return Generations(
        uid if isinstance(uid, str) else "", _int(meta.get("generation")), observed, bool(meta.get("deletionTimestamp"))
    )


# -- one main resource -------------------------------------------------------------------------


@dataclass(slots=True)
class Pending:
    """One object with an unanswered change.

    ``marks``: ``(generation, first seen)`` pairs, increasing: the proxy knew
    by that time that the object had at least that generation unanswered.
    """

    uid: str
    hashes: ObjectHashes
    marks: list[tuple[int, float]]

    def since(self) -> float:
        return self.marks[0][1]


class ResourceProgress:
    """The unanswered objects of one main resource, following its watch cache (a :class:`CacheObserver`)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.pending: dict[tuple[str, str], Pending] = {}
        #: Some object of it has shown ``status.observedGeneration``: its controller writes it.
        self.measurable = False
        #: The cache followed (``None``: detached).
        self.cache: WatchCache | None = None
        #: Store replacements seen (a synced cache replaces the store at least once).
        self.synced = False

    def _update(self, key: tuple[str, str], obj: CachedObject, now: float) -> None:
        gens = read_generations(obj.raw)
        if gens.observed is not None and not self.measurable:
            self.measurable = True
            log.info("progress: %s writes status.observedGeneration: its instances are measured", self.label)
        if not gens.unanswered or gens.generation is None:
            self.pending.pop(key, None)
            return
        entry = self.pending.get(key)
        if entry is None or entry.uid != gens.uid:
            entry = self.pending[key] = Pending(gens.uid, obj.hashes, [])
        entry.hashes = obj.hashes
        observed = gens.observed if gens.observed is not None else -1
        marks = [m for m in entry.marks if m[0] > observed]
        if not marks or marks[-1][0] < gens.generation:
            marks.append((gens.generation, now))
        entry.marks = marks

    # -- CacheObserver --
    def applied(self, etype: str, obj: CachedObject, received: float) -> None:
        key = obj.key
        if etype == "DELETED":
            self.pending.pop(key, None)
            return
        self._update(key, obj, received)

    def replaced(self, objects: Mapping[tuple[str, str], CachedObject]) -> None:
        now = time.monotonic()
        for key in [k for k in self.pending if k not in objects]:
            del self.pending[key]
        for key, obj in objects.items():
            self._update(key, obj, now)
        self.synced = True

    def detach(self) -> None:
        if self.cache is not None:
            self.cache.remove_observer(self)
        self.cache = None
        self.synced = False


# -- the numbers per instance ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InstanceProgress:
    """What ``/metrics`` says of one instance (``count``/``oldest`` are NaN when not measurable)."""

    controller_type: str
    instance_id: str
    measurable: bool
    count: float
    oldest: float
    stuck_after: float

    @property
    def stuck(self) -> bool:
        return self.measurable and self.oldest > self.stuck_after


def main_of(snap: Snapshot) -> MainResource | None:
    """The main resource a type's records name (the most recent record wins if they disagree)."""
    named = [m for m in snap.members if m.record.main_resource is not None]
    if not named:
        return None
    return max(named, key=lambda m: m.mod_revision).record.main_resource


def attribute(
    snap: Snapshot, rule: ShardBy, pending: Mapping[Any, Pending], now: float, label: str | None = None
) -> dict[str, tuple[int, float]]:
    """``instance id -> (unanswered objects, oldest age)`` of the instances of ``snap`` that have some.

    ``label``: the label key of a ``by: label`` rule (its objects without a key count for nobody).
    """
    if rule is ShardBy.LABEL and label is None:
        return {}
    owned = sorted((m.range.hi, m.range.lo, m.instance_id) for m in snap.members if m.range is not None)
    his = [hi for hi, _, _ in owned]
    out: dict[str, tuple[int, float]] = {}
    for entry in pending.values():
        h = rule.hash64(entry.hashes, label)
        if h is None:
            continue  # absent under the rule (an orphan under ``owner``): nobody's
        key = h >> 1
        i = bisect.bisect_left(his, key)
        if i == len(owned) or owned[i][1] > key:
            continue
        iid = owned[i][2]
        count, oldest = out.get(iid, (0, 0.0))
        out[iid] = (count + 1, max(oldest, now - entry.since()))
    return out


@dataclass(frozen=True)
class ProgressSettings:
    """Where the registry is (the proxy's ``--etcd``/``--registry-prefix``)."""

    etcd: EtcdConfig = field(repr=False)
    prefix: str = DEFAULT_PREFIX


class ProgressTracker:
    """Follows the registry and the main resources' caches; computes :class:`InstanceProgress` (module docstring)."""

    def __init__(self, settings: ProgressSettings, caches: CacheManager) -> None:
        self.settings = settings
        self.caches = caches
        self.resources: dict[str, ResourceProgress] = {}
        self._view: RegistryView | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._failed: dict[str, str] = {}
        self.watch = MembershipWatch(
            settings.etcd, self._on_view, prefix=settings.prefix, name="proxy-progress", probe_interval=2.0
        )

    # -- lifecycle --
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self.watch.start()
        self._task = start_task(
            self._follow(self._changed), "progress-caches", what="progress: following the main resources"
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for progress in self.resources.values():
            progress.detach()
        await asyncio.to_thread(self.watch.stop)

    def _on_view(self, view: RegistryView) -> None:
        """On the watch thread: keep the newest view, wake the loop."""
        self._view = view
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()

    # -- the caches of the main resources --
    def wanted(self) -> dict[str, MainResource]:
        """``label -> main resource`` of every type in the current view that names one."""
        view = self._view
        out: dict[str, MainResource] = {}
        if view is None:
            return out
        for snap in view.snapshots.values():
            main = main_of(snap)
            if main is not None:
                out.setdefault(main.label, main)
        return out

    async def _follow(self, changed: asyncio.Event) -> None:
        """Start (or find) the cache of every main resource and observe it; retried while one is not served."""
        retry = Backoff(0.5, RETRY_SECONDS, jitter=0.2)
        while True:
            changed.clear()
            await self.ensure()
            if not self._failed:
                retry.reset()
            with contextlib.suppress(TimeoutError):  # a pass at every registry change, else after the wait
                await asyncio.wait_for(changed.wait(), retry.next_delay() if self._failed else RETRY_SECONDS)

    async def ensure(self) -> None:
        """One pass: follow every wanted main resource's cache, let go of the others."""
        wanted = self.wanted()
        for label, progress in list(self.resources.items()):
            if label not in wanted:
                log.info("progress: no controller type names %s as its main resource any more", label)
                progress.detach()
                del self.resources[label]
        for label, main in wanted.items():
            progress = self.resources.setdefault(label, ResourceProgress(label))
            cache = progress.cache
            if cache is not None and not cache.gone and self.caches.caches.get(cache.info.gvr) is cache:
                continue
            if cache is not None:
                log.info("progress: the cache of %s went away; following its successor", label)
                progress.detach()
            try:
                info = await self.caches.resolve_spec(main.resource, main.version, main.group)
            except UpstreamError as e:
                if self._failed.get(label) != str(e):
                    log.warning(
                        "progress: cannot follow %s yet: %s (retrying, at most %gs apart)", label, e, RETRY_SECONDS
                    )
                self._failed[label] = str(e)
                continue
            self._failed.pop(label, None)
            cache = self.caches.cache_for(info)
            progress.cache = cache
            cache.add_observer(progress)
            log.info("progress: following %s (main resource of its controller types)", info.gvr.label)

    # -- the numbers --
    def instances(self, now: float | None = None) -> list[InstanceProgress]:
        """Every registered instance of every type, with its progress (see the module docstring)."""
        view = self._view
        if view is None:
            return []
        now = time.monotonic() if now is None else now
        out: list[InstanceProgress] = []
        for ctype, snap in sorted(view.snapshots.items()):
            main = main_of(snap)
            progress = self.resources.get(main.label) if main is not None else None
            measured = (
                attribute(snap, main.by, progress.pending, now, main.label_key)
                if main is not None and progress is not None and progress.synced and progress.measurable
                else None
            )
            for m in snap.members:
                after = m.record.stuck_after_seconds or DEFAULT_STUCK_AFTER_SECONDS
                if measured is None:
                    out.append(InstanceProgress(ctype, m.instance_id, False, math.nan, math.nan, after))
                    continue
                count, oldest = measured.get(m.instance_id, (0, 0.0))
                out.append(InstanceProgress(ctype, m.instance_id, True, float(count), round(oldest, 3), after))
        return out


class ProgressCollector(Collector):
    """Exports :meth:`ProgressTracker.instances` at scrape time (on the event loop)."""

    def __init__(self, tracker: ProgressTracker) -> None:
        self.tracker = tracker

    def collect(self) -> Iterator[Metric]:
        labels = ["type", "instance"]
        families = {
            "count": GaugeMetricFamily(
                METRIC_OBJECTS,
                "Main objects of the instance's range whose metadata.generation is newer than status.observedGeneration"
                " (NaN: not measurable)",
                labels=labels,
            ),
            "oldest": GaugeMetricFamily(
                METRIC_OLDEST,
                "Age of the instance's oldest unanswered change of a main object, from when the proxy first saw it"
                " (0: none; NaN: not measurable)",
                labels=labels,
            ),
            "measurable": GaugeMetricFamily(
                METRIC_MEASURABLE,
                "1 when the type's controller is known to write status.observedGeneration, 0 when not (or no main"
                " resource is published, or its cache is not synced): not measurable, not healthy",
                labels=labels,
            ),
            "stuck": GaugeMetricFamily(
                METRIC_STUCK,
                "1 when the instance's oldest unanswered change is older than its stuckAfterSeconds",
                labels=labels,
            ),
            "after": GaugeMetricFamily(
                METRIC_STUCK_AFTER, "The instance's stuckAfterSeconds (from its registry record)", labels=labels
            ),
        }
        for p in self.tracker.instances():
            values = [p.controller_type, p.instance_id]
            families["count"].add_metric(values, p.count)
            families["oldest"].add_metric(values, p.oldest)
            families["measurable"].add_metric(values, 1.0 if p.measurable else 0.0)
            families["stuck"].add_metric(values, 1.0 if p.stuck else 0.0)
            families["after"].add_metric(values, p.stuck_after)
        yield from families.values()
