"""Resource identities, discovery documents and collection paths.

Purpose
    A :class:`GVR` names one resource (group/version/resource); a
    :class:`ResourceInfo` is what discovery says about it (kind, namespaced,
    verbs). :func:`parse_collection_path` recognises the REST paths of a
    collection list/watch (``/api/v1/pods``, ``/api/v1/namespaces/ns/pods``,
    ``/apis/apps/v1/replicasets``, ``/apis/apps/v1/namespaces/ns/replicasets``)
    so the proxy can serve them from its cache; every other path is passed
    through.

Invariants
    * ``GVR.label`` is ``resource`` for the core group and
      ``resource.group`` otherwise (the form kube-apiserver metrics use).
    * ``parse_collection_path`` only classifies; whether the resource exists
      and supports list+watch is decided by discovery.

Concurrency model
    Immutable values and pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, order=True)
class GVR:
    """A group/version/resource; ``group`` is ``""`` for the core API."""

    group: str
    version: str
    resource: str

    @property
    def label(self) -> str:
        """``pods`` or ``replicasets.apps``."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def group_version(self) -> str:
        """``v1`` or ``apps/v1`` (the ``apiVersion`` of its objects)."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def base_path(self) -> str:
        """``/api/v1`` or ``/apis/apps/v1``."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def collection_path(self, namespace: str | None = None) -> str:
        """The REST path of the collection (optionally in one namespace)."""
        if namespace:
            return f"{self.base_path}/namespaces/{namespace}/{self.resource}"
        return f"{self.base_path}/{self.resource}"

    def __str__(self) -> str:
        return f"{self.group_version}/{self.resource}"


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    """What discovery says about one resource."""

    gvr: GVR
    kind: str
    namespaced: bool
    verbs: frozenset[str]

    @property
    def list_kind(self) -> str:
        """``PodList`` for ``Pod``."""
        return f"{self.kind}List"

    @property
    def cacheable(self) -> bool:
        """True if the resource supports both list and watch."""
        return {"list", "watch"} <= self.verbs


def parse_resource_list(group: str, version: str, doc: Mapping[str, Any]) -> dict[str, ResourceInfo]:
    """Parse an ``APIResourceList`` discovery document (subresources skipped)."""
    out: dict[str, ResourceInfo] = {}
    resources = doc.get("resources")
    if not isinstance(resources, list):
        return out
    for item in resources:
        if not isinstance(item, Mapping):
            continue
        name = item.get("name")
        kind = item.get("kind")
        if not isinstance(name, str) or "/" in name or not isinstance(kind, str):
            continue
        verbs = item.get("verbs")
        out[name] = ResourceInfo(
            GVR(group, version, name),
            kind,
            bool(item.get("namespaced")),
            frozenset(v for v in verbs if isinstance(v, str)) if isinstance(verbs, list) else frozenset(),
        )
    return out


@dataclass(frozen=True, slots=True)
class CollectionPath:
    """A parsed collection path: which resource, optionally which namespace."""

    group: str
    version: str
    resource: str
    namespace: str | None


def _api_parts(path: str) -> tuple[str, str, list[str]] | None:
    """``(group, version, segments after them)`` of an ``/api/v1/...`` or ``/apis/g/v/...`` path."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        return "", parts[1], parts[2:]
    if len(parts) >= 3 and parts[0] == "apis":
        return parts[1], parts[2], parts[3:]
    return None


def parse_collection_path(path: str) -> CollectionPath | None:
    """Classify ``path`` as a collection of some resource, or ``None``."""
    split = _api_parts(path)
    if split is None:
        return None
    group, version, rest = split
    if len(rest) == 1:
        return CollectionPath(group, version, rest[0], None)
    if len(rest) == 3 and rest[0] == "namespaces" and rest[1]:
        return CollectionPath(group, version, rest[2], rest[1])
    return None


@dataclass(frozen=True, slots=True)
class ObjectPath:
    """A parsed object path (``.../[namespaces/<ns>/]<resource>/<name>[/<subresource>]``)."""

    group: str
    version: str
    resource: str
    namespace: str
    name: str


def parse_object_path(path: str) -> ObjectPath | None:
    """Classify ``path`` as one object (or one of its subresources) of some resource, or ``None``."""
    split = _api_parts(path)
    if split is None:
        return None
    group, version, rest = split
    namespace = ""
    if len(rest) >= 4 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if len(rest) in (2, 3):
        return ObjectPath(group, version, rest[0], namespace, rest[1])
    return None


def parse_resource_spec(spec: str) -> tuple[str, str | None, str]:
    """Parse ``pods``, ``replicasets.apps`` or ``deployments.v1.apps`` (kubectl style).

    Returns ``(resource, version or None, group)``; the core group is ``""``.
    """
    text = spec.strip()
    if not text:
        raise ValueError("empty resource name")
    parts = text.split(".")
    resource = parts[0]
    if len(parts) == 1:
        return resource, None, ""
    if len(parts) >= 3 and parts[1].startswith("v") and parts[1][1:2].isdigit():
        return resource, parts[1], ".".join(parts[2:])
    return resource, None, ".".join(parts[1:])
