"""widgetctl: a sharded controller that keeps one ConfigMap per ``Widget`` (``widgets.example.com/v1``).

Purpose
    The worked example of rangeshard's plugin API, outside the core packages.
    ``WidgetController`` reconciles Widgets (a CustomResourceDefinition) and
    owns a dependent ConfigMap ``<widget>-widget`` per Widget (a controller
    ownerReference, so the ConfigMap is hashed by its owner's uid and lands on
    the same instance as its Widget), then records the ConfigMap's name in the
    Widget's ``status`` (status subresource).

Invariants
    * Every API call passes ``_request_timeout=ctx.timeout()``.
    * The reconcile reads only the informer stores (``self.rt.store(...)``)
      and is idempotent: it writes only when the ConfigMap or status differ.

Concurrency model
    The framework's: ``reconcile`` runs on worker threads, never twice at once
    for one key in the whole deployment.
"""

from __future__ import annotations

from importlib import resources
from typing import Any, ClassVar

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller_manager.controller import Controller, ControllerRuntime, ReconcileContext
from controller_manager.resources import Resource

WIDGETS = Resource("widgets", "example.com", "v1", "Widget")
CONFIGMAPS = Resource("configmaps", "", "v1", "ConfigMap")
CRD: dict[str, Any] = yaml.safe_load(resources.files(__name__).joinpath("widget-crd.yaml").read_text())


def configmap_name(widget_name: str) -> str:
    return f"{widget_name}-widget"


def desired_data(widget: dict[str, Any]) -> dict[str, str]:
    spec = widget.get("spec") or {}
    return {
        "color": str(spec.get("color", "")),
        "size": str(spec.get("size", "M")),
        "message": str(spec.get("message", "")),
    }


class WidgetController(Controller):
    """A ConfigMap per Widget (see module docstring)."""

    name: ClassVar[str] = "widget"  # the controller type in the registry
    main: ClassVar[Resource] = WIDGETS  # sharded by the Widget's uid
    dependents: ClassVar[tuple[Resource, ...]] = (CONFIGMAPS,)  # sharded by their controller owner's uid
    crds: ClassVar[tuple[dict[str, Any], ...]] = (CRD,)  # created at start when missing

    def __init__(self, runtime: ControllerRuntime) -> None:
        super().__init__(runtime)
        self.core: Any = k8s.CoreV1Api(self.api)  # self.api talks to the proxy
        self.custom: Any = k8s.CustomObjectsApi(self.api)

    def reconcile(self, key: str, ctx: ReconcileContext) -> None:
        widget = self.rt.store(WIDGETS).get(key)
        if widget is None or (widget.get("metadata") or {}).get("deletionTimestamp"):
            return  # deleted: the garbage collector removes the owned ConfigMap
        ns, name = key.split("/", 1)
        meta = widget["metadata"]
        cm_name = configmap_name(name)
        data = desired_data(widget)
        current = self.rt.store(CONFIGMAPS).get(f"{ns}/{cm_name}")
        if current is None:
            owner = {
                "apiVersion": WIDGETS.api_version,
                "kind": WIDGETS.kind,
                "name": name,
                "uid": meta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
            body = {"metadata": {"name": cm_name, "namespace": ns, "ownerReferences": [owner]}, "data": data}
            try:
                self.core.create_namespaced_config_map(ns, body, _request_timeout=ctx.timeout())
            except ApiException as e:
                if e.status != 409:  # 409: created by us a moment ago; the cache will catch up
                    raise
        elif (current.get("data") or {}) != data:
            self.core.patch_namespaced_config_map(
                cm_name,
                ns,
                {"data": data},
                _content_type="application/merge-patch+json",
                _request_timeout=ctx.timeout(),
            )
        status = widget.get("status") or {}
        if status.get("configMap") != cm_name or status.get("observedGeneration") != meta.get("generation"):
            self.custom.patch_namespaced_custom_object_status(
                WIDGETS.group,
                WIDGETS.version,
                ns,
                WIDGETS.name,
                name,
                {"status": {"configMap": cm_name, "observedGeneration": meta.get("generation")}},
                _request_timeout=ctx.timeout(),
            )
