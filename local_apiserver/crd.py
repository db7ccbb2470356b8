"""CustomResourceDefinitions (``apiextensions.k8s.io/v1``): validation, defaulting, and the served table.

Purpose
    A CRD is stored in etcd like any other object. This module checks a CRD
    body (:func:`crd_problems`), fills its defaults and the status
    kube-apiserver would report (:func:`crd_defaults`: ``NamesAccepted`` and
    ``Established`` at once), turns a stored CRD into the
    :class:`~local_apiserver.resources.ResourceSpec` of each served version
    (:func:`specs_for`), and keeps an app's
    :class:`~local_apiserver.resources.ResourceTable` in step with the CRDs in
    etcd (:class:`CrdSync`): every local API server process sharing the etcd
    prefix serves the same custom resources.

    Not implemented (documented in docs/local_apiserver.md): conversion
    webhooks (all versions share one storage; only ``apiVersion`` changes,
    i.e. conversion strategy ``None``), CEL validation rules
    (``x-kubernetes-validations``), ``selectableFields``, per-version
    ``deprecated`` warnings, and pruning (unknown fields are errors instead).

Invariants
    * ``metadata.name`` is ``<plural>.<group>``; exactly one version has
      ``storage: true``; a CRD cannot claim a built-in group/resource.
    * :meth:`CrdSync.refresh` reads every CRD at one revision and replaces the
      table's custom part in one swap; a CRD that is being deleted
      (``deletionTimestamp``) is no longer served.

Concurrency model
    ``CrdSync.refresh`` runs on worker threads (it reads etcd); a lock makes
    concurrent refreshes one. Readers use the table's immutable tuples.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import replace
from typing import Any

from local_apiserver.resources import CRD_RESOURCE, RESOURCES, ResourceSpec, ResourceTable
from rangeshard.core.tables import version_printer_columns
from rangeshard.core.timestamps import format_time

log = logging.getLogger(__name__)

REFRESH_INTERVAL = 0.5
"""Seconds a table may lag CRDs created through another local API server process."""

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_KIND = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_VERSION = re.compile(r"^v[0-9]+((alpha|beta)[0-9]+)?$|^[a-z][-a-z0-9]*$")
_BUILTIN = {(s.group, s.resource) for s in RESOURCES}
_BUILTIN_GROUPS = {s.group for s in RESOURCES} | {"authentication.k8s.io", "authorization.k8s.io"}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def crd_problems(obj: dict[str, Any]) -> list[tuple[str, str]]:
    """Every semantic problem of a CRD body, as ``(field, message)`` causes."""
    out: list[tuple[str, str]] = []
    spec = _dict(obj.get("spec"))
    names = _dict(spec.get("names"))
    group = spec.get("group")
    plural = names.get("plural")
    kind = names.get("kind")
    if not isinstance(group, str) or not group:
        out.append(("spec.group", "Required value"))
    elif not _DNS_SUBDOMAIN.match(group) or "." not in group:
        out.append(("spec.group", f'Invalid value: "{group}": should be a domain with at least one dot'))
    elif group in _BUILTIN_GROUPS:
        out.append(("spec.group", f'Invalid value: "{group}": is a built-in API group of this server'))
    if not isinstance(plural, str) or not plural:
        out.append(("spec.names.plural", "Required value"))
    elif not _DNS_LABEL.match(plural):
        out.append(("spec.names.plural", f'Invalid value: "{plural}": must be a lowercase DNS-1035 label'))
    singular = names.get("singular")
    if singular is not None and (not isinstance(singular, str) or not _DNS_LABEL.match(singular)):
        out.append(("spec.names.singular", f"Invalid value: {singular!r}: must be a lowercase DNS-1035 label"))
    if not isinstance(kind, str) or not kind:
        out.append(("spec.names.kind", "Required value"))
    elif not _KIND.match(kind):
        out.append(("spec.names.kind", f'Invalid value: "{kind}": must be a CamelCase identifier'))
    for key in ("shortNames", "categories"):
        value = names.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            out.append((f"spec.names.{key}", "Invalid value: must be a list of strings"))
    if isinstance(group, str) and isinstance(plural, str):
        expected = f"{plural}.{group}"
        name = _dict(obj.get("metadata")).get("name")
        if name != expected:
            out.append(("metadata.name", f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group'))
        if (group, plural) in _BUILTIN:
            out.append(("spec.names.plural", f"Invalid value: {plural!r}: a built-in resource of {group}"))
    scope = spec.get("scope")
    if scope not in ("Namespaced", "Cluster"):
        out.append(("spec.scope", f'Unsupported value: {scope!r}: supported values: "Cluster", "Namespaced"'))
    out.extend(_version_problems(spec.get("versions")))
    conversion = _dict(spec.get("conversion"))
    strategy = conversion.get("strategy", "None")
    if strategy != "None":
        out.append(
            (
                "spec.conversion.strategy",
                f'Unsupported value: {strategy!r}: the local API server supports only "None" (no conversion webhooks)',
            )
        )
    return out


def _version_problems(versions: Any) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if not isinstance(versions, list) or not versions:
        return [("spec.versions", "Required value: must have at least one version")]
    storage = 0
    seen: set[str] = set()
    for i, v in enumerate(versions):
        path = f"spec.versions[{i}]"
        if not isinstance(v, dict):
            out.append((path, "Invalid value: must be an object"))
            continue
        name = v.get("name")
        if not isinstance(name, str) or not _VERSION.match(name):
            out.append((f"{path}.name", f"Invalid value: {name!r}: must be a DNS-1035 label such as v1 or v1beta1"))
        elif name in seen:
            out.append((f"{path}.name", f'Duplicate value: "{name}"'))
        else:
            seen.add(name)
        for flag in ("served", "storage"):
            if not isinstance(v.get(flag), bool):
                out.append((f"{path}.{flag}", "Required value: must be true or false"))
        if v.get("storage") is True:
            storage += 1
        schema = _dict(v.get("schema")).get("openAPIV3Schema")
        if not isinstance(schema, dict):
            out.append((f"{path}.schema.openAPIV3Schema", "Required value: schemas are required"))
        elif schema.get("type") != "object":
            out.append((f"{path}.schema.openAPIV3Schema.type", 'Unsupported value: must be "object" at the root'))
        scale = _dict(_dict(v.get("subresources")).get("scale"))
        if _dict(v.get("subresources")).get("scale") is not None:
            for req in ("specReplicasPath", "statusReplicasPath"):
                value = scale.get(req)
                if not isinstance(value, str) or not value.startswith("."):
                    out.append(
                        (f"{path}.subresources.scale.{req}", "Required value: a JSON path such as .spec.replicas")
                    )
    if storage != 1:
        out.append(
            ("spec.versions", f"Invalid value: must have exactly one version marked as storage version, got {storage}")
        )
    return out


def crd_defaults(obj: dict[str, Any]) -> None:
    """Fill a CRD's defaults and the status of a CRD that is served at once (mutates ``obj``)."""
    spec = obj.setdefault("spec", {})
    names = spec.setdefault("names", {})
    kind = str(names.get("kind") or "")
    names.setdefault("singular", kind.lower())
    names.setdefault("listKind", f"{kind}List")
    spec.setdefault("conversion", {"strategy": "None"})
    for v in spec.get("versions") or []:
        if isinstance(v, dict):
            v.setdefault("served", True)
    storage = [str(v.get("name")) for v in spec.get("versions") or [] if isinstance(v, dict) and v.get("storage")]
    status = _dict(obj.get("status"))
    stored = [s for s in status.get("storedVersions") or [] if isinstance(s, str)]
    for s in storage:
        if s not in stored:
            stored.append(s)
    now = format_time()
    obj["status"] = {
        "acceptedNames": {
            k: names[k] for k in ("plural", "singular", "kind", "listKind", "shortNames", "categories") if k in names
        },
        "conditions": [
            {"type": kind, "status": "True", "reason": reason, "message": message, "lastTransitionTime": now}
            for kind, reason, message in (
                ("NamesAccepted", "NoConflicts", "no conflicts found"),
                ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
            )
        ],
        "storedVersions": stored,
    }


