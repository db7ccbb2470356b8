"""The table of served resources: built-ins (one :class:`ResourceSpec` entry each) plus CRDs.

Purpose
    Describe every resource the local API server serves (its identity, a
    :class:`rangeshard.core.rest.GVR` derived from group, version and plural;
    kind, scope, short names, subresources, defaults hooks) so routing,
    discovery, storage keys and validation are all driven by one table.
    :data:`RESOURCES` holds the built-in resources; a :class:`ResourceTable`
    (one per app) adds the resources of the CustomResourceDefinitions stored
    in etcd (``local_apiserver.crd`` keeps it current). Code that needs every
    served resource (discovery, routing, the garbage collector, and later
    OpenAPI/table printers) iterates ``table.specs()``; a custom resource's
    spec carries its ``openAPIV3Schema`` (``schema``) and
    ``additionalPrinterColumns`` (``printer_columns``).

Invariants
    * ``(group, version, resource)`` is unique in a table; the versions of one
      CRD share one storage prefix (``<group>/<plural>``); a resource with
      ``stored_as`` shares another one's storage (events.k8s.io/v1 events are
      core/v1 events, autoscaling/v1 HPAs are autoscaling/v2 ones), and
      ``ResourceTable.storage_specs()`` lists each
      storage location once.
    * The core group is ``""`` in the API and ``"core"`` in storage keys.
    * Built-in resources always win: a CRD cannot shadow one (it is refused).

Concurrency model
    ``RESOURCES`` is immutable. A :class:`ResourceTable` swaps an immutable
    tuple under a lock; readers on any thread see one consistent tuple.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rangeshard.core.rest import GVR
from rangeshard.core.tables import PrinterColumn

VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceSpec:
    """One served resource (see module docstring)."""

    group: str
    version: str
    resource: str
    kind: str
    namespaced: bool
    singular: str
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status: bool = False
    scale: bool = False
    # metadata.generation is bumped when anything outside metadata/status changes.
    generation: bool = False
    # DELETE answers the deleted object (pods) instead of a Status Success.
    return_deleted_object: bool = False
    # Field selector labels beyond metadata.name / metadata.namespace.
    extra_fields: tuple[str, ...] = field(default=())
    # Custom resources (CRDs): the CRD's name, its openAPIV3Schema (`schema`, also what
    # local_apiserver.openapi publishes), additionalPrinterColumns (None: a built-in kind, printed by
    # rangeshard.core.tables) and the scale subresource's JSON paths (specReplicasPath,
    # statusReplicasPath, labelSelectorPath).
    crd: str | None = None
    schema: Any = field(default=None, compare=False, hash=False, repr=False)
    printer_columns: tuple[PrinterColumn, ...] | None = field(default=None, compare=False, hash=False, repr=False)
    scale_paths: tuple[str, str, str | None] | None = None
    storage: bool = True
    # Another served resource whose storage this one shares ("group/resource", kube's "same objects,
    # another API"): objects are stored in that resource's form and converted on the way in and out
    # (local_apiserver.conversion).
    stored_as: str = ""

    @property
    def gvr(self) -> GVR:
        """The resource's identity (:class:`rangeshard.core.rest.GVR`)."""
        return GVR(self.group, self.version, self.resource)

    @property
    def api_version(self) -> str:
        return self.gvr.api_version

    @property
    def storage_group(self) -> str:
        if self.stored_as:
            return self.stored_as.split("/", 1)[0] or "core"
        return self.group or "core"

    @property
    def storage_resource(self) -> str:
        return self.stored_as.split("/", 1)[1] if self.stored_as else self.resource

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def group_resource(self) -> str:
        """``resource.group`` as kube-apiserver spells it in messages (``pods``, ``deployments.apps``)."""
        return self.gvr.label


_EVENT_REFERENCE_FIELDS = ("kind", "namespace", "name", "uid", "apiVersion")

