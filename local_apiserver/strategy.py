"""What a write stores, as kube-apiserver's registry strategies decide it.

Purpose
    The decisions of a write that need no storage: :func:`prepare_update`
    (kube's ``PrepareForUpdate`` and validation: immutable metadata, the
    ``status`` subresource, ``generation``), :func:`check_precondition` (a
    stale ``resourceVersion`` is a 409) and :func:`pod_grace_period` (how
    long a deleted pod terminates). :class:`~local_apiserver.store.Store`
    applies them inside its guarded transactions.

Invariants
    * An update never changes ``uid``, ``creationTimestamp``, the deletion
      fields or ``generation`` (which grows by one when anything but metadata
      and status changed); the main resource keeps the stored status, the
      ``status`` subresource keeps everything else.

Concurrency model
    Pure functions (they copy what they return).
"""

from __future__ import annotations

import copy

from local_apiserver import services
from local_apiserver.codec import Obj
from local_apiserver.conversion import copy_key, keep_status
from local_apiserver.errors import conflict, invalid_request
from local_apiserver.resources import ResourceSpec
from local_apiserver.validation import apply_defaults, check_job_update, check_secret_update, validate_object


def prepare_update(spec: ResourceSpec, current: Obj, new: Obj, subresource: str) -> Obj:
    """The object an update of ``current`` to ``new`` stores (kube's PrepareForUpdate + validation)."""
    cur_meta = current["metadata"]
    if subresource == "status":
        result = copy.deepcopy(current)
        copy_key(new, result, "status")
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
        copy_key(cur_meta, meta, immutable)
    meta.pop("managedFields", None)
    if spec.status or spec.resource == "namespaces":
        copy_key(current, new, "status")
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
    if spec.generation and spec_changed(current, new):
        meta["generation"] = int(cur_meta.get("generation") or 0) + 1
    return new


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


def spec_changed(old: Obj, new: Obj) -> bool:
    skip = ("metadata", "status", "kind", "apiVersion")
    return {k: v for k, v in old.items() if k not in skip} != {k: v for k, v in new.items() if k not in skip}
