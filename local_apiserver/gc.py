"""Cascading deletion: the part of kube-controller-manager's garbage collector this server needs.

Purpose
    When an owner leaves etcd, delete its dependents (objects whose
    ``metadata.ownerReferences`` name the owner's uid) in the background,
    as kube's garbage collector does for ``propagationPolicy: Background``
    (the default). Also:

    * ``Orphan``: dependents lose the reference to the deleted owner instead;
    * ``Foreground``: the owner stays (``deletionTimestamp`` plus the
      ``foregroundDeletion`` finalizer) until its blocking dependents (their
      reference has ``blockOwnerDeletion: true``) are gone, then the finalizer
      is removed and the owner leaves etcd; the other dependents are deleted
      too, without holding the owner; a dependent that has dependents itself
      is deleted in the foreground too (the owner waits for the whole tree);
    * a terminating namespace is emptied, then removed, its status conditions
      saying what is left and which finalizers hold it (its emptying is
      retried, and queued again whenever an object in it leaves etcd, so
      content held by finalizers for any time only delays it);
    * a dependent that still has a live owner only loses the dangling
      reference; an object created with owners that are all gone is deleted
      (the "dangling owner" case of a controller racing a deletion).

Invariants
    * The collector only deletes objects whose every known owner is absent
      (not found, or found with another uid). Owners of kinds this server does
      not serve are assumed alive: never delete on a guess.
    * Work is retried (bounded) when etcd is unavailable; a crash of the
      server loses queued work (documented limitation).

Concurrency model
    One daemon thread consumes a ``queue.Queue`` fed by the store's hooks
    (which may run on any thread). Storage calls are synchronous. Queued
    "owner gone" work is batched: the owners gone from one namespace share one
    scan for dependents, so deleting N pods costs one scan, not N.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from local_apiserver.conversion import set_or_drop
from local_apiserver.crd import specs_for
from local_apiserver.errors import ApiError, tolerating
from local_apiserver.resources import CRD_RESOURCE, RESOURCES, ResourceSpec, ResourceTable, core_spec
from local_apiserver.store import Obj, Store
from rangeshard.core.backoff import Backoff
from rangeshard.core.loops import join_thread, start_thread
from rangeshard.core.timestamps import format_time

log = logging.getLogger(__name__)

_MAX_ATTEMPTS = 30
_RETRY_DELAY = 0.5
_RETRY_MAX = 5.0
_BATCH = 256


@dataclass
class _Work:
    action: str  # "owner_gone", "foreground", "namespace", "check_owners"
    spec: ResourceSpec
    obj: Obj
    propagation: str = "Background"
    attempts: int = 0
    #: Waits between attempts: 0.5 s doubling to 5 s.
    retry: Backoff = field(default_factory=lambda: Backoff(_RETRY_DELAY, _RETRY_MAX))


_NO_SPEC = RESOURCES[0]  # placeholder spec for work items that only carry an owner


def spec_for_owner(ref: dict[str, Any], table: ResourceTable | None = None) -> ResourceSpec | None:
    api_version = str(ref.get("apiVersion") or "")
    specs = table.specs() if table is not None else RESOURCES
    return next((s for s in specs if s.kind == ref.get("kind") and s.api_version == api_version), None)


class GarbageCollector:
    """The background collector thread (see module docstring)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._queue: queue.Queue[_Work | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._timers: set[threading.Timer] = set()
        self._lock = threading.Lock()
        self._alive: dict[tuple[str, str | None, str, str], bool] = {}  # owner liveness, per batch

    def start(self) -> None:
        self.store.on_deleted = self.owner_deleted
        self.store.on_created = self.object_created
        self._thread = start_thread("local-apiserver-gc", self._run, what="garbage collector")

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            for t in self._timers:
                t.cancel()
            self._timers.clear()
        self._queue.put(None)
        join_thread(self._thread, 5)

    # -- hooks (any thread) --------------------------------------------------
    def owner_deleted(self, spec: ResourceSpec, obj: Obj, propagation: str) -> None:
        meta = obj["metadata"]
        if spec.resource == CRD_RESOURCE and spec.crd is None and not meta.get("finalizers"):
            # Synchronous: the DELETE of a CRD answers once it is no longer served and its objects are gone.
            self.remove_custom_objects(obj)
        if spec.resource == "namespaces" and meta.get("deletionTimestamp"):
            self._queue.put(_Work("namespace", spec, obj))
        elif propagation == "Foreground" and "foregroundDeletion" in (meta.get("finalizers") or []):
            self._queue.put(_Work("foreground", spec, obj))
        else:
            self._queue.put(_Work("owner_gone", spec, obj, propagation))

    def remove_custom_objects(self, crd: Obj) -> None:
        """Stop serving a deleted CRD and delete its objects (their dependents are collected as usual)."""
        live = dict(crd)
        live["metadata"] = {k: v for k, v in crd["metadata"].items() if k != "deletionTimestamp"}
        name = str(crd["metadata"].get("name"))
        specs = [s for s in specs_for(live) if s.storage]
        self.store.table.set_crd(name, ())
        for spec in specs[:1]:
            for obj in list(self.store.iter_all(spec)):
                self._delete(spec, obj)
            # Objects held by finalizers go too: nothing serves them any more.
            self.store.client.delete_prefix(self.store.resource_prefix(spec))
        log.info("CRD %s deleted: its objects were removed and it is no longer served", name)

    def object_created(self, spec: ResourceSpec, obj: Obj) -> None:
        if obj["metadata"].get("ownerReferences"):
            self._queue.put(_Work("check_owners", spec, obj))

    # -- worker --------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch: list[_Work | None] = [self._queue.get()]
            while len(batch) < _BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                if None in batch:
                    return
                if not self._stopping.is_set():
                    self._handle_batch([w for w in batch if w is not None])
            finally:
                for _ in batch:
                    self._queue.task_done()

    def _handle_batch(self, batch: list[_Work]) -> None:
        """Handle queued work; owners gone from one namespace share one scan for dependents."""
        self._alive.clear()
        gone: dict[str | None, list[_Work]] = {}
        for work in batch:
            if work.action == "owner_gone":
                gone.setdefault(work.obj["metadata"].get("namespace"), []).append(work)
                continue
            try:
                self._handle(work)
            except Exception as e:
                self._retry(work, e)
        for namespace, works in gone.items():
            try:
                self._collect(namespace, works)
                self._wake_foreground_owners(works)
                self._wake_terminating_namespace(namespace)
            except Exception as e:
                for work in works:
                    self._retry(work, e)

    def _retry(self, work: _Work, error: BaseException) -> None:
        work.attempts += 1
        if work.attempts >= _MAX_ATTEMPTS or self._stopping.is_set():
            log.error("garbage collection of %s %s abandoned: %s", work.spec.resource, _name(work.obj), error)
            return
        log.info("garbage collection of %s %s retried: %s", work.spec.resource, _name(work.obj), error)

        def again() -> None:
            with self._lock:
                self._timers.discard(timer)
            if not self._stopping.is_set():
                self._queue.put(work)

        timer = threading.Timer(work.retry.next_delay(), again)
        timer.daemon = True
        with self._lock:
            self._timers.add(timer)
        timer.start()

    def _handle(self, work: _Work) -> None:
        if work.action == "check_owners":
            self._check_owners(work.spec, work.obj)
        elif work.action == "namespace":
            self._empty_namespace(work.obj)
        elif work.action == "foreground":
            self._foreground(work)
        else:
            self._delete_dependents(work.obj, work.propagation)

    def _dependents(self, owner: Obj) -> list[tuple[ResourceSpec, Obj]]:
        uid = owner["metadata"].get("uid")
        return [
            (spec, obj)
            for spec, obj in self._scan(owner["metadata"].get("namespace"))
            if any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])
        ]

    def _scan(self, namespace: str | None) -> Iterator[tuple[ResourceSpec, Obj]]:
        """Every stored object an owner in ``namespace`` (None: cluster-scoped) may own, or in that namespace."""
        for spec in self.store.table.storage_specs():
            if not spec.namespaced and namespace:
                continue  # namespaced owners cannot own cluster-scoped objects
            for obj in self.store.iter_all(spec, namespace if spec.namespaced else None):
                yield spec, obj

    def _wake_foreground_owners(self, works: list[_Work]) -> None:
        """Queue the Foreground deletion of the owners (still waiting) of objects that just left etcd.

        As kube's collector re-examines an owner when one of its dependents goes, so an owner held for long by a
        dependent's finalizer leaves as soon as that dependent does (not only within the bounded retries).
        """
        woken: set[Any] = set()
        for work in works:
            meta = work.obj["metadata"]
            for ref in meta.get("ownerReferences") or []:
                spec = spec_for_owner(ref, self.store.table)
                if spec is None or ref.get("uid") in woken:
                    continue
                owner = self._get(spec, meta.get("namespace") if spec.namespaced else None, str(ref.get("name")))
                if owner is None:
                    continue
                ometa = owner["metadata"]
                if ometa.get("uid") == ref.get("uid") and "foregroundDeletion" in (ometa.get("finalizers") or []):
                    woken.add(ref.get("uid"))
                    self._queue.put(_Work("foreground", spec, owner))

    def _wake_terminating_namespace(self, namespace: str | None) -> None:
        """Queue the emptying of ``namespace`` again if it is terminating: an object in it just left etcd.

        As kube's namespace controller re-examines a terminating namespace, so one whose content was held by
        finalizers for longer than the bounded retries still leaves once its last object does.
        """
        if not namespace:
            return
        spec = core_spec("namespaces")
        ns = self._get(spec, None, namespace)
        if ns is not None and ns["metadata"].get("deletionTimestamp"):
            self._queue.put(_Work("namespace", spec, ns))

    def _blocking_dependents(self, owner: Obj) -> list[tuple[ResourceSpec, Obj]]:
        """Dependents whose reference to ``owner`` has ``blockOwnerDeletion: true``: a Foreground owner waits for them.

        As kube's garbage collector: the others are deleted too, but the owner does not wait for them.
        """
        uid = owner["metadata"].get("uid")
        return [
            (spec, dep)
            for spec, dep in self._dependents(owner)
            if any(
                r.get("uid") == uid and r.get("blockOwnerDeletion")
                for r in dep["metadata"].get("ownerReferences") or []
            )
        ]

    def _owner_alive(self, ref: dict[str, Any], namespace: str | None) -> bool:
        """Does the owner ``ref`` names (by kind, name and uid) exist?

        Answers are cached for one batch: "gone" is final (a uid never comes
        back), and an owner deleted after an "alive" answer has queued its own
        "owner gone" work, which will see this dependent.
        """
        spec = spec_for_owner(ref, self.store.table)
        if spec is None:
            return True  # a kind we do not serve: never delete on a guess
        ns = namespace if spec.namespaced else None
        cache_key = (spec.resource, ns, str(ref.get("name") or ""), str(ref.get("uid") or ""))
        if cache_key in self._alive:
            return self._alive[cache_key]
        owner = self._get(spec, ns, cache_key[2])
        alive = owner is not None and owner["metadata"].get("uid") == ref.get("uid")
        self._alive[cache_key] = alive
        return alive

    def _delete_dependents(self, owner: Obj, propagation: str) -> None:
        self._collect(owner["metadata"].get("namespace"), [_Work("owner_gone", _NO_SPEC, owner, propagation)])

    def _collect(self, namespace: str | None, works: list[_Work]) -> None:
        """One scan of ``namespace`` for dependents of the (gone or Foreground-deleting) owners in ``works``.

        A dependent of a Foreground owner that has dependents of its own is deleted in the foreground too
        (kube's collector does the same), so the owner waits for the whole blocking tree.
        """
        orphan = {w.obj["metadata"].get("uid") for w in works if w.propagation == "Orphan"}
        cascade = {w.obj["metadata"].get("uid") for w in works if w.propagation != "Orphan"}
        foreground = {w.obj["metadata"].get("uid") for w in works if w.propagation == "Foreground"}
        for spec, dep in self._scan(namespace):
            meta = dep["metadata"]
            refs = meta.get("ownerReferences") or []
            uids = {r.get("uid") for r in refs}
            dropped = uids & orphan
            gone_owners = uids & cascade
            if not dropped and not gone_owners:
                continue
            others = [r for r in refs if r.get("uid") not in dropped | gone_owners]
            if gone_owners and not any(self._owner_alive(r, meta.get("namespace")) for r in others):
                if meta.get("deletionTimestamp"):
                    continue  # already being deleted (held by finalizers): deleting again changes nothing
                log.debug("deleting %s %s: its owners are gone", spec.resource, _name(dep))
                deep = bool(gone_owners & foreground) and bool(self._dependents(dep))
                self._delete(spec, dep, "Foreground" if deep else "Background")
            else:
                self._drop_references(spec, dep, dropped | gone_owners)

    def _drop_references(self, spec: ResourceSpec, dep: Obj, uids: set[Any]) -> None:
        meta = dep["metadata"]

        def mutate(current: Obj) -> Obj:
            cmeta = current["metadata"]
            refs = [r for r in cmeta.get("ownerReferences") or [] if r.get("uid") not in uids]
            set_or_drop(cmeta, "ownerReferences", refs)
            return current

        self._update(spec, meta, mutate)

    def _get(self, spec: ResourceSpec, namespace: str | None, name: str) -> Obj | None:
        """The object, or None when there is none."""
        try:
            return self.store.get(spec, namespace, name)
        except ApiError as e:
            if e.code != 404:
                raise
            return None

    def _update(self, spec: ResourceSpec, meta: Obj, mutate: Callable[[Obj], Obj]) -> None:
        """``guaranteed_update`` of the object ``meta`` names; nothing when it is gone."""
        with tolerating(404):
            self.store.guaranteed_update(spec, meta.get("namespace"), str(meta.get("name")), mutate)

    def _delete(self, spec: ResourceSpec, obj: Obj, propagation: str = "Background") -> None:
        meta = obj["metadata"]
        with tolerating(404, 409):  # already gone, or replaced by a new object of that name
            ns, name = meta.get("namespace"), str(meta.get("name"))
            self.store.delete(spec, ns, name, precondition_uid=meta.get("uid"), propagation=propagation)

    def _foreground(self, work: _Work) -> None:
        owner = work.obj
        self._delete_dependents(owner, "Foreground")
        blocking = self._blocking_dependents(owner)
        if any(not dep["metadata"].get("deletionTimestamp") for _, dep in blocking):
            raise ApiError(409, "Conflict", "blocking dependents still present")  # retried later
        if blocking:
            # Every one is being deleted, held by finalizers (for as long as they like): the owner is woken
            # when the last one leaves etcd (see _wake_foreground_owners), not by polling.
            return
        meta = owner["metadata"]

        def mutate(current: Obj) -> Obj:
            if current["metadata"].get("uid") != meta.get("uid"):
                raise ApiError(404, "NotFound", "owner replaced")
            fins = [f for f in current["metadata"].get("finalizers") or [] if f != "foregroundDeletion"]
            set_or_drop(current["metadata"], "finalizers", fins)
            return current

        self._update(work.spec, meta, mutate)

    def _empty_namespace(self, ns: Obj) -> None:
        name = str(ns["metadata"].get("name"))
        left = 0
        for spec, obj in self._scan(name):
            self._delete(spec, obj)
            left += 1
        # Deleted objects may have finalizers or new ones may race in: check again.
        remaining = list(self._scan(name)) if left else []
        self._report_remaining(ns, remaining)
        if remaining:
            raise ApiError(409, "Conflict", f"namespace {name} still has {len(remaining)} objects")
        spec = core_spec("namespaces")
        current = self._get(spec, None, name)
        if current is None or current["metadata"].get("uid") != ns["metadata"].get("uid"):
            return
        if current["metadata"].get("finalizers"):
            return  # somebody else's finalizer: the namespace goes when they remove it
        self.store.delete_now(spec, None, name, current)

    def _report_remaining(self, ns: Obj, remaining: list[tuple[ResourceSpec, Obj]]) -> None:
        """Set the terminating namespace's status conditions as kube's namespace controller does.

        ``NamespaceContentRemaining`` names what is left per resource and ``NamespaceFinalizersRemaining``
        the finalizers holding it (``kubectl describe ns`` shows why a namespace stays ``Terminating``).
        """
        resources = Counter(f"{spec.resource}.{spec.group}" for spec, _ in remaining)
        finalizers = Counter(fin for _, obj in remaining for fin in obj["metadata"].get("finalizers") or [])
        wanted = namespace_conditions(resources, finalizers)
        uid = ns["metadata"].get("uid")

        def mutate(current: Obj) -> Obj:
            if current["metadata"].get("uid") != uid:
                raise ApiError(404, "NotFound", "namespace replaced")
            status = current.get("status")
            current["status"] = status = status if isinstance(status, dict) else {}
            old = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, dict)}
            now = format_time()
            conditions = []
            for cond in wanted:
                kept = old.get(cond["type"]) or {}
                since = kept.get("lastTransitionTime") if kept.get("status") == cond["status"] else None
                conditions.append({**cond, "lastTransitionTime": since or now})
            status["conditions"] = conditions
            return current

        self._update(core_spec("namespaces"), ns["metadata"], mutate)

    def _check_owners(self, spec: ResourceSpec, obj: Obj) -> None:
        meta = obj["metadata"]
        refs = meta.get("ownerReferences") or []
        if not refs or any(self._owner_alive(r, meta.get("namespace")) for r in refs):
            return
        log.info("deleting %s %s/%s: all its owners are gone", spec.resource, meta.get("namespace"), meta.get("name"))
        self._delete(spec, obj)