RESOURCES: tuple[ResourceSpec, ...] = (
    ResourceSpec("", "v1", "namespaces", "Namespace", False, "namespace", ("ns",)),
    ResourceSpec(
        "",
        "v1",
        "pods",
        "Pod",
        True,
        "pod",
        ("po",),
        ("all",),
        status=True,
        return_deleted_object=True,
        extra_fields=("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "status.phase", "status.podIP"),
    ),
    ResourceSpec("", "v1", "nodes", "Node", False, "node", ("no",), status=True),
    ResourceSpec("", "v1", "configmaps", "ConfigMap", True, "configmap", ("cm",)),
    ResourceSpec(
        "",
        "v1",
        "events",
        "Event",
        True,
        "event",
        ("ev",),
        extra_fields=(
            *(f"involvedObject.{f}" for f in _EVENT_REFERENCE_FIELDS),
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ),
    ),
    ResourceSpec(
        "apps",
        "v1",
        "replicasets",
        "ReplicaSet",
        True,
        "replicaset",
        ("rs",),
        ("all",),
        status=True,
        scale=True,
        generation=True,
    ),
    ResourceSpec(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        True,
        "deployment",
        ("deploy",),
        ("all",),
        status=True,
        scale=True,
        generation=True,
    ),
    ResourceSpec("coordination.k8s.io", "v1", "leases", "Lease", True, "lease"),
    # More built-in kinds, stored and served generically (CRUD, list/watch, selectors, status where kube
    # has it); no built-in controller acts on them (issue 23: the first part).
    ResourceSpec("", "v1", "secrets", "Secret", True, "secret"),
    ResourceSpec("", "v1", "serviceaccounts", "ServiceAccount", True, "serviceaccount", ("sa",)),
    ResourceSpec(
        "", "v1", "services", "Service", True, "service", ("svc",), ("all",), status=True, return_deleted_object=True
    ),
    ResourceSpec("", "v1", "endpoints", "Endpoints", True, "endpoints", ("ep",)),
    ResourceSpec(
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        True,
        "persistentvolumeclaim",
        ("pvc",),
        status=True,
    ),
    ResourceSpec("", "v1", "persistentvolumes", "PersistentVolume", False, "persistentvolume", ("pv",), status=True),
    ResourceSpec("", "v1", "resourcequotas", "ResourceQuota", True, "resourcequota", ("quota",), status=True),
    ResourceSpec("", "v1", "limitranges", "LimitRange", True, "limitrange", ("limits",)),
    ResourceSpec("", "v1", "podtemplates", "PodTemplate", True, "podtemplate"),
    ResourceSpec(
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        True,
        "statefulset",
        ("sts",),
        ("all",),
        status=True,
        scale=True,
        generation=True,
    ),
    ResourceSpec(
        "apps", "v1", "daemonsets", "DaemonSet", True, "daemonset", ("ds",), ("all",), status=True, generation=True
    ),
    ResourceSpec("apps", "v1", "controllerrevisions", "ControllerRevision", True, "controllerrevision"),
    ResourceSpec("batch", "v1", "jobs", "Job", True, "job", (), ("all",), status=True, generation=True),
    ResourceSpec("batch", "v1", "cronjobs", "CronJob", True, "cronjob", ("cj",), ("all",), status=True),
    ResourceSpec("rbac.authorization.k8s.io", "v1", "roles", "Role", True, "role"),
    ResourceSpec("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, "rolebinding"),
    ResourceSpec("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, "clusterrole"),
    ResourceSpec(
        "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False, "clusterrolebinding"
    ),
    ResourceSpec("networking.k8s.io", "v1", "ingresses", "Ingress", True, "ingress", ("ing",), status=True),
    ResourceSpec("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, "networkpolicy", ("netpol",)),
    ResourceSpec("networking.k8s.io", "v1", "ingressclasses", "IngressClass", False, "ingressclass"),
    ResourceSpec(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        True,
        "poddisruptionbudget",
        ("pdb",),
        status=True,
    ),
    ResourceSpec(
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        True,
        "horizontalpodautoscaler",
        ("hpa",),
        ("all",),
        status=True,
    ),
    # The same stored objects (autoscaling/v2, kube's storage version) served as autoscaling/v1, converted
    # (local_apiserver.conversion); listed after v2 so discovery prefers v2, as kube-apiserver does.
    ResourceSpec(
        "autoscaling",
        "v1",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        True,
        "horizontalpodautoscaler",
        ("hpa",),
        ("all",),
        status=True,
        stored_as="autoscaling/horizontalpodautoscalers",
    ),
    ResourceSpec("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True, "endpointslice"),
    ResourceSpec("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, "storageclass", ("sc",)),
    ResourceSpec("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, "priorityclass", ("pc",)),
    ResourceSpec(
        "",
        "v1",
        "replicationcontrollers",
        "ReplicationController",
        True,
        "replicationcontroller",
        ("rc",),
        ("all",),
        status=True,
        scale=True,
        generation=True,
    ),
    ResourceSpec("storage.k8s.io", "v1", "csidrivers", "CSIDriver", False, "csidriver"),
    ResourceSpec("storage.k8s.io", "v1", "csinodes", "CSINode", False, "csinode"),
    ResourceSpec("storage.k8s.io", "v1", "csistoragecapacities", "CSIStorageCapacity", True, "csistoragecapacity"),
    ResourceSpec(
        "storage.k8s.io", "v1", "volumeattachments", "VolumeAttachment", False, "volumeattachment", status=True
    ),
    ResourceSpec("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False, "runtimeclass"),
    ResourceSpec(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        False,
        "validatingwebhookconfiguration",
        categories=("api-extensions",),
    ),
    ResourceSpec(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        False,
        "mutatingwebhookconfiguration",
        categories=("api-extensions",),
    ),
    ResourceSpec(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
        "ValidatingAdmissionPolicy",
        False,
        "validatingadmissionpolicy",
        categories=("api-extensions",),
        status=True,
        generation=True,
    ),
    ResourceSpec(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicybindings",
        "ValidatingAdmissionPolicyBinding",
        False,
        "validatingadmissionpolicybinding",
        categories=("api-extensions",),
        generation=True,
    ),
    ResourceSpec(
        "certificates.k8s.io",
        "v1",
        "certificatesigningrequests",
        "CertificateSigningRequest",
        False,
        "certificatesigningrequest",
        ("csr",),
        status=True,
    ),
    ResourceSpec("flowcontrol.apiserver.k8s.io", "v1", "flowschemas", "FlowSchema", False, "flowschema", status=True),
    ResourceSpec(
        "flowcontrol.apiserver.k8s.io",
        "v1",
        "prioritylevelconfigurations",
        "PriorityLevelConfiguration",
        False,
        "prioritylevelconfiguration",
        status=True,
    ),
    ResourceSpec(
        "events.k8s.io",
        "v1",
        "events",
        "Event",
        True,
        "event",
        ("ev",),
        extra_fields=(*(f"regarding.{f}" for f in _EVENT_REFERENCE_FIELDS), "reason", "reportingController", "type"),
        stored_as="core/events",
    ),
    ResourceSpec(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        "customresourcedefinition",
        ("crd", "crds"),
        ("api-extensions",),
        status=True,
        generation=True,
    ),
)

CRD_RESOURCE = "customresourcedefinitions"


class ResourceTable:
    """Built-in resources plus the custom resources of the CRDs this server knows (see module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._specs: tuple[ResourceSpec, ...] = RESOURCES
        self._custom: dict[str, tuple[ResourceSpec, ...]] = {}
        self.loaded_at = 0.0

    def specs(self) -> tuple[ResourceSpec, ...]:
        """Every served resource, one entry per served version."""
        return self._specs

    def storage_specs(self) -> list[ResourceSpec]:
        """One spec per stored resource (a CRD's storage version): what to scan to see every object."""
        return [s for s in self._specs if s.storage and not s.stored_as]

    def custom(self) -> dict[str, tuple[ResourceSpec, ...]]:
        with self._lock:
            return dict(self._custom)

    def replace(self, custom: dict[str, tuple[ResourceSpec, ...]]) -> None:
        """Serve exactly these CRDs (``crd name -> specs``) besides the built-ins."""
        with self._lock:
            self._custom = dict(custom)
            self._specs = RESOURCES + tuple(s for name in sorted(custom) for s in custom[name])
            self.loaded_at = time.monotonic()

    def set_crd(self, name: str, specs: tuple[ResourceSpec, ...]) -> None:
        with self._lock:
            custom = dict(self._custom)
        if specs:
            custom[name] = specs
        else:
            custom.pop(name, None)
        self.replace(custom)

    def groups(self) -> dict[str, list[str]]:
        """Served API groups (``""`` = core) and their versions, in table order."""
        out: dict[str, list[str]] = {}
        for spec in self._specs:
            versions = out.setdefault(spec.group, [])
            if spec.version not in versions:
                versions.append(spec.version)
        return out

    def lookup(self, group: str, version: str, resource: str) -> ResourceSpec | None:
        for spec in self._specs:
            if spec.group == group and spec.version == version and spec.resource == resource:
                return spec
        return None

    def by_group_version(self, group: str, version: str) -> list[ResourceSpec]:
        return [s for s in self._specs if s.group == group and s.version == version]


def groups() -> dict[str, list[str]]:
    """Served API groups (``""`` = core) and their versions, in table order."""
    out: dict[str, list[str]] = {}
    for spec in RESOURCES:
        versions = out.setdefault(spec.group, [])
        if spec.version not in versions:
            versions.append(spec.version)
    return out


def lookup(group: str, version: str, resource: str) -> ResourceSpec | None:
    for spec in RESOURCES:
        if spec.group == group and spec.version == version and spec.resource == resource:
            return spec
    return None


def by_group_version(group: str, version: str) -> list[ResourceSpec]:
    return [s for s in RESOURCES if s.group == group and s.version == version]


def namespaces_spec() -> ResourceSpec:
    spec = lookup("", "v1", "namespaces")
    if spec is None:  # pragma: no cover - the table always holds namespaces
        raise LookupError("namespaces missing from the resource table")
    return spec
