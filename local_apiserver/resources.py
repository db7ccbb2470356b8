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

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
#: Resources kube-apiserver serves without deletecollection (discovery leaves the verb out; DELETE is 405).
NO_DELETECOLLECTION = frozenset({("", "namespaces")})


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
    def verbs(self) -> tuple[str, ...]:
        """The verbs discovery lists for this resource (kube's: no deletecollection of namespaces)."""
        if (self.group, self.resource) in NO_DELETECOLLECTION:
            return tuple(v for v in VERBS if v != "deletecollection")
        return VERBS

    @property
    def group_resource(self) -> str:
        """``resource.group`` as kube-apiserver spells it in messages (``pods``, ``deployments.apps``)."""
        return self.gvr.label


def _builtin(
    api_version: str,
    resource: str,
    kind: str,
    namespaced: bool,
    short_names: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
    **options: Any,
) -> ResourceSpec:
    """A built-in resource's spec: ``group/version`` in one string; the singular is the lower-case kind."""
    group, _, version = api_version.rpartition("/")
    return ResourceSpec(group, version, resource, kind, namespaced, kind.lower(), short_names, categories, **options)


# The workloads with a scale subresource also have status and bump metadata.generation.
_SCALABLE: dict[str, Any] = {"status": True, "scale": True, "generation": True}

