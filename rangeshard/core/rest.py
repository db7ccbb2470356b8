"""Resource identity and REST path parsing of the Kubernetes API, once for every component.

Purpose
    A :class:`GVR` names one resource (group/version/plural) and spells what
    derives from it: ``apiVersion``, REST paths, the ``resource.group`` label.
    :func:`parse_rest_path` reads a request path as kube-apiserver's
    ``RequestInfoFactory`` does (group/version, the ``/watch/`` prefix,
    namespace, resource, name, subresource); kubectl-style names
    (``replicasets.apps``) are read by :mod:`hashing.resources`.
    Richer per-component types (the proxy's discovery info, the API server's
    serving spec, a controller's ``Resource``) hold or derive a ``GVR``.

Invariants
    * The core group is ``""`` (``/api/<v>/...``); others are ``/apis/<g>/<v>/...``.
    * ``/api/v1/namespaces/<ns>/<resource>...`` names ``<resource>`` in
      ``<ns>``, except the namespace subresources (``status``, ``finalize``):
      ``/api/v1/namespaces/<name>[/status]`` is the cluster-scoped
      ``namespaces`` resource itself (``namespace`` is ``None``), as in kube.
    * Parsing only classifies; whether a resource exists, is namespaced or
      has a subresource is for discovery or a serving table to say.
    * A path with an empty segment inside (``/api/v1//pods``) is not a
      resource path; leading and trailing slashes are ignored.

Concurrency model
    Immutable values and pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from hashing.resources import parse_resource_name

#: ``parse_resource_name`` is re-exported: kubectl-style names are read by the one parser of :mod:`hashing.resources`.
__all__ = [
    "GVR",
    "NAMESPACE_SUBRESOURCES",
    "RestPath",
    "group_version",
    "group_version_path",
    "parse_resource_name",
    "parse_rest_path",
    "split_group_version",
]

#: Subresources of a namespace: ``/api/v1/namespaces/<name>/<sub>`` is not a collection in ``<name>``.
NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


def group_version(group: str, version: str) -> str:
    """``v1`` or ``apps/v1``: a group/version as ``apiVersion`` and discovery spell it."""
    return f"{group}/{version}" if group else version


def group_version_path(group: str, version: str) -> str:
    """``/api/v1`` or ``/apis/apps/v1``: the root of a group/version (its discovery document)."""
    return f"/apis/{group}/{version}" if group else f"/api/{version}"


@dataclass(frozen=True, slots=True, order=True)
class GVR:
    """A group/version/resource (plural); ``group`` is ``""`` for the core API."""

    group: str
    version: str
    resource: str

    @property
    def label(self) -> str:
        """``pods`` or ``replicasets.apps`` (kube's ``GroupResource`` string, used in messages and metrics)."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def api_version(self) -> str:
        """``v1`` or ``apps/v1`` (the ``apiVersion`` of its objects)."""
        return group_version(self.group, self.version)

    @property
    def base_path(self) -> str:
        """``/api/v1`` or ``/apis/apps/v1``."""
        return group_version_path(self.group, self.version)

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        """The REST path of the collection (all namespaces without ``namespace``), an object or a subresource."""
        out = self.base_path
        if namespace:
            out += f"/namespaces/{quote(namespace, safe='')}"
        out += f"/{self.resource}"
        if name is not None:
            out += f"/{quote(name, safe='')}"
            if subresource:
                out += f"/{subresource}"
        return out

    def __str__(self) -> str:
        return f"{self.api_version}/{self.resource}"


@dataclass(frozen=True, slots=True)
class RestPath:
    """A parsed resource request path (see :func:`parse_rest_path`)."""

    gvr: GVR
    #: The namespace of a namespaced request; ``None`` for all namespaces and for cluster-scoped objects.
    namespace: str | None
    #: The object's name; ``None`` for a collection.
    name: str | None
    #: ``status``, ``scale``, ... or ``""``.
    subresource: str = ""
    #: Segments after the subresource (``pods/x/proxy/<tail>``), not interpreted here.
    tail: tuple[str, ...] = ()
    #: The deprecated ``/watch/`` prefix (``/api/v1/watch/pods``).
    watch_prefix: bool = False

    @property
    def collection(self) -> bool:
        """True for a collection (list, watch, create, deletecollection)."""
        return self.name is None


def split_group_version(path: str) -> tuple[str, str, list[str]] | None:
    """``(group, version, segments after them)`` of ``/api/<v>/...`` or ``/apis/<g>/<v>/...``, else ``None``.

    ``None`` too for a path with an empty segment inside it.
    """
    segs = path.strip("/").split("/")
    if any(not s for s in segs):
        return None
    if len(segs) >= 2 and segs[0] == "api":
        return "", segs[1], segs[2:]
    if len(segs) >= 3 and segs[0] == "apis":
        return segs[1], segs[2], segs[3:]
    return None


def parse_rest_path(path: str) -> RestPath | None:
    """The resource request ``path`` names, or ``None`` (discovery, ``/version``, ``/healthz``, malformed)."""
    split = split_group_version(path)
    if split is None:
        return None
    group, version, rest = split
    watch_prefix = bool(rest) and rest[0] == "watch"
    if watch_prefix:
        rest = rest[1:]
    namespace: str | None = None
    if len(rest) > 2 and rest[0] == "namespaces" and rest[2] not in NAMESPACE_SUBRESOURCES:
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return None
    return RestPath(
        GVR(group, version, rest[0]),
        namespace,
        rest[1] if len(rest) > 1 else None,
        rest[2] if len(rest) > 2 else "",
        tuple(rest[3:]),
        watch_prefix,
    )
