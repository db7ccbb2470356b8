"""The field selector labels of each built-in kind, as kube-apiserver 1.32 supports them: one table for everyone.

Purpose
    kube-apiserver accepts a per-kind set of ``fieldSelector`` labels (each
    ``pkg/apis/<group>/v1`` registers an ``AddFieldLabelConversionFunc``) and
    evaluates them on a per-kind field set (``ToSelectableFields`` in
    ``pkg/registry/.../strategy.go``), which is not always the JSON path of the
    label: a Job's ``status.successful`` is ``status.succeeded``, a Pod's
    ``spec.hostNetwork`` is ``"false"`` when absent, an Event's ``source`` is
    ``source.component`` or else ``reportingComponent``. :func:`field_labels`
    answers that set for ``(group, resource)`` as a mapping ``label ->
    extractor``; the local API server uses it to accept/refuse and to evaluate,
    and the proxy uses the same table for the built-in kinds it caches, so
    both answer a selector alike.

Invariants
    * Every kind supports ``metadata.name``; ``metadata.namespace`` too,
      except where kube's conversion function leaves it out (namespaces,
      nodes, certificatesigningrequests).
    * Values render as kube renders them: strings as they are, booleans as
      ``true``/``false``, integers in decimal; a missing string is ``""``, a
      missing integer ``0``, a missing boolean ``false``; server-side defaults
      (a Secret's ``Opaque``, a Service's ``ClusterIP``) are assumed when absent.
    * ``status.podIPs`` is accepted for pods but, as in kube 1.32, not in the
      pod's field set: it compares as ``""``.
    * A resource this table does not name (a custom resource) selects only on
      ``metadata.name`` and ``metadata.namespace``.

Concurrency model
    Immutable module-level tables and pure functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from rangeshard.core.objpath import get_path

#: Reads one field label's value (as kube renders it) from an object in its API form.
Extractor = Callable[[Mapping[str, Any]], str]


def render(value: Any) -> str:
    """A field value as kube's field sets spell it (missing: ``""``; booleans ``true``/``false``)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        # A generic path naming an object (an Event's "source") selects on its component.
        comp = value.get("component")
        return str(comp) if comp is not None else ""
    return str(value)


def path(field: str, default: str = "") -> Extractor:
    """The value at a dotted JSON path, ``default`` when absent."""

    def extract(obj: Mapping[str, Any]) -> str:
        value = get_path(obj, field)
        return default if value is None else render(value)

    return extract


def _boolean(field: str) -> Extractor:
    return lambda obj: "true" if get_path(obj, field) is True else "false"


def _integer(field: str) -> Extractor:
    def extract(obj: Mapping[str, Any]) -> str:
        value = get_path(obj, field)
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else "0"

    return extract


def _pod_ip(obj: Mapping[str, Any]) -> str:
    ips = get_path(obj, "status.podIPs")
    if isinstance(ips, list) and ips and isinstance(ips[0], Mapping):
        return render(ips[0].get("ip"))
    return render(get_path(obj, "status.podIP"))


def _event_source(source_path: str, reporting_path: str) -> Extractor:
    def extract(obj: Mapping[str, Any]) -> str:
        return render(get_path(obj, f"{source_path}.component")) or render(get_path(obj, reporting_path))

    return extract


_NAME: dict[str, Extractor] = {"metadata.name": path("metadata.name")}
_META: dict[str, Extractor] = {**_NAME, "metadata.namespace": path("metadata.namespace")}
_REFERENCE = ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")

_POD: dict[str, Extractor] = {
    **_META,
    "spec.nodeName": path("spec.nodeName"),
    "spec.host": path("spec.nodeName"),  # kube: old v1 clients' name for spec.nodeName
    "spec.restartPolicy": path("spec.restartPolicy"),
    "spec.schedulerName": path("spec.schedulerName"),
    "spec.serviceAccountName": path("spec.serviceAccountName"),
    "spec.hostNetwork": _boolean("spec.hostNetwork"),
    "status.phase": path("status.phase"),
    "status.podIP": _pod_ip,
    "status.podIPs": lambda obj: "",
    "status.nominatedNodeName": path("status.nominatedNodeName"),
}

_CORE_EVENT: dict[str, Extractor] = {
    **_META,
    **{f"involvedObject.{f}": path(f"involvedObject.{f}") for f in _REFERENCE},
    "reason": path("reason"),
    "reportingComponent": path("reportingComponent"),
    "source": _event_source("source", "reportingComponent"),
    "type": path("type"),
}

# events.k8s.io/v1 names the same field set after its own fields (kube maps regarding.* to involvedObject.*).
_EVENTS_EVENT: dict[str, Extractor] = {
    **_META,
    **{f"regarding.{f}": path(f"regarding.{f}") for f in _REFERENCE},
    "reason": path("reason"),
    "reportingController": path("reportingController"),
    "source": _event_source("deprecatedSource", "reportingController"),
    "type": path("type"),
}

#: ``(group, resource) -> label -> extractor`` for the kinds with labels beyond ``metadata.*``.
_TABLE: dict[tuple[str, str], Mapping[str, Extractor]] = {
    ("", "pods"): _POD,
    ("", "events"): _CORE_EVENT,
    ("events.k8s.io", "events"): _EVENTS_EVENT,
    ("", "namespaces"): {**_NAME, "status.phase": path("status.phase")},
    ("", "nodes"): {**_NAME, "spec.unschedulable": _boolean("spec.unschedulable")},
    ("", "secrets"): {**_META, "type": path("type", "Opaque")},
    ("", "services"): {
        **_META,
        "spec.clusterIP": path("spec.clusterIP"),
        "spec.type": path("spec.type", "ClusterIP"),
    },
    ("", "replicationcontrollers"): {**_META, "status.replicas": _integer("status.replicas")},
    ("apps", "replicasets"): {**_META, "status.replicas": _integer("status.replicas")},
    ("batch", "jobs"): {**_META, "status.successful": _integer("status.succeeded")},
    ("certificates.k8s.io", "certificatesigningrequests"): {**_NAME, "spec.signerName": path("spec.signerName")},
}
TABLE: Mapping[tuple[str, str], Mapping[str, Extractor]] = MappingProxyType(
    {key: MappingProxyType(dict(labels)) for key, labels in _TABLE.items()}
)
_DEFAULT: Mapping[str, Extractor] = MappingProxyType(dict(_META))


def field_labels(group: str, resource: str) -> Mapping[str, Extractor]:
    """The field selector labels of ``(group, resource)`` (``""`` = core) and how to read each."""
    return TABLE.get((group, resource), _DEFAULT)


def known(group: str, resource: str) -> bool:
    """True if the table names this resource's labels (a built-in kind with labels beyond ``metadata.*``)."""
    return (group, resource) in TABLE


__all__ = ["TABLE", "Extractor", "field_labels", "known", "path", "render"]