RESOURCES: tuple[ResourceSpec, ...] = (
    _builtin("v1", "namespaces", "Namespace", False, ("ns",)),
    _builtin(
        "v1",
        "pods",
        "Pod",
        True,
        ("po",),
        ("all",),
        status=True,
        return_deleted_object=True,
    ),
    _builtin("v1", "nodes", "Node", False, ("no",), status=True),
    _builtin("v1", "configmaps", "ConfigMap", True, ("cm",)),
    _builtin("v1", "events", "Event", True, ("ev",)),
    _builtin("apps/v1", "replicasets", "ReplicaSet", True, ("rs",), ("all",), **_SCALABLE),
    _builtin("apps/v1", "deployments", "Deployment", True, ("deploy",), ("all",), **_SCALABLE),
    _builtin("coordination.k8s.io/v1", "leases", "Lease", True),
    # More built-in kinds, stored and served generically (CRUD, list/watch, selectors, status where kube
    # has it); no built-in controller acts on them (issue 23: the first part).
    _builtin("v1", "secrets", "Secret", True),
    _builtin("v1", "serviceaccounts", "ServiceAccount", True, ("sa",)),
    _builtin("v1", "services", "Service", True, ("svc",), ("all",), status=True, return_deleted_object=True),
    _builtin("v1", "endpoints", "Endpoints", True, ("ep",)),
    _builtin("v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, ("pvc",), status=True),
    _builtin("v1", "persistentvolumes", "PersistentVolume", False, ("pv",), status=True),
    _builtin("v1", "resourcequotas", "ResourceQuota", True, ("quota",), status=True),
    _builtin("v1", "limitranges", "LimitRange", True, ("limits",)),
    _builtin("v1", "podtemplates", "PodTemplate", True),
    _builtin("apps/v1", "statefulsets", "StatefulSet", True, ("sts",), ("all",), **_SCALABLE),
    _builtin("apps/v1", "daemonsets", "DaemonSet", True, ("ds",), ("all",), status=True, generation=True),
    _builtin("apps/v1", "controllerrevisions", "ControllerRevision", True),
    _builtin("batch/v1", "jobs", "Job", True, (), ("all",), status=True, generation=True),
    _builtin("batch/v1", "cronjobs", "CronJob", True, ("cj",), ("all",), status=True),
    _builtin("rbac.authorization.k8s.io/v1", "roles", "Role", True),
    _builtin("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", True),
    _builtin("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", False),
    _builtin("rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _builtin("networking.k8s.io/v1", "ingresses", "Ingress", True, ("ing",), status=True),
    _builtin("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", True, ("netpol",)),
    _builtin("networking.k8s.io/v1", "ingressclasses", "IngressClass", False),
    _builtin("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), status=True),
    _builtin(
        "autoscaling/v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True, ("hpa",), ("all",), status=True
    ),
    # The same stored objects (autoscaling/v2, kube's storage version) served as autoscaling/v1, converted
    # (local_apiserver.conversion); listed after v2 so discovery prefers v2, as kube-apiserver does.
    _builtin(
        "autoscaling/v1",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        True,
        ("hpa",),
        ("all",),
        status=True,
        stored_as="autoscaling/horizontalpodautoscalers",
    ),
    _builtin("discovery.k8s.io/v1", "endpointslices", "EndpointSlice", True),
    _builtin("storage.k8s.io/v1", "storageclasses", "StorageClass", False, ("sc",)),
    _builtin("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", False, ("pc",)),
    _builtin("v1", "replicationcontrollers", "ReplicationController", True, ("rc",), ("all",), **_SCALABLE),
    _builtin("storage.k8s.io/v1", "csidrivers", "CSIDriver", False),
    _builtin("storage.k8s.io/v1", "csinodes", "CSINode", False),
    _builtin("storage.k8s.io/v1", "csistoragecapacities", "CSIStorageCapacity", True),
    _builtin("storage.k8s.io/v1", "volumeattachments", "VolumeAttachment", False, status=True),
    _builtin("node.k8s.io/v1", "runtimeclasses", "RuntimeClass", False),
    _builtin(
        "admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        False,
        (),
        ("api-extensions",),
    ),
    _builtin(
        "admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        False,
        (),
        ("api-extensions",),
    ),
    _builtin(
        "admissionregistration.k8s.io/v1",
        "validatingadmissionpolicies",
        "ValidatingAdmissionPolicy",
        False,
        (),
        ("api-extensions",),
        status=True,
        generation=True,
    ),
    _builtin(
        "admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        "ValidatingAdmissionPolicyBinding",
        False,
        (),
        ("api-extensions",),
        generation=True,
    ),
    _builtin(
        "certificates.k8s.io/v1",
        "certificatesigningrequests",
        "CertificateSigningRequest",
        False,
        ("csr",),
        status=True,
    ),
    _builtin("flowcontrol.apiserver.k8s.io/v1", "flowschemas", "FlowSchema", False, status=True),
    _builtin(
        "flowcontrol.apiserver.k8s.io/v1",
        "prioritylevelconfigurations",
        "PriorityLevelConfiguration",
        False,
        status=True,
    ),
    _builtin(
        "events.k8s.io/v1",
        "events",
        "Event",
        True,
        ("ev",),
        stored_as="core/events",
    ),
    _builtin(
        "apiextensions.k8s.io/v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
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
        return _find(self._specs, (group, version, resource))

    def by_group_version(self, group: str, version: str) -> list[ResourceSpec]:
        return [s for s in self._specs if s.group == group and s.version == version]


def _find(specs: tuple[ResourceSpec, ...], gvr: tuple[str, str, str]) -> ResourceSpec | None:
    return next((s for s in specs if (s.group, s.version, s.resource) == gvr), None)


def lookup(group: str, version: str, resource: str) -> ResourceSpec | None:
    """A built-in resource (``None``: not one)."""
    return _find(RESOURCES, (group, version, resource))


def core_spec(resource: str) -> ResourceSpec:
    """A built-in core/v1 resource the server itself uses (namespaces, pods, ...)."""
    spec = lookup("", "v1", resource)
    if spec is None:  # pragma: no cover - the table always holds these
        raise LookupError(f"{resource} missing from the resource table")
    return spec


def builtin_spec(group: str, resource: str) -> ResourceSpec:
    """A built-in resource of ``group`` the server itself uses (RBAC's objects, ...), at its first version."""
    for spec in RESOURCES:
        if spec.group == group and spec.resource == resource:
            return spec
    raise LookupError(f"{resource}.{group} missing from the resource table")  # pragma: no cover
