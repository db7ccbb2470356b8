"""The Kubernetes resources the built-in controllers watch, and how to list/watch them.

Purpose
    A :class:`Resource` names a group/version/resource and maps to the
    official ``kubernetes`` client's cluster-wide list function, which takes
    the ``shard_selector`` argument and serves both list and watch.

Invariants
    Adding a resource is one table entry (``RESOURCES``).

Concurrency model
    Immutable values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s


@dataclass(frozen=True)
class Resource:
    """One Kubernetes resource type (cluster-wide list/watch)."""

    name: str
    group: str
    version: str
    kind: str
    api_class: str
    list_method: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def list_function(self, api_client: Any) -> Callable[..., Any]:
        """The bound ``list_*_for_all_namespaces`` method of the official client."""
        api = getattr(k8s, self.api_class)(api_client)
        fn: Callable[..., Any] = getattr(api, self.list_method)
        return fn


PODS = Resource("pods", "", "v1", "Pod", "CoreV1Api", "list_pod_for_all_namespaces")
REPLICASETS = Resource("replicasets", "apps", "v1", "ReplicaSet", "AppsV1Api", "list_replica_set_for_all_namespaces")
DEPLOYMENTS = Resource("deployments", "apps", "v1", "Deployment", "AppsV1Api", "list_deployment_for_all_namespaces")

RESOURCES = {r.name: r for r in (PODS, REPLICASETS, DEPLOYMENTS)}


def object_key(obj: dict[str, Any]) -> str:
    """``namespace/name`` (or ``name`` for cluster-scoped objects)."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    name = meta.get("name", "")
    return f"{ns}/{name}" if ns else str(name)


def controller_ref(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The ownerReference with ``controller: true``, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            return ref
    return None
