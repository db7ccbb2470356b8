"""The Kubernetes resources a controller watches, named by plural, group, version and kind.

Purpose
    A :class:`Resource` names any resource, built-in or custom
    (``Resource("widgets", "example.com", "v1", "Widget")``); its identity and
    REST paths are the foundation's :class:`rangeshard.core.rest.GVR`
    (``Resource.gvr``). Informers list
    and watch it over the generic REST path (``/api/v1/<plural>`` or
    ``/apis/<group>/<version>/<plural>``) with ``shardSelector``, so CRDs and
    built-in resources work alike; no typed client class is needed. The two
    optional typed-client fields of earlier versions (``api_class``,
    ``list_method``) are still accepted and unused.

Invariants
    * ``namespaced`` is ``None`` until declared or looked up by
      :func:`discover_scope` (discovery of the resource's group/version).
    * Adding a resource the built-in controllers use is one table entry (``RESOURCES``).

Concurrency model
    Immutable values.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

from rangeshard.core.errors import ControllerError
from rangeshard.core.rest import GVR


@dataclass(frozen=True)
class Resource:
    """One Kubernetes resource type: ``Resource(plural, group, version, kind)`` (group ``""`` = core)."""

    name: str
    group: str
    version: str
    kind: str
    api_class: str | None = None
    list_method: str | None = None
    namespaced: bool | None = None

    @property
    def gvr(self) -> GVR:
        """The resource's identity (:class:`rangeshard.core.rest.GVR`), which spells its paths."""
        return GVR(self.group, self.version, self.name)

    @property
    def api_version(self) -> str:
        return self.gvr.api_version


def raw_request(
    api_client: Any,
    method: str,
    path: str,
    *,
    query: list[tuple[str, Any]] | None = None,
    body: Any = None,
    content_type: str | None = None,
    timeout: Any = None,
) -> Any:
    """One request over the official client's connection pool, auth and TLS; the raw (urllib3) response.

    Non-2xx answers raise ``ApiException`` (as the typed clients do with ``_preload_content=False``).
    The caller reads the answer (``.data``, ``.read()``, or a stream to its end): until then its connection
    is not back in the pool, and one given back unread would hand the next request the rest of it.
    """
    headers = {"Accept": "application/json"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    req = api_client.param_serialize(
        method, path, query_params=query or [], header_params=headers, body=body, auth_settings=["BearerToken"]
    )
    resp = api_client.call_api(*req, _request_timeout=timeout)
    if not 200 <= resp.status <= 299:
        resp.read()
        raise ApiException.from_response(http_resp=resp, body=None, data=None)
    return resp.response


def discover_scope(api_client: Any, resource: Resource, timeout: float = 10.0) -> Resource:
    """``resource`` with ``namespaced`` filled in from discovery (unchanged if already declared).

    Raises :class:`ControllerError` when the group/version does not serve the resource.
    """
    if resource.namespaced is not None:
        return resource
    body = orjson.loads(raw_request(api_client, "GET", resource.gvr.base_path, timeout=timeout).data)
    for item in body.get("resources") or []:
        if isinstance(item, dict) and item.get("name") == resource.name:
            return replace(resource, namespaced=bool(item.get("namespaced")))
    raise ControllerError(f"{resource.api_version} serves no resource {resource.name!r} (is its CRD installed?)")


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
