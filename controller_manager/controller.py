"""The sharded controller framework: declare resources and a reconcile function, get sharding for free.

Purpose
    A :class:`Controller` subclass declares its main resource, its dependent
    resources and ``reconcile(key, ctx)``. :class:`ControllerRuntime` runs it:
    one informer per resource through the proxy (main by own uid, dependents
    by controller-owner uid, both restricted to the instance's range), a
    client-go style workqueue (one key never on two workers), N worker
    threads, the in-range check immediately before each reconcile
    (:meth:`ShardInstance.try_begin`), the audit log, and metrics.

Invariants
    * A reconcile runs only after ``try_begin`` accepted its key's hash and
      ends (audit end written) *before* ``end`` releases it, so the handover
      drain sees it.
    * Each reconcile carries a deadline (its own bound and the lease fencing
      deadline, whichever is first); API calls take their timeout from it and
      :class:`~rangeshard.core.errors.ReconcileTimeout` aborts the rest.
    * Fault injection for tests: with ``reconcile_delay`` (config
      ``reconcileDelaySeconds``) every reconcile holds its claimed key that long
      (bounded by its deadline) before running, so handovers happen with keys
      mid-reconcile. 0 in production. With ``reconcile_hold_file`` (config
      ``reconcileHoldFile``) every reconcile holds its key while that file
      exists (bounded by its deadline, polled every 20 ms): a test creates the
      file, makes work, sees it in flight (``rangeshard_reconciles_in_flight``),
      moves a range, then removes the file.
    * A key is hashed by its main object's uid (remembered after deletion so
      cleanup stays with the owner of the range).
    * Every reconcile is reported to :attr:`ControllerRuntime.reconciles`
      (worker, key, deadline; whether it outlived its timeout) for the
      manager's watchdog (:mod:`controller_manager.watchdog`).

Concurrency model
    Informer threads enqueue; ``workers`` threads (``worker-<type>-<i>``)
    dequeue and reconcile; a resync thread re-enqueues all main objects
    periodically; the :class:`ShardInstance` thread runs the handover.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from kubernetes.client.exceptions import ApiException

from controller_manager.audit import AuditLog
from controller_manager.audit import now as audit_now
from controller_manager.cost import CostTracker
from controller_manager.fencing import FencedApiClient, WriteFenced
from controller_manager.indexer import IndexFunc
from controller_manager.informer import Informer
from controller_manager.metrics import Metrics
from controller_manager.reconcile import Expectations, ReconcileContext, Requeue, timed_out
from controller_manager.resources import Resource, controller_ref, object_key, raw_request
from controller_manager.shardhost import ShardHost, ShardSettings
from controller_manager.sharding import ShardInstance
from controller_manager.watchdog import ReconcileTracker
from controller_manager.workqueue import WorkQueue
from hashing import MAX_CHAIN, HashRange, ShardBy, canonical_via, hash_key, label_path, root_path
from rangeshard.core.loops import start_thread
from rangeshard.core.ownertoken import OwnerToken
from rangeshard.core.rest import GVR
from registry.histogram import workload_histogram
from registry.models import MainResource

log = logging.getLogger(__name__)

#: What controllers import from here (defined in :mod:`controller_manager.reconcile`).
__all__ = ["Controller", "ControllerRuntime", "Expectations", "ReconcileContext", "Requeue", "timed_out"]

_CRDS = GVR("apiextensions.k8s.io", "v1", "customresourcedefinitions")


class Controller(ABC):
    """Base class of a sharded controller (see docs/writing-a-controller.md)."""

    name: ClassVar[str]
    main: ClassVar[Resource]
    dependents: ClassVar[tuple[Resource, ...]] = ()
    #: Resources read further down than the dependents, each placed by the root of its chain of
    #: controller owners through the ``via`` kinds (``by: root``): ``((PODS, ("replicasets.apps",)),)``
    #: gives a Deployment controller exactly the pods of its own Deployments. An event of one
    #: enqueues the main object at the top of its chain (found in the informers).
    chained: ClassVar[tuple[tuple[Resource, tuple[str, ...]], ...]] = ()
    #: Your own indexes of the informer stores, per resource: ``{WIDGETS: {"color": lambda o: [o["spec"]["color"]]}}``
    #: (name -> function returning the values an object is filed under); read them in a reconcile with
    #: ``self.rt.store(WIDGETS).by_index("color", "blue")``. Every store also has ``namespace``, ``owner``
    #: and ``orphans`` (:mod:`controller_manager.indexer`).
    indexers: ClassVar[Mapping[Resource, Mapping[str, IndexFunc]]] = {}
    #: CustomResourceDefinition manifests (dicts) the runtime creates at start when they are missing
    #: (needs ``create`` on customresourcedefinitions; without it, install them yourself).
    crds: ClassVar[tuple[dict[str, Any], ...]] = ()

    def __init__(self, runtime: ControllerRuntime) -> None:
        self.rt = runtime
        self.api = runtime.api_client

    def owner_keys(self, resource: Resource, obj: dict[str, Any]) -> list[str]:
        """Main-object keys a dependent event concerns: its controller owner, or orphan candidates."""
        ref = controller_ref(obj)
        ns = (obj.get("metadata") or {}).get("namespace")
        if ref is not None:
            if ref.get("kind") == self.main.kind and ref.get("name"):
                return [f"{ns}/{ref['name']}" if ns else str(ref["name"])]
            return []
        return self.orphan_keys(resource, obj)

    def orphan_keys(self, resource: Resource, obj: dict[str, Any]) -> list[str]:
        """Main objects that might adopt an orphan dependent (default: none)."""
        return []

    def on_dependent_event(self, event: str, resource: Resource, obj: dict[str, Any]) -> None:  # noqa: B027
        """Hook for expectations bookkeeping (default: nothing; optional to override)."""

    @abstractmethod
    def reconcile(self, key: str, ctx: ReconcileContext) -> None:
        """Drive the object ``key`` (``namespace/name``) towards its spec."""


def _uid_hash(uid: str) -> int:
    """``hash_key(uid)``, handing ``hash_key``'s memo a copy of the string, never a stored object's own.

    The memo (32,768 entries) would otherwise keep the uid string of every
    object listed, and with it the memory of all of them after the range
    shrank (issue 27: a manager that had listed 20,000 ReplicaSets kept that
    RSS after handing most of them away).
    """
    return hash_key(uid.encode().decode())


def _via_name(resource: Resource) -> str:
    """A resource as ``via`` kinds spell it: ``resource.group`` (``resource`` in the core group)."""
    return f"{resource.name}.{resource.group}" if resource.group else resource.name


class ControllerRuntime(ShardHost):
    """Runs one controller type in this process as one registered instance (see module docstring)."""

    def __init__(
        self,
        controller_cls: type[Controller],
        *,
        api_client: Any,
        shard: ShardSettings,
        workers: int,
        metrics: Metrics,
        audit: AuditLog | None = None,
        resync_period: float = 30.0,
        reconcile_delay: float = 0.0,
        reconcile_hold_file: str | None = None,
        cost_window: float = 300.0,
        shard_labels: Mapping[str, str] | None = None,
    ) -> None:
        """``shard``: the instance's settings (``main_resource`` set here); ``shard_labels``: the config's ``shard``."""
        self.api_client = api_client
        self.name = shard.controller_type
        self.instance_id = shard.instance_id
        self.workers = workers
        self.metrics = metrics
        self.audit = audit
        self.resync_period = resync_period
        # Fault injection (``reconcileDelaySeconds``): every reconcile holds its key this long first.
        self.reconcile_delay = reconcile_delay
        # Fault injection (``reconcileHoldFile``): while this file exists, every reconcile holds its key.
        self.reconcile_hold_file = Path(reconcile_hold_file) if reconcile_hold_file else None
        self.queue: WorkQueue[str] = WorkQueue(self.name)
        #: What the workers reconcile now and how the last reconciles ended (read by the manager's watchdog).
        self.reconciles = ReconcileTracker()
        #: Measured reconcile seconds per key hash (published with the histogram, for rebalance --by cost).
        self.costs = CostTracker(cost_window)
        #: The key hash of main objects gone from the store (deleted, or out of the range after a
        #: relist) whose key is still to be processed; nothing for the objects in the store. Ints, not
        #: the objects' uid strings: a reference into every object ever listed kept all of them
        #: resident after the range shrank (issue 27: RSS stayed at the high-water mark).
        self._gone: dict[str, int] = {}
        self._uids_lock = threading.Lock()
        self._fenced_tokens: set[OwnerToken | None] = set()  # one log line per fenced epoch
        self.controller = controller_cls(self)
        self.shard_labels = dict(shard_labels or {})  # plural.group placed by: label -> its label key
        self.main_label = self.shard_labels.get(controller_cls.main.gvr.label)  # None: the main by its uid
        # Published in the record: the proxy measures progress on the main resource (by its rule).
        main, by = controller_cls.main, ShardBy.LABEL if self.main_label else ShardBy.UID
        main_resource = MainResource(group=main.group, version=main.version, resource=main.name, by=by)
        main_resource = main_resource.model_copy(update={"label_key": self.main_label})
        self.shard = ShardInstance(replace(shard, main_resource=main_resource), self)
        self.informers = self._informers(controller_cls, api_client)
        for informed, inf in self.informers.items():
            metrics.informer_objects.labels(self.name, informed).set_function(inf.__len__)
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        metrics.set_state(self.name, self.instance_id, "init")

    def _informers(self, controller_cls: type[Controller], api_client: Any) -> dict[str, Informer]:
        """One informer per resource, restricted to this instance's range; the shard rules declared to the proxy.

        The main resource by its own uid, each dependent by its controller owner's uid: the same rules
        its informers read with are declared with every write (the proxy's fence applies them).
        Chained resources (read two levels down) by their root through their via kinds.
        """
        handlers: list[tuple[Resource, ShardBy, str, Callable[[str, dict[str, Any]], None]]] = [
            (controller_cls.main, ShardBy.UID, ShardBy.UID.path, self._on_main),
            *(
                (dep, ShardBy.OWNER, ShardBy.OWNER.path, functools.partial(self._on_dependent, resource=dep))
                for dep in controller_cls.dependents
            ),
            *(
                (res, ShardBy.ROOT, root_path(via), functools.partial(self._on_chained, resource=res))
                for res, via in controller_cls.chained
            ),
        ]
        labels = self.shard_labels  # the config's by: label entries replace the built-in rule
        handlers = [
            (r, ShardBy.LABEL, label_path(labels[r.gvr.label]), f) if r.gvr.label in labels else (r, b, p, f)
            for r, b, p, f in handlers
        ]
        if isinstance(api_client, FencedApiClient):
            api_client.set_rules({resource.gvr.label: rule for resource, rule, _, _ in handlers}, labels)
        informers = {
            resource.name: Informer(
                api_client,
                resource,
                path=path,
                range_source=self.shard.informer_range,
                on_event=on_event,
                name=f"{self.name}-{resource.name}",
                indexers=controller_cls.indexers.get(resource),
                floor_source=functools.partial(self.shard.floor, resource.gvr.label),
            )
            for resource, _rule, path, on_event in handlers
        }
        # A chained informer's by_root walks down the informers of its via kinds (those this controller has).
        for res, via in controller_cls.chained:
            kinds = set(canonical_via(via))
            informers[res.name].via = tuple(
                i for i in informers.values() if _via_name(i.resource) in kinds and i.resource != res
            )
        return informers

    @property
    def watched_informers(self) -> list[Informer]:
        """The informers the watchdog checks for silence."""
        return list(self.informers.values())

    # -- stores ----------------------------------------------------------------
    def store(self, resource: Resource) -> Informer:
        return self.informers[resource.name]

    def _main_hash(self, obj: dict[str, Any]) -> int | None:
        """A main object's key: its uid's hash, or (``by: label``) its label value's when it has the label."""
        meta = obj.get("metadata") or {}
        value = (meta.get("labels") or {}).get(self.main_label) if self.main_label is not None else None
        uid = value if isinstance(value, str) else meta.get("uid")  # the value: hashed like a uid (a copy)
        return _uid_hash(uid) if uid else None

    def key_hash(self, key: str) -> int | None:
        obj = self.informers[self.controller.main.name].get(key)
        found = self._main_hash(obj) if obj is not None else None
        if found is not None:
            return found
        with self._uids_lock:
            return self._gone.get(key)

    def _forget_gone(self, key: str, key_hash: int) -> None:
        """``key`` is done with: drop its remembered hash unless its object came back or went again since."""
        if self.informers[self.controller.main.name].get(key) is not None:
            return
        with self._uids_lock:
            if self._gone.get(key) == key_hash:
                del self._gone[key]

    # -- the shard instance's host (ShardHost) -----------------------------------
    def synced(self, epoch: int) -> bool:
        return all(i.synced_epoch == epoch for i in self.informers.values())

    def on_epoch(self) -> None:
        for inf in self.informers.values():
            inf.reset()

    def on_allowed(self) -> None:
        for obj in self.informers[self.controller.main.name].items():
            self.queue.add(object_key(obj))

    def on_state(self, state: str) -> None:
        self.metrics.set_state(self.name, self.instance_id, state)

    def on_token(self, token: OwnerToken) -> None:
        if isinstance(self.api_client, FencedApiClient):
            self.api_client.set_token(token)

    def on_count(self, event: str) -> None:
        self.metrics.handover.labels(self.name, event).inc()

    def written_versions(self) -> dict[str, int]:
        return self.api_client.written.snapshot() if isinstance(self.api_client, FencedApiClient) else {}

    def workload(self, rng: HashRange) -> tuple[int, dict[str, Any] | None]:
        found = (self._main_hash(obj) for obj in self.informers[self.controller.main.name].items())
        keys = [k for k in found if k is not None]
        hist = workload_histogram(keys, rng, self.costs.snapshot(), self.costs.window)  # cost: rebalance --by cost
        total = sum(hist["objects"])
        self.metrics.workload.labels(self.name).set(total)
        self.metrics.cost.labels(self.name).set(round(sum(hist["cost"]), 6))
        return total, hist

    # -- events -----------------------------------------------------------------
    def _on_main(self, event: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        with self._uids_lock:
            if event == "DELETED":
                gone = self._main_hash(obj)
                if gone is not None:
                    self._gone[key] = gone
            else:
                self._gone.pop(key, None)
        self.queue.add(key)

    def _on_dependent(self, event: str, obj: dict[str, Any], *, resource: Resource) -> None:
        self.controller.on_dependent_event(event, resource, obj)
        for key in self.controller.owner_keys(resource, obj):
            self.queue.add(key)

    def _on_chained(self, event: str, obj: dict[str, Any], *, resource: Resource) -> None:
        self.controller.on_dependent_event(event, resource, obj)
        key = self._main_key_above(obj)
        if key is not None:
            self.queue.add(key)

    def _main_key_above(self, obj: dict[str, Any]) -> str | None:
        """The key of the main object at the top of ``obj``'s controller chain, found in the informers."""
        main = self.controller.main
        current: dict[str, Any] | None = obj
        for _ in range(MAX_CHAIN):
            if current is None:
                return None
            ref = controller_ref(current)
            if ref is None or not ref.get("name"):
                return None
            ns = (current.get("metadata") or {}).get("namespace")
            key = f"{ns}/{ref['name']}" if ns else str(ref["name"])
            if ref.get("kind") == main.kind:
                return key
            above = next((i for i in self.informers.values() if i.resource.kind == ref.get("kind")), None)
            current = above.get(key) if above is not None else None
        return None

    # -- workers ----------------------------------------------------------------
    def install_crds(self, timeout: float = 10.0) -> None:
        """Create the controller's CRDs that do not exist yet (409 = present; other errors are logged)."""
        for crd in self.controller.crds:
            name = (crd.get("metadata") or {}).get("name")
            try:
                raw_request(
                    self.api_client, "POST", _CRDS.path(), body=crd, content_type="application/json", timeout=timeout
                ).read()  # read: that gives the connection back to the pool
                log.info("%s: created CustomResourceDefinition %s", self.name, name)
            except ApiException as e:
                if e.status != 409:
                    log.warning("%s: cannot create CRD %s: %s %s", self.name, name, e.status, (e.body or "")[:200])
            except Exception as e:
                log.warning("%s: cannot create CRD %s: %s", self.name, name, e)

    def start(self) -> None:
        self.install_crds()
        for inf in self.informers.values():
            inf.start()
        self.shard.start()
        for i in range(self.workers):
            self._threads.append(start_thread(f"worker-{self.name}-{i}", self._worker, what=f"worker {self.name}"))
        self._threads.append(start_thread(f"resync-{self.name}", self._resync, what=f"resync {self.name}"))

    def stop(self, join_timeout: float = 10.0) -> None:
        """Graceful leave: drain, revoke the lease, stop workers and informers.

        ``join_timeout`` bounds the wait for each worker thread (short when the
        manager exits because a worker is wedged: the process's end ends it).
        """
        self.shard.stop()
        self._stop.set()
        self.queue.shutdown()
        for t in self._threads:
            t.join(timeout=join_timeout)
        for inf in self.informers.values():
            inf.stop()

    def _resync(self) -> None:
        while not self._stop.wait(self.resync_period):
            self.on_allowed()

    def _worker(self) -> None:
        while not self._stop.is_set():
            key = self.queue.get(timeout=0.5)
            if key is None:
                if self.queue.shutting_down:
                    return
                continue
            try:
                self._process(key)
            finally:
                self.queue.done(key)
                self.metrics.queue_depth.labels(self.name).set(len(self.queue))

    def _hold(self, ctx: ReconcileContext) -> None:
        """Fault injection: hold the key while the hold file exists, at most until the reconcile's deadline."""
        hold = self.reconcile_hold_file
        while hold is not None and hold.exists() and ctx.remaining() > 0 and not self._stop.is_set():
            self._stop.wait(min(0.02, max(0.0, ctx.remaining())))

    def _process(self, key: str) -> None:
        key_hash = self.key_hash(key)
        if key_hash is None:
            self.queue.forget(key)
            return
        deadline = self.shard.try_begin(key, key_hash)
        if deadline is None:
            # Not ours now. In our range but paused (relist, lock, fencing deadline
            # near): look again soon. Out of range: drop; a relist or resync brings
            # it back if it becomes ours.
            self.metrics.skipped.labels(self.name).inc()
            if self.shard.in_range(key_hash):
                self.queue.add_after(key, 0.25)
            else:
                self._forget_gone(key, key_hash)
            return
        self._reconcile(key, key_hash, deadline)

    def _reconcile(self, key: str, key_hash: int, deadline: float) -> None:
        """One claimed reconcile: run it, sort out how it ended, then account for it (audit, release, metrics)."""
        ctx = ReconcileContext(key, deadline, self.shard.clock)
        in_flight = self.metrics.in_flight.labels(self.name)
        start = audit_now()
        t0 = time.monotonic()
        result = "ok"
        declare = (
            self.api_client.reconciling(key_hash)
            if isinstance(self.api_client, FencedApiClient)
            else contextlib.nullcontext()
        )
        in_flight.inc()
        cpu0 = time.thread_time()
        worker = threading.current_thread().name
        self.reconciles.begin(worker, key, deadline)
        try:
            with declare:
                if self.reconcile_delay > 0:
                    # A slow reconcile: the key is held (in flight) for the whole delay, then acted on.
                    self._stop.wait(min(self.reconcile_delay, max(0.0, ctx.remaining())))
                if self.reconcile_hold_file is not None:
                    self._hold(ctx)
                self.controller.reconcile(key, ctx)
            self.queue.forget(key)
            self._forget_gone(key, key_hash)
        except Exception as e:
            result = self._failed(key, key_hash, e, time.monotonic() - t0)
        finally:
            end = audit_now()
            if self.audit is not None:
                self.audit.record(self.name, self.instance_id, key, start, end)
            self.shard.end(key)
            in_flight.dec()
            self.reconciles.end(worker, key, result == "timeout" or self.shard.clock.monotonic() >= deadline)
            took = time.monotonic() - t0
            self.costs.record(key_hash, took)
            self.metrics.reconcile_seconds_total.labels(self.name).inc(took)
            self.metrics.reconcile_cpu_seconds_total.labels(self.name).inc(max(0.0, time.thread_time() - cpu0))
            self.metrics.reconciles.labels(self.name, result).inc()
            self.metrics.reconcile_seconds.labels(self.name).observe(took)

    def _failed(self, key: str, key_hash: int, e: Exception, took: float) -> str:
        """Requeue (or drop) a key whose reconcile raised ``e``, count and log it; return the result label."""
        if isinstance(e, WriteFenced):
            # Loss of ownership: drop the key (no retry; the owner has it, or a relist brings it back).
            self.queue.forget(key)
            self._forget_gone(key, key_hash)
            self.metrics.fenced_writes.labels(self.name, e.reason).inc()
            if self.shard.write_fenced(e.token, stale_epoch=e.reason == "StaleEpoch"):
                with self._uids_lock:
                    first = e.token not in self._fenced_tokens
                    self._fenced_tokens.add(e.token)
                if first:
                    log.warning("%s: %s (key %s dropped)", self.name, e, key)
            return "fenced"
        if isinstance(e, Requeue):
            if e.after is not None:
                self.queue.add_after(key, e.after)
            else:
                self.queue.add_rate_limited(key)
            return "requeue"
        self.queue.add_rate_limited(key)
        if isinstance(e, ApiException):
            self.metrics.reconcile_errors.labels(self.name, "conflict" if e.status == 409 else "api").inc()
            if e.status != 409:
                log.warning("%s: reconcile %s: API error %s %s", self.name, key, e.status, (e.reason or "")[:200])
            return "conflict" if e.status == 409 else "error"
        what = timed_out(e)
        if what is not None:
            # An expected operational event (a slow API server, a deadline near the lease's end):
            # one WARNING line, no traceback.
            self.metrics.reconcile_errors.labels(self.name, "timeout").inc()
            log.warning(
                "%s: reconcile %s timed out after %.2fs (reconcile timeout %.2fs): %s",
                self.name,
                key,
                took,
                self.shard.settings.reconcile_timeout,
                what,
            )
            return "timeout"
        self.metrics.reconcile_errors.labels(self.name, "exception").inc()
        log.debug("%s: reconcile %s failed", self.name, key, exc_info=e)
        log.error("%s: reconcile %s failed: %s: %s (traceback at DEBUG)", self.name, key, type(e).__name__, e)
        return "error"

    @property
    def ready(self) -> bool:
        return self.shard.allowed is not None

    def not_ready_reason(self) -> str | None:
        """Why this controller processes nothing now (``None`` when it does): a failing informer, else its state."""
        if self.ready:
            return None
        failing = [f"informer {inf.name}: {inf.last_error}" for inf in self.informers.values() if inf.last_error]
        if failing:
            return "; ".join(failing)
        if self.shard.fatal is not None:
            return self.shard.fatal
        return f"{self.shard.state} (caches relisting or waiting for a handover)"