def specs_for(crd: dict[str, Any]) -> tuple[ResourceSpec, ...]:
    """The served versions of a stored CRD (none while it is being deleted)."""
    meta = _dict(crd.get("metadata"))
    if meta.get("deletionTimestamp"):
        return ()
    spec = _dict(crd.get("spec"))
    names = _dict(spec.get("names"))
    group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
    if not (isinstance(group, str) and isinstance(plural, str) and isinstance(kind, str)):
        return ()
    out: list[ResourceSpec] = []
    for v in spec.get("versions") or []:
        if not isinstance(v, dict) or not v.get("served") or not isinstance(v.get("name"), str):
            continue
        subs = _dict(v.get("subresources"))
        scale = subs.get("scale")
        scale_paths = None
        if isinstance(scale, dict):
            selector = scale.get("labelSelectorPath")
            scale_paths = (
                str(scale.get("specReplicasPath")),
                str(scale.get("statusReplicasPath")),
                str(selector) if isinstance(selector, str) else None,
            )
        out.append(
            ResourceSpec(
                group,
                v["name"],
                plural,
                kind,
                spec.get("scope") == "Namespaced",
                str(names.get("singular") or kind.lower()),
                tuple(str(s) for s in names.get("shortNames") or ()),
                tuple(str(c) for c in names.get("categories") or ()),
                status="status" in subs,
                scale=scale_paths is not None,
                generation=True,
                crd=str(meta.get("name")),
                schema=_dict(v.get("schema")).get("openAPIV3Schema"),
                printer_columns=version_printer_columns(v),
                scale_paths=scale_paths,
                storage=bool(v.get("storage")),
            )
        )
    if out and not any(s.storage for s in out):
        out[0] = replace(out[0], storage=True)  # the storage version is not served: scan through the first served one
    return tuple(out)


class CrdSync:
    """Keeps a :class:`ResourceTable` equal to the CRDs stored in etcd (see module docstring)."""

    def __init__(self, table: ResourceTable, interval: float = REFRESH_INTERVAL) -> None:
        self.table = table
        self.interval = interval
        self._lock = threading.Lock()

    def stale(self) -> bool:
        return time.monotonic() - self.table.loaded_at >= self.interval

    def refresh(self, store: Any, *, force: bool = False) -> None:
        """Re-read every CRD (``store`` is a :class:`~local_apiserver.store.Store`) unless fresh."""
        with self._lock:
            if not force and not self.stale():
                return
            crd_spec = next(s for s in RESOURCES if s.resource == CRD_RESOURCE)
            custom: dict[str, tuple[ResourceSpec, ...]] = {}
            try:
                for crd in store.iter_all(crd_spec):
                    specs = specs_for(crd)
                    if specs:
                        custom[str(crd["metadata"]["name"])] = specs
            except Exception as e:  # etcd unreachable: keep serving what is known, try again later
                log.warning("cannot read CRDs (%s); keeping the %s known", e, len(self.table.custom()))
                self.table.loaded_at = time.monotonic()
                return
            before = set(self.table.custom())
            self.table.replace(custom)
            if set(custom) != before:
                log.info("serving custom resources of %s CRD(s): %s", len(custom), ", ".join(sorted(custom)) or "-")
