"""The ``scale`` subresource: the ``autoscaling/v1`` Scale view of an object and its updates.

Purpose
    :func:`to_scale` shows a replicaset, a deployment or a custom resource
    (its CRD's ``scale`` paths) as a Scale; :func:`update_scale` writes a
    replaced or patched Scale's ``spec.replicas`` back into the object.

Invariants
    * Only the replica count is written; a Scale naming another object is a
      400, a stale ``resourceVersion`` a 409 (``Store.guaranteed_update``).

Concurrency model
    Synchronous; called from the handlers in a worker thread
    (:func:`local_apiserver.state.in_thread`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from local_apiserver.conversion import get_path, set_path
from local_apiserver.errors import bad_request
from local_apiserver.resources import ResourceSpec
from local_apiserver.store import Obj, Store, check_precondition, parse_resource_version
from local_apiserver.validation import check_scale_body, selector_requirements


def _scale(obj: Obj, replicas: Any, current: Any, selector: Any) -> Obj:
    meta = obj["metadata"]
    status: dict[str, Any] = {"replicas": current if isinstance(current, int) else 0}
    if isinstance(selector, str):
        status["selector"] = selector
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta
        },
        "spec": {"replicas": replicas if isinstance(replicas, int) else 0},
        "status": status,
    }


def to_scale(spec: ResourceSpec, obj: Obj) -> Obj:
    """The autoscaling/v1 Scale view of a replicaset, a deployment or a custom resource.

    A custom resource's replicas and selector come from its CRD's ``specReplicasPath``,
    ``statusReplicasPath`` and ``labelSelectorPath``.
    """
    if spec.scale_paths is not None:
        spec_path, status_path, selector_path = spec.scale_paths
        selector = get_path(obj, selector_path) if selector_path else None
        return _scale(obj, get_path(obj, spec_path), get_path(obj, status_path), selector)
    raw_spec, raw_status = obj.get("spec"), obj.get("status")
    body_spec: dict[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
    status: dict[str, Any] = raw_status if isinstance(raw_status, dict) else {}
    reqs, _ = selector_requirements(body_spec.get("selector"))
    parts = []
    for r in reqs:
        if r.op == "=":
            parts.append(f"{r.key}={r.values[0]}")
        elif r.op in ("in", "notin"):
            parts.append(f"{r.key} {r.op} ({','.join(r.values)})")
        else:
            parts.append(r.key if r.op == "exists" else f"!{r.key}")
    return _scale(obj, body_spec.get("replicas"), status.get("replicas"), ",".join(parts))


def update_scale(
    store: Store,
    spec: ResourceSpec,
    ns: str | None,
    name: str,
    body: Any,
    apply: Callable[[Obj], Any] | None,
) -> Obj:
    """Replace or patch (``apply``) the Scale view of ``name``: only its replicas are written."""

    def mutate(current: Obj) -> Obj:
        scale = to_scale(spec, current)
        new_scale = apply(scale) if apply is not None else body
        replicas = check_scale_body(new_scale)
        meta = new_scale.get("metadata") or {}
        if meta.get("name") not in (None, name):
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        rv = meta.get("resourceVersion")
        if rv is not None and rv != "":
            check_precondition(spec, name, current, parse_resource_version(str(rv), "metadata.resourceVersion"))
        desired = copy.deepcopy(current)
        if spec.scale_paths is not None:
            set_path(desired, spec.scale_paths[0], replicas)
        else:
            desired["spec"] = dict(current.get("spec") or {})
            desired["spec"]["replicas"] = replicas
        return store.merge_update(spec, current, desired, "")

    return to_scale(spec, store.guaranteed_update(spec, ns, name, mutate))
