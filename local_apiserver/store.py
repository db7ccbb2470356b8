"""Object storage in etcd, with kube-apiserver's registry semantics.

Purpose
    Create, read, list, update and delete Kubernetes objects stored as JSON
    under ``<prefix>/<group>/<resource>/[<namespace>/]<name>`` (``core`` for
    the core group; default prefix ``/registry``), applying what
    kube-apiserver's generic registry applies: uid, creationTimestamp,
    generation, generateName, namespace existence, optimistic concurrency,
    finalizers before deletion, status-subresource isolation. The stored form
    and continue tokens are :mod:`local_apiserver.codec`'s, what an update
    stores and how long a pod terminates :mod:`local_apiserver.strategy`'s.

Invariants
    * ``metadata.resourceVersion`` is never stored; it is the etcd mod revision
      of the key when read, and a list's ``resourceVersion`` is the etcd revision
      it was read at (all pages of one list read the same revision).
    * Every write is one etcd transaction guarded by the key's create or mod
      revision, so concurrent writers never lose updates: a stale explicit
      ``resourceVersion`` is a 409 Conflict, an implicit one is retried.
    * Every method raises :class:`~local_apiserver.errors.ApiError` for client
      problems; etcd failures (``RegistryError``) become 503/504 ``ApiError``.
    * ``on_deleted`` is called after an object really left etcd (for the
      garbage collector), ``on_created`` after a create (dangling owners).

Concurrency model
    Synchronous; called from worker threads (``anyio.to_thread``) and the GC
    thread. Holds no mutable state besides the thread-safe :class:`EtcdClient`.
"""

from __future__ import annotations

import contextvars
import copy
import ipaddress
import logging
import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from hashing import ShardSelector
from local_apiserver import codec, services
from local_apiserver.codec import Obj, decode_continue, encode_continue, parse_resource_version
from local_apiserver.errors import (
    EXPIRED_CONTINUE_MESSAGE,
    already_exists,
    bad_request,
    conflict,
    etcd_errors,
    forbidden,
    gone,
    not_found,
    timeout,
    tolerating,
)
from local_apiserver.resources import ResourceSpec, ResourceTable, core_spec
from local_apiserver.strategy import check_precondition, pod_grace_period, prepare_update
from local_apiserver.validation import apply_defaults, check_body_shape, prepare_for_create, validate_object
from rangeshard.core.errors import RegistryError, RevisionCompacted
from rangeshard.core.etcd import KV, Compare, Delete, EtcdClient, Op, Put, TxnResult, prefix_end
from rangeshard.core.selectors import FieldSelector, LabelSelector
from rangeshard.core.timestamps import format_time, parse_time

#: ``Obj``, ``parse_resource_version`` and ``check_precondition`` are importable from here too.
__all__ = ["ListResult", "Obj", "Store", "check_precondition", "parse_resource_version"]


#: Set for the request being served when it asked ``dryRun=All``: the store validates, defaults and checks
#: its guards as for a real write, and writes nothing (no revision, no watch event, no hook).
DRY_RUN: contextvars.ContextVar[bool] = contextvars.ContextVar("rangeshard_dry_run", default=False)
log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/registry"
MAX_RETRIES = 16
_PAGE = 500
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

T = TypeVar("T")


@dataclass
class ListResult:
    revision: int
    items: list[Obj]
    continue_token: str | None