def namespace_conditions(resources: dict[str, int], finalizers: dict[str, int]) -> list[dict[str, str]]:
    """kube's terminating-namespace conditions for the objects left (``resource.group`` counts) and their finalizers.

    Without ``lastTransitionTime`` (the caller keeps it while a condition's status stays the same).
    """
    left = ", ".join(f"{r} has {n} resource instances" for r, n in sorted(resources.items()))
    held = ", ".join(f"{f} in {n} resource instances" for f, n in sorted(finalizers.items()))
    rows = (
        ("NamespaceDeletionDiscoveryFailure", "False", "ResourcesDiscovered", "All resources successfully discovered"),
        (
            "NamespaceDeletionGroupVersionParsingFailure",
            "False",
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed",
        ),
        (
            "NamespaceDeletionContentFailure",
            "False",
            "ContentDeleted",
            "All content successfully deleted, may be waiting on finalization",
        ),
        ("NamespaceContentRemaining", "True", "SomeResourcesRemain", f"Some resources are remaining: {left}")
        if resources
        else ("NamespaceContentRemaining", "False", "ContentRemoved", "All content successfully removed"),
        (
            "NamespaceFinalizersRemaining",
            "True",
            "SomeFinalizersRemain",
            f"Some content in the namespace has finalizers remaining: {held}",
        )
        if finalizers
        else (
            "NamespaceFinalizersRemaining",
            "False",
            "ContentHasNoFinalizers",
            "All content-preserving finalizers finished",
        ),
    )
    return [dict(zip(("type", "status", "reason", "message"), row, strict=True)) for row in rows]


def _name(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))
