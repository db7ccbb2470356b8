"""Strategic merge patch for the served kinds, driven by a table of merge keys.

Purpose
    Apply ``application/strategic-merge-patch+json`` as kube-apiserver does
    for the fields of our kinds: maps merge recursively (``null`` deletes);
    lists whose Go type carries ``patchStrategy:"merge"`` merge by their
    ``patchMergeKey`` (containers by ``name``, env by ``name``, ports by
    ``containerPort``...) or, for lists of scalars (``finalizers``), as sets;
    every other list is replaced. Directives: ``$patch: replace|delete`` (maps
    and list elements), ``$retainKeys``, ``$setElementOrder/<field>``,
    ``$deleteFromPrimitiveList/<field>``. This is what ``kubectl apply``,
    ``kubectl set image`` and ``kubectl edit`` send.

Invariants
    * :data:`SCHEMAS` lists every merge-strategy field of the Go types behind
      our kinds (ObjectMeta, PodSpec, Container, PodStatus, workload statuses,
      NamespaceStatus); any list not in it is replaced, which is the
      strategic-merge semantics of lists without a patch strategy.
    * An unknown ``$`` directive or a malformed one is refused (415/422),
      never stored as data. Inputs are never mutated.
    * Order of merged lists: items named in ``$setElementOrder`` come in that
      order, the others keep their relative order after them.

Concurrency model
    Pure functions over immutable tables.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from local_apiserver.errors import ApiError, unsupported_media_type


@dataclass(frozen=True)
class ByKey:
    """A list of objects merged by ``key``; ``element`` is the schema of one element."""

    key: str
    element: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ScalarSet:
    """A list of scalars merged as a set (``patchStrategy:"merge"`` on ``[]string``)."""


META: dict[str, Any] = {"finalizers": ScalarSet(), "ownerReferences": ByKey("uid")}
CONTAINER: dict[str, Any] = {
    "ports": ByKey("containerPort"),
    "env": ByKey("name"),
    "volumeMounts": ByKey("mountPath"),
    "volumeDevices": ByKey("devicePath"),
}
POD_SPEC: dict[str, Any] = {
    "volumes": ByKey("name"),
    "initContainers": ByKey("name", CONTAINER),
    "containers": ByKey("name", CONTAINER),
    "ephemeralContainers": ByKey("name", CONTAINER),
    "imagePullSecrets": ByKey("name"),
    "hostAliases": ByKey("ip"),
    "topologySpreadConstraints": ByKey("topologyKey"),
    "resourceClaims": ByKey("name"),
    "schedulingGates": ByKey("name"),
}
CONDITIONS: dict[str, Any] = {"conditions": ByKey("type")}
POD_STATUS: dict[str, Any] = {
    "conditions": ByKey("type"),
    "podIPs": ByKey("ip"),
    "hostIPs": ByKey("ip"),
    "resourceClaimStatuses": ByKey("name"),
}
WORKLOAD: dict[str, Any] = {
    "metadata": META,
    "spec": {"template": {"metadata": META, "spec": POD_SPEC}},
    "status": CONDITIONS,
}
SCHEMAS: dict[str, dict[str, Any]] = {
    "pods": {"metadata": META, "spec": POD_SPEC, "status": POD_STATUS},
    "replicasets": WORKLOAD,
    "deployments": WORKLOAD,
    "namespaces": {"metadata": META, "status": CONDITIONS},
}
DEFAULT_SCHEMA: dict[str, Any] = {"metadata": META}

_ORDER = "$setElementOrder/"
_DELETE_PRIMITIVES = "$deleteFromPrimitiveList/"


class _Delete:
    """Marker: the patched map asked to be deleted (``$patch: delete``)."""


_DELETED = _Delete()


def strategic_merge(original: Any, patch: Any, resource: str) -> Any:
    """Apply a strategic merge ``patch`` to ``original`` (an object of ``resource``)."""
    if not isinstance(patch, dict):
        raise ApiError(400, "BadRequest", "a strategic merge patch must be a JSON object")
    result = _merge_map(original if isinstance(original, dict) else {}, patch, SCHEMAS.get(resource, DEFAULT_SCHEMA))
    if isinstance(result, _Delete):
        raise ApiError(422, "Invalid", "a strategic merge patch cannot delete the whole object")
    return result


def _merge_map(original: dict[str, Any] | None, patch: dict[str, Any], schema: dict[str, Any]) -> Any:
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETED
    if directive == "replace":
        return _merge_map(None, {k: v for k, v in patch.items() if k != "$patch"}, schema)
    if directive is not None:
        raise unsupported_media_type(f"unknown strategic merge patch directive $patch: {directive!r}")
    result: dict[str, Any] = copy.deepcopy(original) if isinstance(original, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            if key in ("$patch", "$retainKeys") or key.startswith((_ORDER, _DELETE_PRIMITIVES)):
                continue
            raise unsupported_media_type(f"unknown strategic merge patch directive {key!r}")
        node = schema.get(key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(result.get(key), value, node, key)
        elif isinstance(value, dict):
            merged = _merge_map(
                result.get(key) if isinstance(result.get(key), dict) else None,
                value,
                node if isinstance(node, dict) else {},
            )
            if isinstance(merged, _Delete):
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = copy.deepcopy(value)
    for key, value in patch.items():
        directive = next((d for d in (_DELETE_PRIMITIVES, _ORDER) if key.startswith(d)), None)
        if directive is None:
            continue
        if not isinstance(value, list):
            raise ApiError(422, "Invalid", f"{key} must be a list")
        name = key[len(directive) :]
        current = result.get(name)
        if isinstance(current, list) and directive == _ORDER:
            result[name] = _order(current, value, schema.get(name))
        elif isinstance(current, list):
            result[name] = [v for v in current if v not in value]
    retain = patch.get("$retainKeys")
    if retain is not None:
        if not isinstance(retain, list) or not all(isinstance(k, str) for k in retain):
            raise ApiError(422, "Invalid", "$retainKeys must be a list of strings")
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(original: Any, patch: list[Any], node: Any, name: str) -> list[Any]:
    if isinstance(node, ByKey):
        if any(isinstance(i, dict) and i.get("$patch") == "replace" and len(i) == 1 for i in patch):
            return [_element({}, i, node) for i in patch if not (isinstance(i, dict) and i.get("$patch") == "replace")]
        result: list[Any] = copy.deepcopy(original) if isinstance(original, list) else []
        for item in patch:
            if not isinstance(item, dict) or node.key not in item:
                raise ApiError(422, "Invalid", f"{name}: every element of a strategic merge needs its key {node.key!r}")
            idx = next(
                (n for n, cur in enumerate(result) if isinstance(cur, dict) and cur.get(node.key) == item[node.key]),
                None,
            )
            if item.get("$patch") == "delete":
                if idx is not None:
                    result.pop(idx)
                continue
            if idx is None:
                result.append(_element({}, item, node))
            else:
                result[idx] = _element(result[idx], item, node)
        return result
    if isinstance(node, ScalarSet):
        merged = list(original) if isinstance(original, list) else []
        for value in patch:
            if isinstance(value, dict | list):
                raise ApiError(422, "Invalid", f"{name}: expected a list of scalars")
            if value not in merged:
                merged.append(value)
        return merged
    # No patch strategy: the list is replaced (directives inside elements still apply).
    return [_element({}, i, None) if isinstance(i, dict) else copy.deepcopy(i) for i in patch]


def _element(original: dict[str, Any], item: dict[str, Any], node: ByKey | None) -> Any:
    merged = _merge_map(original, item, node.element if node is not None else {})
    if isinstance(merged, _Delete):
        raise ApiError(422, "Invalid", "$patch: delete inside a replaced list")
    return merged


def _order(items: list[Any], order: list[Any], node: Any) -> list[Any]:
    by_key = isinstance(node, ByKey)
    wanted = [o.get(node.key) for o in order if isinstance(o, dict)] if by_key else list(order)

    def ident(item: Any) -> Any:
        if not by_key:
            return item
        return item.get(node.key) if isinstance(item, dict) else None

    position = {repr(v): n for n, v in enumerate(wanted)}
    listed = sorted((i for i in items if repr(ident(i)) in position), key=lambda i: position[repr(ident(i))])
    rest = [i for i in items if repr(ident(i)) not in position]
    return listed + rest