class Store:
    """The storage layer (see module docstring)."""

    def __init__(
        self,
        client: EtcdClient,
        prefix: str | None = None,
        table: ResourceTable | None = None,
        service_range: ipaddress.IPv4Network = services.DEFAULT_SERVICE_RANGE,
    ) -> None:
        self.client = client
        #: Cluster IPs of Services come from here (``--service-cluster-ip-range``).
        self.service_range = service_range
        self.prefix = (prefix or DEFAULT_PREFIX).rstrip("/")
        # Built-ins plus served CRDs; shared with the app's routing (local_apiserver.crd keeps it current).
        self.table = table or ResourceTable()
        self.on_deleted: Callable[[ResourceSpec, Obj, str], None] | None = None
        self.on_created: Callable[[ResourceSpec, Obj], None] | None = None

    # -- keys ----------------------------------------------------------------
    def resource_prefix(self, spec: ResourceSpec, namespace: str | None = None) -> str:
        base = f"{self.prefix}/{spec.storage_group}/{spec.storage_resource}/"
        if spec.namespaced and namespace:
            return f"{base}{namespace}/"
        return base

    def selected_prefix(self, spec: ResourceSpec, namespace: str | None, fields: FieldSelector) -> str:
        """The prefix a list or watch reads: a ``metadata.namespace`` field selector narrows all namespaces to one."""
        if namespace is None and spec.namespaced:
            namespace = fields.value_of("metadata.namespace")
        return self.resource_prefix(spec, namespace)

    def key(self, spec: ResourceSpec, namespace: str | None, name: str) -> str:
        return f"{self.resource_prefix(spec, namespace)}{name}"

    decode = staticmethod(codec.decode)
    encode = staticmethod(codec.encode)
    #: The object an update of ``current`` to ``new`` stores (:func:`local_apiserver.strategy.prepare_update`).
    merge_update = staticmethod(prepare_update)

    def _txn(self, compare: list[Compare], success: list[Op], what: str) -> TxnResult:
        # A dry run (``?dryRun=All``) checks the guards (name free, namespace active, object unchanged) and
        # writes nothing: every write of the store goes through here, so nothing else needs to know.
        ops = [] if DRY_RUN.get() else success
        return self._call(lambda: self.client.transaction(compare, ops, what=what))

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except RegistryError as e:
            raise etcd_errors(e) from e

    # -- reads ---------------------------------------------------------------
    def revision(self) -> int:
        return self._call(self.client.revision)

    def get_kv(self, spec: ResourceSpec, namespace: str | None, name: str) -> KV | None:
        key = self.key(spec, namespace, name)
        return self._call(lambda: self.client.get(key))[1]

    def get(self, spec: ResourceSpec, namespace: str | None, name: str) -> Obj:
        return self._read(spec, namespace, name)[1]

    def _read(self, spec: ResourceSpec, namespace: str | None, name: str) -> tuple[KV, Obj]:
        """The stored object as read (its KV) and decoded; a 404 when there is none."""
        kv = self.get_kv(spec, namespace, name)
        if kv is None:
            raise not_found(spec.group_resource, name)
        return kv, self.decode(spec, kv)

    def list_page(
        self,
        spec: ResourceSpec,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        *,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
        shard: ShardSelector | None = None,
    ) -> ListResult:
        """One page of a list, read at one etcd revision (see module docstring)."""
        prefix = self.selected_prefix(spec, namespace, fields)
        end = prefix_end(prefix)
        start = prefix
        read_rev: int | None = None
        rv = parse_resource_version(resource_version)
        # The query was validated by rangeshard.core.listoptions.ListQuery (kube's rules and codes).
        if continue_token:
            read_rev, suffix = decode_continue(continue_token)
            start = prefix + suffix
        elif resource_version_match == "Exact":
            read_rev = rv
        elif rv:
            current = self.revision()
            if rv > current:
                raise timeout(f"Too large resource version: {rv}, current: {current}")
        items: list[Obj] = []
        last_key: str | None = None
        more = False
        want = limit if limit and limit > 0 else None
        page = min(max(want or _PAGE, 1), _PAGE) if want else _PAGE
        while True:
            try:
                rev, kvs, more_kv = self.client.get_range(start, end, limit=page, revision=read_rev)
            except RevisionCompacted as e:
                raise (gone(EXPIRED_CONTINUE_MESSAGE) if continue_token else etcd_errors(e)) from e
            except RegistryError as e:
                raise etcd_errors(e) from e
            if read_rev is None:
                read_rev = rev
            for n, kv in enumerate(kvs):
                last_key = kv.key
                obj = self.decode(spec, kv)
                meta = obj["metadata"]
                if (
                    labels.matches(meta.get("labels") or {})
                    and fields.matches(obj)
                    and (shard is None or shard.matches(obj))
                ):
                    items.append(obj)
                    if want is not None and len(items) >= want:
                        more = n < len(kvs) - 1 or more_kv
                        break
            if more or not more_kv or not kvs:
                break
            start = kvs[-1].key + "\0"
        token = None
        if more and last_key is not None:
            token = encode_continue(read_rev, last_key[len(prefix) :] + "\0")
        return ListResult(read_rev, items, token)

    def iter_all(self, spec: ResourceSpec, namespace: str | None = None) -> Iterator[Obj]:
        """Every object of ``spec`` (in ``namespace``), read page by page at one revision."""
        token: str | None = None
        while True:
            result = self.list_page(
                spec, namespace, LabelSelector(()), FieldSelector(()), limit=_PAGE, continue_token=token
            )
            yield from result.items
            if not result.continue_token:
                return
            token = result.continue_token

    # -- create --------------------------------------------------------------
    def create(self, spec: ResourceSpec, namespace: str | None, body: Any) -> Obj:
        obj = copy.deepcopy(check_body_shape(spec, body))
        obj["kind"] = spec.kind
        obj["apiVersion"] = spec.api_version
        meta = obj.setdefault("metadata", {}) or {}
        obj["metadata"] = meta
        if meta.get("resourceVersion"):
            raise bad_request("resourceVersion should not be set on objects to be created")
        namespace = self._namespace_for(spec, namespace, meta)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = str(meta["generateName"]) + "".join(secrets.choice(_GENERATE_ALPHABET) for _ in range(5))
        # The uid first, as kube-apiserver fills it before the strategy's PrepareForCreate/Validate (a Job's
        # generated selector names it).
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = format_time()
        prepare_for_create(spec, obj)
        validate_object(spec, obj)
        if spec.status:
            obj.pop("status", None)
        apply_defaults(spec, obj)
        if spec.resource == "services" and spec.group == "":
            ips, node_ports = services.in_use(self.iter_all(spec))
            services.allocate(obj, ips, node_ports, network=self.service_range)
        for transient in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"):
            meta.pop(transient, None)
        if spec.generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        key = self.key(spec, namespace, str(meta["name"]))
        for _ in range(MAX_RETRIES):
            compare = [Compare.create(key, "==", 0)]
            if spec.namespaced and namespace is not None:
                # The namespace must exist, be active, and stay unchanged until the write (no
                # object slips into a namespace being terminated).
                ns_key, ns_rev = self._require_namespace(namespace, spec, str(meta["name"]))
                compare.append(Compare.mod(ns_key, "==", ns_rev))
            result = self._txn(compare, [Put(key, self.encode(obj))], f"creating {key}")
            if result.succeeded:
                break
            if self.get_kv(spec, namespace, str(meta["name"])) is not None:
                raise already_exists(spec.group_resource, str(meta["name"]))
        else:
            raise conflict(spec.group_resource, str(meta["name"]), "the namespace kept changing; please retry")
        if DRY_RUN.get():
            return obj  # nothing was written: no resourceVersion, no hook, no default ServiceAccount
        meta["resourceVersion"] = str(result.revision)
        if self.on_created is not None:
            self.on_created(spec, obj)
        if spec.resource == "namespaces" and spec.group == "":
            self._default_service_account(str(meta["name"]))
        return obj

    def _default_service_account(self, namespace: str) -> None:
        """Every namespace gets a ServiceAccount ``default``, as kube-controller-manager creates one."""
        with tolerating(403, 409):  # already there, or the namespace is already terminating
            self.create(core_spec("serviceaccounts"), namespace, {"metadata": {"name": "default"}})

    def _namespace_for(self, spec: ResourceSpec, namespace: str | None, meta: dict[str, Any]) -> str | None:
        if not spec.namespaced:
            meta.pop("namespace", None)
            return None
        given = meta.get("namespace")
        if given and namespace and given != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request "
                f"({given!r} != {namespace!r})"
            )
        ns = namespace or given
        if not ns:
            raise bad_request("a namespaced object needs a namespace")
        meta["namespace"] = ns
        return str(ns)

    def _require_namespace(self, namespace: str, spec: ResourceSpec, name: str) -> tuple[str, int]:
        """``(key, mod revision)`` of the active namespace; 404 if absent, 403 if terminating."""
        kv = self.get_kv(core_spec("namespaces"), None, namespace)
        if kv is None:
            raise not_found("namespaces", namespace)
        ns = self.decode(core_spec("namespaces"), kv)
        if ns["metadata"].get("deletionTimestamp"):
            error = forbidden(
                spec.group_resource,
                name,
                f"unable to create new content in namespace {namespace} because it is being terminated",
            )
            # kube's NamespaceLifecycle admission adds this cause (client-go's HasStatusCause(err,
            # NamespaceTerminatingCause) is how controllers recognise the refusal).
            error.details = {
                **(error.details or {}),
                "causes": [
                    {
                        "reason": "NamespaceTerminating",
                        "message": f"namespace {namespace} is being terminated",
                        "field": "metadata.namespace",
                    }
                ],
            }
            raise error
        return kv.key, kv.mod_revision

    def ensure_namespaces(self, names: tuple[str, ...] = INITIAL_NAMESPACES) -> None:
        """Create the namespaces kube-apiserver creates at start-up (if absent)."""
        for name in names:
            with tolerating(409):
                self.create(core_spec("namespaces"), None, {"metadata": {"name": name}})

    # -- update --------------------------------------------------------------
    def guaranteed_update(
        self,
        spec: ResourceSpec,
        namespace: str | None,
        name: str,
        mutate: Callable[[Obj], Obj],
    ) -> Obj:
        """Read, ``mutate`` (which may raise ApiError, e.g. 409 on a stale RV), write guarded; retry races.

        ``mutate`` gets a private copy of the current object (with its
        resourceVersion) and returns the desired object. Identical results are
        not written (no new revision, no watch event), as kube-apiserver does.
        """
        for _ in range(MAX_RETRIES):
            kv, current = self._read(spec, namespace, name)
            desired = mutate(copy.deepcopy(current))
            desired["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            if desired == current:
                return current
            key = kv.key
            meta = desired["metadata"]
            if (
                meta.get("deletionTimestamp")
                and not meta.get("finalizers")
                and not meta.get("deletionGracePeriodSeconds")  # a pod in its grace period stays (kube's rule)
                and spec.resource != "namespaces"
            ):
                result = self._txn([Compare.mod(key, "==", kv.mod_revision)], [Delete(key)], f"deleting {key}")
                if result.succeeded:
                    meta["resourceVersion"] = str(result.revision)
                    self._deleted(spec, desired, "Background")
                    return desired
                continue
            result = self._txn(
                [Compare.mod(key, "==", kv.mod_revision)], [Put(key, self.encode(desired))], f"updating {key}"
            )
            if result.succeeded:
                meta["resourceVersion"] = str(result.revision)
                return desired
        raise conflict(spec.group_resource, name, "too many concurrent writers; please retry")

    def update(self, spec: ResourceSpec, namespace: str | None, name: str, body: Any, *, subresource: str = "") -> Obj:
        """PUT of the main resource (``subresource=""``) or of ``status``."""
        new = check_body_shape(spec, body)
        new_meta = new.get("metadata") or {}
        if new_meta.get("name") not in (None, name):
            raise bad_request(
                f"the name of the object ({new_meta.get('name')}) does not match the name on the URL ({name})"
            )
        if spec.namespaced and new_meta.get("namespace") not in (None, "", namespace):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        expected = parse_resource_version(new_meta.get("resourceVersion"), "metadata.resourceVersion")

        def mutate(current: Obj) -> Obj:
            check_precondition(spec, name, current, expected)
            return self.merge_update(spec, current, copy.deepcopy(new), subresource)

        return self.guaranteed_update(spec, namespace, name, mutate)

    # -- delete --------------------------------------------------------------
    def delete(
        self,
        spec: ResourceSpec,
        namespace: str | None,
        name: str,
        *,
        precondition_uid: str | None = None,
        precondition_rv: int | None = None,
        propagation: str = "Background",
        grace_period_seconds: int | None = None,
    ) -> tuple[Obj, bool]:
        """Delete (or mark for deletion); return ``(object, gone_from_etcd)``.

        A pod bound to a node (``spec.nodeName``) and not finished is deleted
        gracefully, as kube-apiserver does: it gets ``deletionTimestamp`` (now
        plus the grace period: ``grace_period_seconds``, else the pod's
        ``terminationGracePeriodSeconds``) and ``deletionGracePeriodSeconds``
        and stays until its node removes it (a delete with grace 0); a later
        delete may only shorten the grace period.
        """
        for _ in range(MAX_RETRIES):
            kv, current = self._read(spec, namespace, name)
            meta = current["metadata"]
            for what, want, have in (
                ("UID", precondition_uid, meta.get("uid")),
                ("ResourceVersion", precondition_rv, kv.mod_revision),
            ):
                if want is not None and have != want:
                    why = f"Precondition failed: {what} in precondition: {want}, {what} in object meta: {have}"
                    raise conflict(spec.group_resource, name, why)
            finalizers = list(meta.get("finalizers") or [])
            if (
                propagation == "Foreground"
                and "foregroundDeletion" not in finalizers
                and not meta.get("deletionTimestamp")
            ):
                finalizers.append("foregroundDeletion")
            grace = pod_grace_period(spec, current, grace_period_seconds)
            if grace > 0:
                marked = self._mark_graceful(spec, kv, current, grace, finalizers)
                if marked is None:
                    continue
                return marked, False
            if spec.resource == "namespaces" or finalizers:
                marked = self._mark_deleting(spec, namespace, name, kv, current, finalizers)
                if marked is None:
                    continue
                return marked, False
            key = kv.key
            result = self._txn([Compare.mod(key, "==", kv.mod_revision)], [Delete(key)], f"deleting {key}")
            if result.succeeded:
                meta["resourceVersion"] = str(result.revision)
                self._deleted(spec, current, propagation)
                return current, True
        raise conflict(spec.group_resource, name, "too many concurrent writers; please retry")

    def _mark_graceful(self, spec: ResourceSpec, kv: KV, current: Obj, grace: int, finalizers: list[str]) -> Obj | None:
        """Start (or shorten) a pod's graceful termination; ``None`` if the object changed meanwhile."""
        meta = current["metadata"]
        now = datetime.now(UTC)
        due = now + timedelta(seconds=grace)
        old = meta.get("deletionTimestamp")
        if old and meta.get("deletionGracePeriodSeconds") is not None:
            old_due = parse_time(old)
            if old_due is not None and old_due <= due:
                return current  # already terminating at least as soon
        desired = copy.deepcopy(current)
        dmeta = desired["metadata"]
        dmeta["deletionTimestamp"] = format_time(due)
        dmeta["deletionGracePeriodSeconds"] = grace
        if finalizers:
            dmeta["finalizers"] = finalizers
        if not self._put_marked(kv, desired):
            return None
        if self.on_deleted is not None and not DRY_RUN.get() and "foregroundDeletion" in finalizers:
            self.on_deleted(spec, desired, "Foreground")  # the GC deletes the pod's dependents first
        return desired

    def _put_marked(self, kv: KV, desired: Obj) -> bool:
        """Write ``desired`` over ``kv`` if unchanged since read, setting its resourceVersion; False on a race."""
        key = kv.key
        result = self._txn(
            [Compare.mod(key, "==", kv.mod_revision)], [Put(key, self.encode(desired))], f"marking {key}"
        )
        if result.succeeded:
            desired["metadata"]["resourceVersion"] = str(result.revision)
        return result.succeeded

    def _mark_deleting(
        self, spec: ResourceSpec, namespace: str | None, name: str, kv: KV, current: Obj, finalizers: list[str]
    ) -> Obj | None:
        meta = current["metadata"]
        if (
            meta.get("deletionTimestamp")
            and finalizers == list(meta.get("finalizers") or [])
            and not meta.get("deletionGracePeriodSeconds")
        ):
            if spec.resource == "namespaces" and self.on_deleted is not None and not DRY_RUN.get():
                self.on_deleted(spec, current, "Background")
            return current
        desired = copy.deepcopy(current)
        dmeta = desired["metadata"]
        dmeta.setdefault("deletionTimestamp", format_time())
        dmeta["deletionGracePeriodSeconds"] = 0  # (a pod's grace period ends: only finalizers keep it)
        if finalizers:
            dmeta["finalizers"] = finalizers
        if spec.resource == "namespaces":
            desired.setdefault("status", {})["phase"] = "Terminating"
        if not self._put_marked(kv, desired):
            return None
        if (
            self.on_deleted is not None
            and not DRY_RUN.get()
            and (spec.resource == "namespaces" or "foregroundDeletion" in finalizers)
        ):
            # The GC empties a terminating namespace / deletes a foreground owner's dependents.
            self.on_deleted(spec, desired, "Foreground")
        return desired

    def delete_now(self, spec: ResourceSpec, namespace: str | None, name: str, current: Obj) -> None:
        """Remove ``current`` from etcd if unchanged since read (409 otherwise); no hooks."""
        key = self.key(spec, namespace, name)
        rev = int(current["metadata"]["resourceVersion"])
        result = self._txn([Compare.mod(key, "==", rev)], [Delete(key)], f"deleting {key}")
        if not result.succeeded:
            raise conflict(spec.group_resource, name, "the object has been modified")

    def _deleted(self, spec: ResourceSpec, obj: Obj, propagation: str) -> None:
        if self.on_deleted is not None and not DRY_RUN.get():
            try:
                self.on_deleted(spec, obj, propagation)
            except Exception:
                log.exception("garbage collector hook failed for %s %s", spec.resource, obj["metadata"].get("name"))
