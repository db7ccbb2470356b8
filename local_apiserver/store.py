"""Object storage in etcd, with kube-apiserver's registry semantics.

Purpose
    Create, read, list, update and delete Kubernetes objects stored as JSON
    under ``<prefix>/<group>/<resource>/[<namespace>/]<name>`` (``core`` for
    the core group; default prefix ``/registry``), applying what
    kube-apiserver's generic registry applies: uid, creationTimestamp,
    generation, generateName, namespace existence, optimistic concurrency,
    finalizers before deletion, status-subresource isolation.

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

import base64
import binascii
import copy
import ipaddress
import logging
import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import orjson

from hashing import ShardSelector
from local_apiserver import services
from local_apiserver.conversion import keep_status, to_api, to_storage
from local_apiserver.errors import (
    EXPIRED_CONTINUE_MESSAGE,
    ApiError,
    already_exists,
    bad_request,
    conflict,
    forbidden,
    gone,
    invalid_request,
    not_found,
    timeout,
    unavailable,
)
from local_apiserver.resources import ResourceSpec, ResourceTable, core_spec
from local_apiserver.validation import (
    apply_defaults,
    check_body_shape,
    check_job_update,
    check_secret_update,
    prepare_for_create,
    validate_object,
)
from rangeshard.core.errors import (
    EtcdRequestTooLarge,
    FutureRevision,
    RegistryError,
    RegistryUnavailable,
    RevisionCompacted,
)
from rangeshard.core.etcd import KV, Compare, Delete, EtcdClient, Op, Put, TxnResult, prefix_end
from rangeshard.core.selectors import FieldSelector, LabelSelector
from rangeshard.core.timestamps import format_time, parse_time

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/registry"
MAX_RETRIES = 16
_PAGE = 500
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

Obj = dict[str, Any]
T = TypeVar("T")


def parse_resource_version(value: str | None, what: str = "resourceVersion") -> int | None:
    """``None``/"" -> None; a non-negative integer string -> int; anything else -> 400."""
    if value is None or value == "":
        return None
    if not value.isascii() or not value.isdigit():
        raise bad_request(f"invalid {what}: {value!r} is not a valid resource version (expected a decimal integer)")
    rv = int(value)
    if rv > 2**63 - 1:
        # etcd revisions are int64: a larger value can never exist (and would overflow the request).
        raise bad_request(f"invalid {what}: {value!r} is larger than any resource version (2^63-1)")
    return rv


def etcd_errors(e: RegistryError) -> ApiError:
    """Translate an etcd failure into the Status kube-apiserver would answer."""
    if isinstance(e, RevisionCompacted):
        return gone(f"too old resource version: {e}")
    if isinstance(e, FutureRevision):
        return timeout("Too large resource version: the requested resourceVersion is newer than the store's")
    if isinstance(e, EtcdRequestTooLarge):
        # etcd's --max-request-bytes (1.5 MiB by default) is below the 3 MiB body limit, as with
        # kube-apiserver, which answers 413 for etcd's ErrRequestTooLarge too.
        return ApiError(413, "RequestEntityTooLarge", "Request entity too large: the object is too large for etcd")
    if isinstance(e, RegistryUnavailable):
        return unavailable(f"etcd is unavailable: {e}")
    return unavailable(f"storage error: {e}")


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

    def key(self, spec: ResourceSpec, namespace: str | None, name: str) -> str:
        return f"{self.resource_prefix(spec, namespace)}{name}"

    def decode(self, spec: ResourceSpec, kv: KV) -> Obj:
        try:
            obj = orjson.loads(kv.value)
        except orjson.JSONDecodeError as e:
            raise unavailable(f"corrupt object at {kv.key}: {e}") from e
        if not isinstance(obj, dict):
            raise unavailable(f"corrupt object at {kv.key}: not a JSON object")
        obj.setdefault("kind", spec.kind)
        if spec.crd is not None:
            obj["apiVersion"] = spec.api_version  # the versions of a CRD share storage (conversion "None")
        obj.setdefault("apiVersion", spec.api_version)
        obj = to_api(spec, obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(kv.mod_revision)
        return obj

    @staticmethod
    def encode(obj: Obj) -> bytes:
        stored = copy.copy(to_storage(obj))
        meta = dict(stored.get("metadata") or {})
        meta.pop("resourceVersion", None)
        meta.pop("selfLink", None)
        stored["metadata"] = meta
        return orjson.dumps(stored)

    def _txn(self, compare: list[Compare], success: list[Op], what: str) -> TxnResult:
        return self._call(lambda: self.client.transaction(compare, success, what=what))

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
        kv = self.get_kv(spec, namespace, name)
        if kv is None:
            raise not_found(spec.group_resource, name)
        return self.decode(spec, kv)

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
        if namespace is None and spec.namespaced:
            pinned = fields.value_of("metadata.namespace")
            if pinned:
                namespace = pinned
        prefix = self.resource_prefix(spec, namespace)
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
        meta["resourceVersion"] = str(result.revision)
        if self.on_created is not None:
            self.on_created(spec, obj)
        if spec.resource == "namespaces" and spec.group == "":
            self._default_service_account(str(meta["name"]))
        return obj

    def _default_service_account(self, namespace: str) -> None:
        """Every namespace gets a ServiceAccount ``default``, as kube-controller-manager creates one."""
        try:
            self.create(core_spec("serviceaccounts"), namespace, {"metadata": {"name": "default"}})
        except ApiError as e:
            if e.code not in (403, 409):  # already there, or the namespace is already terminating
                raise

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
            try:
                self.create(core_spec("namespaces"), None, {"metadata": {"name": name}})
            except ApiError as e:
                if e.code != 409:
                    raise

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
            kv = self.get_kv(spec, namespace, name)
            if kv is None:
                raise not_found(spec.group_resource, name)
            current = self.decode(spec, kv)
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

    def merge_update(self, spec: ResourceSpec, current: Obj, new: Obj, subresource: str) -> Obj:
        """The object an update of ``current`` to ``new`` stores (kube's PrepareForUpdate + validation)."""
        cur_meta = current["metadata"]
        if subresource == "status":
            result = copy.deepcopy(current)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
            if spec.crd is not None:
                validate_object(spec, result)  # a custom resource's status is checked against its schema too
                apply_defaults(spec, result)
            return result
        new["kind"] = spec.kind
        new["apiVersion"] = spec.api_version
        meta = new.setdefault("metadata", {}) or {}
        new["metadata"] = meta
        meta["name"] = cur_meta["name"]
        if spec.namespaced:
            meta["namespace"] = cur_meta.get("namespace")
        else:
            meta.pop("namespace", None)
        for immutable in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if immutable in cur_meta:
                meta[immutable] = cur_meta[immutable]
            else:
                meta.pop(immutable, None)
        meta.pop("managedFields", None)
        if spec.status or spec.resource == "namespaces":
            if "status" in current:
                new["status"] = current["status"]
            else:
                new.pop("status", None)
            keep_status(spec, current, new)
        if cur_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(cur_meta.get("finalizers") or [])
            if added:
                raise invalid_request(
                    f'{spec.kind} "{cur_meta["name"]}" is invalid: metadata.finalizers: Forbidden: '
                    "no new finalizers can be added if the object is being deleted, "
                    f"found new finalizers {sorted(added)}"
                )
        if spec.resource == "jobs" and spec.group == "batch":
            check_job_update(current, new)  # first: a changed selector is the cause, not its other symptoms
        validate_object(spec, new)
        apply_defaults(spec, new)
        if spec.resource == "services" and spec.group == "":
            services.keep_on_update(current, new)
        if spec.resource == "secrets" and spec.group == "":
            check_secret_update(current, new)
        if spec.generation and _spec_changed(current, new):
            meta["generation"] = int(cur_meta.get("generation") or 0) + 1
        return new

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
            kv = self.get_kv(spec, namespace, name)
            if kv is None:
                raise not_found(spec.group_resource, name)
            current = self.decode(spec, kv)
            meta = current["metadata"]
            if precondition_uid is not None and meta.get("uid") != precondition_uid:
                raise conflict(
                    spec.group_resource,
                    name,
                    f"Precondition failed: UID in precondition: {precondition_uid}, "
                    f"UID in object meta: {meta.get('uid')}",
                )
            if precondition_rv is not None and kv.mod_revision != precondition_rv:
                raise conflict(
                    spec.group_resource,
                    name,
                    f"Precondition failed: ResourceVersion in precondition: {precondition_rv}, "
                    f"ResourceVersion in object meta: {kv.mod_revision}",
                )
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
        if self.on_deleted is not None and "foregroundDeletion" in finalizers:
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
            if spec.resource == "namespaces" and self.on_deleted is not None:
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
        if self.on_deleted is not None and (spec.resource == "namespaces" or "foregroundDeletion" in finalizers):
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
        if self.on_deleted is not None:
            try:
                self.on_deleted(spec, obj, propagation)
            except Exception:
                log.exception("garbage collector hook failed for %s %s", spec.resource, obj["metadata"].get("name"))


def pod_grace_period(spec: ResourceSpec, pod: Obj, requested: int | None) -> int:
    """Seconds of graceful termination a delete gives ``pod`` (0: remove it at once).

    Only pods bound to a node and not finished terminate gracefully (nothing
    else would ever remove them); the grace period is the request's, else the
    pod's ``terminationGracePeriodSeconds`` (30 by default).
    """
    if spec.resource != "pods":
        return 0
    if not (pod.get("spec") or {}).get("nodeName"):
        return 0
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return 0
    if requested is None:
        requested = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
    try:
        return max(int(requested), 0)
    except (TypeError, ValueError):
        return 30


def check_precondition(spec: ResourceSpec, name: str, current: Obj, expected: int | None) -> None:
    """409 Conflict when the client's resourceVersion is not the stored one."""
    if expected is None:
        return
    if str(expected) != current["metadata"]["resourceVersion"]:
        raise conflict(
            spec.group_resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )


def _spec_changed(old: Obj, new: Obj) -> bool:
    skip = ("metadata", "status", "kind", "apiVersion")
    return {k: v for k, v in old.items() if k not in skip} != {k: v for k, v in new.items() if k not in skip}


def encode_continue(revision: int, start_suffix: str) -> str:
    raw = orjson.dumps({"v": "meta.k8s.io/v1", "rv": revision, "start": start_suffix})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    try:
        padded = token + "=" * (-len(token) % 4)
        data = orjson.loads(base64.urlsafe_b64decode(padded.encode()))
        rv = data["rv"]
        start = data["start"]
        if data.get("v") != "meta.k8s.io/v1" or not isinstance(rv, int) or rv <= 0 or not isinstance(start, str):
            raise ValueError("bad fields")
        if "/" in start.rstrip("\0").strip("/") and start.count("/") > 1:
            raise ValueError("bad start key")
    except (ValueError, KeyError, TypeError, binascii.Error, orjson.JSONDecodeError) as e:
        raise bad_request(f"continue key is not valid: {e}") from e
    return rv, start
