"""The table of served resources: adding a resource is one :class:`ResourceSpec` entry.

Purpose
    Describe every resource the local API server serves (group, version,
    plural, kind, scope, short names, subresources, defaults hooks) so routing,
    discovery, storage keys and validation are all driven by one table.

Invariants
    * ``(group, resource)`` is unique in :data:`RESOURCES`; a resource with
      ``stored_as`` shares another one's storage (events.k8s.io/v1 events are
      core/v1 events), and :data:`STORED` lists each storage location once.
    * The core group is ``""`` in the API and ``"core"`` in storage keys.

Concurrency model
    Immutable module-level data; safe from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    # Another served resource whose storage this one shares ("group/resource", kube's "same objects,
    # another API"): objects are stored in that resource's form and converted on the way in and out
    # (local_apiserver.conversion).
    stored_as: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

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
        return f"{self.resource}.{self.group}" if self.group else self.resource


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
)

# Every storage location once (resources served under two APIs count once): what the GC scans.
STORED: tuple[ResourceSpec, ...] = tuple(s for s in RESOURCES if not s.stored_as)


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
