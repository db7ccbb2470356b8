"""Server-side printing: ``meta.k8s.io/v1 Table`` answers for ``Accept: application/json;as=Table;...``.

Purpose
    kubectl asks every ``get`` (list, single object and ``-w`` watch) for a
    ``Table`` and prints the columns the server defines. This module knows
    the columns kube-apiserver 1.32 prints for the built-in kinds the local
    API server serves (pods, workloads, services, secrets, storage, RBAC,
    networking, autoscaling, admission, flow control, ...: see
    ``BUILTIN_COLUMNS``), the ``additionalPrinterColumns`` of custom
    resources and the default ``Name``/``Age`` table of anything else (e.g.
    CSIDrivers, ValidatingAdmissionPolicyBindings), and builds the Table
    documents. Both the local API server and the range filter proxy (for what
    it answers from its cache) use it.

Invariants
    * Columns and cells follow kube-apiserver's printers (``pkg/printers/internalversion``):
      same names, priorities (1 = shown by ``-o wide`` only) and cell text
      (``0/1``, ``<none>``, ages like ``5m10s``).
    * ``includeObject`` is ``Metadata`` (default: a ``PartialObjectMetadata``
      per row), ``Object`` (the whole object) or ``None`` (no object).
    * Pure functions over JSON objects; nothing here does I/O.

Concurrency model
    None: immutable data and pure functions, safe from any thread or event loop.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from rangeshard.core.http1 import MAX_LINE_BYTES, LineSplitter
from rangeshard.core.kubeapi import media_ranges
from rangeshard.core.objpath import dig
from rangeshard.core.timestamps import parse_time

Obj = dict[str, Any]
INCLUDE_OBJECT = ("Metadata", "None", "Object")
_NONE = "<none>"


@dataclass(frozen=True)
class Column:
    """One ``TableColumnDefinition`` and how to compute its cell from an object."""

    name: str
    type: str
    cell: Callable[[Obj, dt.datetime], Any]
    format: str = ""
    description: str = ""
    priority: int = 0

    def definition(self) -> Obj:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


def _col(
    name: str, cell: Callable[[Obj, dt.datetime], Any], description: str, priority: int = 0, *, type: str = "string"
) -> Column:
    """A column without a ``format`` (every column but ``Name``)."""
    return Column(name, type, cell, "", description, priority)


@dataclass(frozen=True)
class PrinterColumn:
    """A CustomResourceDefinition ``additionalPrinterColumns`` entry."""

    name: str
    type: str
    json_path: str
    format: str = ""
    description: str = ""
    priority: int = 0


def table_version(accept: str | None) -> str | None:
    """``v1``/``v1beta1`` when the first acceptable media type of ``accept`` is a meta.k8s.io Table, else None."""
    if not accept:
        return None
    for media, params in media_ranges(accept):
        if media not in ("application/json", "*/*", "application/*"):
            continue
        kind = params.get("as")
        if kind is None:
            return None
        if kind == "Table" and params.get("g") == "meta.k8s.io" and params.get("v") in ("v1", "v1beta1"):
            return params["v"]
    return None


def include_object(value: str | None) -> str:
    """The ``includeObject`` query parameter; ``ValueError`` (message as kube-apiserver's) if unsupported."""
    if value is None or value == "":
        return "Metadata"
    if value not in INCLUDE_OBJECT:
        raise ValueError(f'includeObject: Unsupported value: "{value}": supported values: "Metadata", "None", "Object"')
    return value


# ---- cell helpers ---------------------------------------------------------------------------------


def human_duration(seconds: float) -> str:
    """kube's ``duration.HumanDuration``: ``59s``, ``2m``, ``5m10s``, ``3h``, ``2d4h``, ``2y``."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m" if rest == 0 else f"{minutes}m{rest}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h" if rest == 0 else f"{hours}h{rest}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d" if rest == 0 else f"{hours // 24}d{rest}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"


def since(value: Any, now: dt.datetime) -> str:
    """kube's ``translateTimestampSince``: ``<unknown>`` for no timestamp."""
    t = parse_time(value)
    if t is None:
        return "<unknown>"
    return human_duration((now - t).total_seconds())


def _get(obj: Any, *path: str) -> Any:
    return dig(obj, path)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _age(obj: Obj, now: dt.datetime) -> str:
    return since(_get(obj, "metadata", "creationTimestamp"), now)


def format_selector(selector: Any) -> str:
    """kube's ``metav1.FormatLabelSelector`` (requirements sorted by key; ``<none>`` if empty)."""
    if not isinstance(selector, dict):
        return _NONE
    reqs: list[tuple[str, str]] = []
    labels = selector.get("matchLabels")
    if isinstance(labels, dict):
        reqs.extend((str(k), f"{k}={v}") for k, v in labels.items())
    for expr in _list(selector.get("matchExpressions")):
        if not isinstance(expr, dict):
            continue
        key, op = str(expr.get("key", "")), expr.get("operator")
        values = ",".join(sorted(str(v) for v in _list(expr.get("values"))))
        text = {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": key}.get(str(op), f"!{key}")
        reqs.append((key, text))
    reqs.sort(key=lambda r: r[0])
    return ",".join(t for _, t in reqs) or _NONE


def _containers_at(path: tuple[str, ...], field: str) -> Callable[[Obj, dt.datetime], str]:
    """``field`` of each container in the list at ``path`` (a pod template's, a CronJob's job template's)."""

    def cell(obj: Obj, now: dt.datetime) -> str:
        return ",".join(str(c.get(field, "")) for c in _list(_get(obj, *path)) if isinstance(c, dict))

    return cell


def _name(obj: Obj, now: dt.datetime) -> Any:
    return _get(obj, "metadata", "name") or ""


_NAME = Column("Name", "string", _name, "name", "Name must be unique within a namespace.")
_AGE = _col("Age", _age, "CreationTimestamp is a timestamp representing the server time of creation.")


# ---- pods ------------------------------------------------------------------------------------------


def pod_status(pod: Obj) -> tuple[int, int, str, int, dt.datetime | None]:
    """``(ready containers, total containers, STATUS reason, restarts, last restart)`` as kubectl shows them."""
    spec, status = _get(pod, "spec") or {}, _get(pod, "status") or {}
    total = len(_list(spec.get("containers")))
    ready, restarts = 0, 0
    last_restart: dt.datetime | None = None
    reason = str(status.get("reason") or status.get("phase") or "")

    def note_restart(cs: Obj) -> None:
        nonlocal restarts, last_restart
        restarts += _int(cs.get("restartCount"))
        finished = parse_time(_get(cs, "lastState", "terminated", "finishedAt"))
        if finished is not None and (last_restart is None or finished > last_restart):
            last_restart = finished

    initializing = False
    init_specs = _list(spec.get("initContainers"))
    for i, cs in enumerate(_list(status.get("initContainerStatuses"))):
        if not isinstance(cs, dict):
            continue
        note_restart(cs)
        state = cs.get("state") or {}
        term, wait = state.get("terminated"), state.get("waiting")
        if isinstance(term, dict) and _int(term.get("exitCode")) == 0:
            continue
        if isinstance(term, dict):
            if term.get("reason"):
                reason = f"Init:{term['reason']}"
            elif _int(term.get("signal")):
                reason = f"Init:Signal:{term['signal']}"
            else:
                reason = f"Init:ExitCode:{_int(term.get('exitCode'))}"
        elif isinstance(wait, dict) and wait.get("reason") and wait.get("reason") != "PodInitializing":
            reason = f"Init:{wait['reason']}"
        else:
            reason = f"Init:{i}/{len(init_specs)}"
        initializing = True
        break
    if not initializing:
        restarts, last_restart, has_running = 0, None, False
        for cs in reversed(_list(status.get("containerStatuses"))):
            if not isinstance(cs, dict):
                continue
            note_restart(cs)
            state = cs.get("state") or {}
            term, wait = state.get("terminated"), state.get("waiting")
            if isinstance(wait, dict) and wait.get("reason"):
                reason = str(wait["reason"])
            elif isinstance(term, dict) and term.get("reason"):
                reason = str(term["reason"])
            elif isinstance(term, dict):
                sig = _int(term.get("signal"))
                reason = f"Signal:{sig}" if sig else f"ExitCode:{_int(term.get('exitCode'))}"
            elif cs.get("ready") and isinstance(state.get("running"), dict):
                has_running = True
                ready += 1
        if reason == "Completed" and has_running:
            conditions = _list(status.get("conditions"))
            ready_cond = any(
                isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
            )
            reason = "Running" if ready_cond else "NotReady"
    if _get(pod, "metadata", "deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return ready, total, reason, restarts, last_restart


def _pod_ready(obj: Obj, now: dt.datetime) -> str:
    ready, total, _, _, _ = pod_status(obj)
    return f"{ready}/{total}"


def _pod_restarts(obj: Obj, now: dt.datetime) -> str:
    _, _, _, restarts, last = pod_status(obj)
    if last is None:
        return str(restarts)
    return f"{restarts} ({human_duration((now - last).total_seconds())} ago)"


def _readiness_gates(obj: Obj, now: dt.datetime) -> str:
    gates = [g.get("conditionType") for g in _list(_get(obj, "spec", "readinessGates")) if isinstance(g, dict)]
    if not gates:
        return _NONE
    true = {
        c.get("type")
        for c in _list(_get(obj, "status", "conditions"))
        if isinstance(c, dict) and c.get("status") == "True"
    }
    return f"{sum(1 for g in gates if g in true)}/{len(gates)}"


def _or_value(missing: str, *path: str, text: bool = False) -> Callable[[Obj, dt.datetime], Any]:
    """The value at ``path`` (as text with ``text``), ``missing`` when absent or empty."""

    def cell(obj: Obj, now: dt.datetime) -> Any:
        value = _get(obj, *path)
        if value is None or value == "":
            return missing
        return str(value) if text else value

    return cell


_or_none = functools.partial(_or_value, _NONE)
_unset = functools.partial(_or_value, "<unset>")
_text = functools.partial(_or_value, "", text=True)
_int_or_na = functools.partial(_or_value, "N/A", text=True)


def _integer(*path: str) -> Callable[[Obj, dt.datetime], Any]:
    return lambda obj, now: _int(_get(obj, *path))


def _or(default: str, *path: str) -> Callable[[Obj, dt.datetime], Any]:
    """The value at ``path``, ``default`` when it is absent or falsy."""
    return lambda obj, now: _get(obj, *path) or default


def _ready_of(obj: Obj, now: dt.datetime) -> str:
    return f"{_int(_get(obj, 'status', 'readyReplicas'))}/{_int(_get(obj, 'spec', 'replicas'))}"


def _kind_name(*path: str) -> Callable[[Obj, dt.datetime], str]:
    """``Kind/name`` of the reference at ``path`` (a roleRef, a scaleTargetRef)."""

    def cell(obj: Obj, now: dt.datetime) -> str:
        ref = _get(obj, *path) or {}
        return f"{ref.get('kind', '')}/{ref.get('name', '')}"

    return cell


_POD_TEMPLATE = ("spec", "template", "spec", "containers")
_WIDE_WORKLOAD = (
    _col("Containers", _containers_at(_POD_TEMPLATE, "name"), "Names of each container.", 1),
    _col("Images", _containers_at(_POD_TEMPLATE, "image"), "Images referenced by each container.", 1),
    _col("Selector", lambda o, n: format_selector(_get(o, "spec", "selector")), "Label selector.", 1),
)


def _event_last_seen(obj: Obj, now: dt.datetime) -> str:
    # core/v1 fields, then their events.k8s.io/v1 names (deprecatedLastTimestamp, ...).
    for path in (
        ("series", "lastObservedTime"),
        ("lastTimestamp",),
        ("deprecatedLastTimestamp",),
        ("eventTime",),
        ("metadata", "creationTimestamp"),
    ):
        value = _get(obj, *path)
        if value:
            return since(value, now)
    return "<unknown>"


def _event_first_seen(obj: Obj, now: dt.datetime) -> str:
    value = (
        _get(obj, "firstTimestamp")
        or _get(obj, "deprecatedFirstTimestamp")
        or _get(obj, "eventTime")
        or _get(obj, "metadata", "creationTimestamp")
    )
    return since(value, now)


def _event_object(obj: Obj, now: dt.datetime) -> str:
    ref = _get(obj, "involvedObject") or _get(obj, "regarding") or {}
    return f"{str(_get(ref, 'kind') or '').lower()}/{_get(ref, 'name') or ''}"


def _event_source(obj: Obj, now: dt.datetime) -> str:
    component = (
        _get(obj, "source", "component")
        or _get(obj, "deprecatedSource", "component")
        or _get(obj, "reportingComponent")
        or _get(obj, "reportingController")
        or ""
    )
    host = _get(obj, "source", "host") or _get(obj, "reportingInstance") or ""
    return f"{component}, {host}" if component and host else str(component or host)


def _event_count(obj: Obj, now: dt.datetime) -> int:
    return _int(_get(obj, "series", "count")) or _int(_get(obj, "count")) or _int(_get(obj, "deprecatedCount")) or 1


#: DESIRED CURRENT READY of ReplicaSets and ReplicationControllers.
_REPLICA_COUNTS = (
    _col("Desired", _integer("spec", "replicas"), "Number of desired pods.", type="integer"),
    _col("Current", _integer("status", "replicas"), "Number of actual replicas.", type="integer"),
    _col("Ready", _integer("status", "readyReplicas"), "The number of ready replicas.", type="integer"),
)

#: Columns per ``(group, resource)``, as kube-apiserver's printers define them.
BUILTIN_COLUMNS: dict[tuple[str, str], tuple[Column, ...]] = {
    ("", "pods"): (
        _NAME,
        _col("Ready", _pod_ready, "The aggregate readiness state of this pod for accepting traffic."),
        _col("Status", lambda o, n: pod_status(o)[2], "The aggregate status of the containers in this pod."),
        _col("Restarts", _pod_restarts, "The number of times the containers in this pod restarted."),
        _AGE,
        _col("IP", _or_none("status", "podIP"), "IP address allocated to the pod.", 1),
        _col("Node", _or_none("spec", "nodeName"), "Name of the node this pod runs on.", 1),
        _col("Nominated Node", _or_none("status", "nominatedNodeName"), "Nominated node.", 1),
        _col("Readiness Gates", _readiness_gates, "Pod readiness gates.", 1),
    ),
    ("apps", "replicasets"): (
        _NAME,
        *_REPLICA_COUNTS,
        _AGE,
        *_WIDE_WORKLOAD,
    ),
    ("apps", "deployments"): (
        _NAME,
        _col("Ready", _ready_of, "Number of the pod with ready state."),
        _col("Up-to-date", _integer("status", "updatedReplicas"), "Updated replicas.", type="integer"),
        _col("Available", _integer("status", "availableReplicas"), "Available replicas.", type="integer"),
        _AGE,
        *_WIDE_WORKLOAD,
    ),
    ("", "namespaces"): (
        _NAME,
        _col("Status", _or("", "status", "phase"), "The status of the namespace."),
        _AGE,
    ),
    ("", "configmaps"): (
        _NAME,
        _col(
            "Data",
            lambda o, n: len(_get(o, "data") or {}) + len(_get(o, "binaryData") or {}),
            "Number of keys.",
            type="integer",
        ),
        _AGE,
    ),
    ("coordination.k8s.io", "leases"): (
        _NAME,
        _col("Holder", _or("", "spec", "holderIdentity"), "The holder."),
        _AGE,
    ),
    ("", "events"): (
        _col("Last Seen", _event_last_seen, "Time when this event was last seen."),
        _col("Type", _or("", "type"), "Type of this event."),
        _col("Reason", _or("", "reason"), "Why the action was taken."),
        _col("Object", _event_object, "The object that this event is about."),
        _col(
            "Subobject",
            lambda o, n: _get(o, "involvedObject", "fieldPath") or _get(o, "regarding", "fieldPath") or "",
            "The field of the object this event is about.",
            1,
        ),
        _col("Source", _event_source, "The component reporting this event.", 1),
        _col("Message", lambda o, n: _get(o, "message") or _get(o, "note") or "", "Message."),
        _col("First Seen", _event_first_seen, "Time when this event was first seen.", 1),
        _col("Count", _event_count, "The number of times this event has occurred.", 1, type="integer"),
        Column("Name", "string", _name, "name", "Name of the event.", 1),
    ),
}
BUILTIN_COLUMNS[("events.k8s.io", "events")] = BUILTIN_COLUMNS[("", "events")]

# ---- more built-in kinds (kubectl's columns, from kube's printers) ------------------------------------


def _svc_external_ip(obj: Obj, now: dt.datetime) -> str:
    spec = _get(obj, "spec") or {}
    kind = spec.get("type") or "ClusterIP"
    if kind == "ExternalName":
        return str(spec.get("externalName") or "<none>")
    ips = [str(ip) for ip in _list(spec.get("externalIPs"))]
    if kind == "LoadBalancer":
        ingress = [i.get("ip") or i.get("hostname") for i in _list(_get(obj, "status", "loadBalancer", "ingress"))]
        ips += [str(i) for i in ingress if i]
        return ",".join(ips) if ips else "<pending>"
    return ",".join(ips) if ips else "<none>"


def _svc_ports(obj: Obj, now: dt.datetime) -> str:
    out = []
    for p in _list(_get(obj, "spec", "ports")):
        if not isinstance(p, dict):
            continue
        port = f"{p.get('port')}:{p['nodePort']}" if p.get("nodePort") else f"{p.get('port')}"
        out.append(f"{port}/{p.get('protocol') or 'TCP'}")
    return ",".join(out) if out else "<none>"


def _job_status(obj: Obj, now: dt.datetime) -> str:
    for c in _list(_get(obj, "status", "conditions")):
        if isinstance(c, dict) and c.get("status") == "True" and c.get("type") in ("Complete", "Failed", "Suspended"):
            return str(c["type"])
    return "Running"


def _job_completions(obj: Obj, now: dt.datetime) -> str:
    completions = _get(obj, "spec", "completions")
    succeeded = _int(_get(obj, "status", "succeeded"))
    return (
        f"{succeeded}/{completions}"
        if completions is not None
        else f"{succeeded}/1 of {_int(_get(obj, 'spec', 'parallelism')) or 1}"
    )


def _job_duration(obj: Obj, now: dt.datetime) -> str:
    start = parse_time(_get(obj, "status", "startTime"))
    if start is None:
        return ""
    end = parse_time(_get(obj, "status", "completionTime")) or now
    return human_duration(max(0.0, (end - start).total_seconds()))


def _bool_text(*path: str) -> Callable[[Obj, dt.datetime], str]:
    """kube's ``printBoolPtr``: ``True``/``False``, ``<unset>`` when absent."""

    def cell(obj: Obj, now: dt.datetime) -> str:
        value = _get(obj, *path)
        return "<unset>" if not isinstance(value, bool) else str(value)

    return cell


def _cronjob_last(obj: Obj, now: dt.datetime) -> str:
    last = _get(obj, "status", "lastScheduleTime")
    return since(last, now) if last else "<none>"


def _ingress_hosts(obj: Obj, now: dt.datetime) -> str:
    hosts = [str(r.get("host")) for r in _list(_get(obj, "spec", "rules")) if isinstance(r, dict) and r.get("host")]
    return ",".join(hosts) if hosts else "*"


def _ingress_address(obj: Obj, now: dt.datetime) -> str:
    out = [i.get("ip") or i.get("hostname") for i in _list(_get(obj, "status", "loadBalancer", "ingress"))]
    return ",".join(str(a) for a in out if a)


def _created_at(obj: Obj, now: dt.datetime) -> str:
    return str(_get(obj, "metadata", "creationTimestamp") or "")


def _subjects(kind: str) -> Callable[[Obj, dt.datetime], str]:
    def cell(obj: Obj, now: dt.datetime) -> str:
        names = []
        for s in _list(_get(obj, "subjects")):
            if isinstance(s, dict) and s.get("kind") == kind:
                ns = s.get("namespace")
                names.append(f"{ns}/{s.get('name')}" if kind == "ServiceAccount" and ns else str(s.get("name")))
        return ", ".join(names)

    return cell


_BINDING = (
    _NAME,
    _col("Role", _kind_name("roleRef"), "Role of the binding."),
    _AGE,
    _col("Users", _subjects("User"), "Users in the binding.", 1),
    _col("Groups", _subjects("Group"), "Groups in the binding.", 1),
    _col("ServiceAccounts", _subjects("ServiceAccount"), "ServiceAccounts in the binding.", 1),
)
_ROLE = (_NAME, _col("Created At", _created_at, "Time the role was created.", type="date"))

BUILTIN_COLUMNS.update(
    {
        ("", "secrets"): (
            _NAME,
            _col("Type", _or("", "type"), "The type of the secret."),
            _col("Data", lambda o, n: len(_get(o, "data") or {}), "The number of keys.", type="integer"),
            _AGE,
        ),
        ("", "serviceaccounts"): (
            _NAME,
            _col("Secrets", lambda o, n: len(_list(_get(o, "secrets"))), "The number of secrets.", type="integer"),
            _AGE,
        ),
        ("", "services"): (
            _NAME,
            _col("Type", _or("ClusterIP", "spec", "type"), "The type of the service."),
            _col("Cluster-IP", _or("<none>", "spec", "clusterIP"), "The cluster IP."),
            _col("External-IP", _svc_external_ip, "The external IPs."),
            _col("Port(s)", _svc_ports, "The ports of the service."),
            _AGE,
            _col("Selector", lambda o, n: format_labels(_get(o, "spec", "selector")), "The selector.", 1),
        ),
        ("apps", "statefulsets"): (
            _NAME,
            _col("Ready", _ready_of, "Ready replicas."),
            _AGE,
            *_WIDE_WORKLOAD[:2],
        ),
        ("apps", "daemonsets"): (
            _NAME,
            _col("Desired", _integer("status", "desiredNumberScheduled"), "Desired pods.", type="integer"),
            _col("Current", _integer("status", "currentNumberScheduled"), "Current pods.", type="integer"),
            _col("Ready", _integer("status", "numberReady"), "Ready pods.", type="integer"),
            _col("Up-to-date", _integer("status", "updatedNumberScheduled"), "Updated pods.", type="integer"),
            _col("Available", _integer("status", "numberAvailable"), "Available pods.", type="integer"),
            _col(
                "Node Selector",
                lambda o, n: format_labels(_get(o, "spec", "template", "spec", "nodeSelector")),
                "The node selector.",
            ),
            _AGE,
            *_WIDE_WORKLOAD,
        ),
        ("batch", "jobs"): (
            _NAME,
            _col("Status", _job_status, "The status of the job."),
            _col("Completions", _job_completions, "The completions."),
            _col("Duration", _job_duration, "How long the job ran."),
            _AGE,
            *_WIDE_WORKLOAD,
        ),
        ("batch", "cronjobs"): (
            _NAME,
            _col("Schedule", _or("", "spec", "schedule"), "The schedule."),
            _col("Timezone", _or("<none>", "spec", "timeZone"), "The time zone."),
            _col("Suspend", _bool_text("spec", "suspend"), "Suspended.", type="boolean"),
            _col("Active", lambda o, n: len(_list(_get(o, "status", "active"))), "Active jobs.", type="integer"),
            _col("Last Schedule", _cronjob_last, "When the job was last scheduled."),
            _AGE,
        ),
        ("networking.k8s.io", "ingresses"): (
            _NAME,
            _col("Class", _or("<none>", "spec", "ingressClassName"), "The class."),
            _col("Hosts", _ingress_hosts, "The hosts."),
            _col("Address", _ingress_address, "The addresses."),
            _col("Ports", lambda o, n: "80, 443" if _list(_get(o, "spec", "tls")) else "80", "The ports."),
            _AGE,
        ),
        ("rbac.authorization.k8s.io", "roles"): _ROLE,
        ("rbac.authorization.k8s.io", "clusterroles"): _ROLE,
        ("rbac.authorization.k8s.io", "rolebindings"): _BINDING,
        ("rbac.authorization.k8s.io", "clusterrolebindings"): _BINDING,
    }
)
DEFAULT_COLUMNS: tuple[Column, ...] = (_NAME, _AGE)


# ---- the rest of kube's printers for the kinds the local API server serves ----------------------------

_PVC_MODES = (("ReadWriteOnce", "RWO"), ("ReadOnlyMany", "ROX"), ("ReadWriteMany", "RWX"), ("ReadWriteOncePod", "RWOP"))


def access_modes(modes: Any) -> str:
    """kube's ``GetAccessModesAsString``: the short names in a fixed order, each once."""
    have = {str(m) for m in _list(modes)}
    return ",".join(short for mode, short in _PVC_MODES if mode in have)


def format_labels(labels: Any) -> str:
    """kube's ``labels.FormatLabels``: ``k=v`` sorted by key, ``<none>`` if empty."""
    if not isinstance(labels, dict) or not labels:
        return _NONE
    return ",".join(f"{k}={labels[k]}" for k in sorted(labels))


def _more(items: list[str], limit: int, empty: str) -> str:
    """kube's ``listWithMoreString``: the first ``limit`` items, then `` + N more...``."""
    text = ",".join(items[:limit])
    if len(items) > limit:
        return f"{text} + {len(items) - limit} more..."
    return text or empty


def _pvc_status(obj: Obj, now: dt.datetime) -> str:
    if _get(obj, "metadata", "deletionTimestamp"):
        return "Terminating"
    return str(_get(obj, "status", "phase") or "")


def _pvc_bound(field: str) -> Callable[[Obj, dt.datetime], str]:
    """Capacity and access modes, shown (from the status) once the claim names its volume, as kube does."""

    def cell(obj: Obj, now: dt.datetime) -> str:
        if not _get(obj, "spec", "volumeName"):
            return ""
        if field == "capacity":
            return str(_get(obj, "status", "capacity", "storage") or "")
        return access_modes(_get(obj, "status", "accessModes"))

    return cell


def _storage_class_of(obj: Obj, now: dt.datetime) -> str:
    """``spec.storageClassName``, else the beta annotation kube still honours."""
    name = _get(obj, "spec", "storageClassName")
    if name is None:
        name = (_get(obj, "metadata", "annotations") or {}).get("volume.beta.kubernetes.io/storage-class")
    return str(name or "")


def _pv_claim(obj: Obj, now: dt.datetime) -> str:
    ref = _get(obj, "spec", "claimRef")
    return f"{ref.get('namespace', '')}/{ref.get('name', '')}" if isinstance(ref, dict) else ""


_VOLUME_ATTRIBUTES_CLASS = _col(
    "VolumeAttributesClass", _unset("spec", "volumeAttributesClassName"), "The volume attributes class."
)
_VOLUME_MODE = _col("VolumeMode", _unset("spec", "volumeMode"), "The volume mode.", 1)
_WIDE_TEMPLATE = (
    *_WIDE_WORKLOAD[:2],
    _col("Selector", lambda o, n: format_labels(_get(o, "spec", "selector")), "The selector of the pods.", 1),
)


def _quantity(value: Any) -> str:
    if value is None:
        return "0"
    return str(value)


def _hpa_metric(i: int, spec: Obj, statuses: list[Any]) -> str:
    """One metric of kube's ``formatHPAMetrics``: ``<current>/<target>``, named for resource metrics."""
    kind = spec.get("type")
    status = statuses[i] if i < len(statuses) and isinstance(statuses[i], dict) else {}
    if kind in ("External", "Object"):
        source, current = spec.get(kind.lower()) or {}, status.get(kind.lower()) or {}
        target = source.get("target") or {}
        if target.get("averageValue") is not None:
            now = _get(current, "current", "averageValue")
            return f"{now if now is not None else '<unknown>'}/{target['averageValue']} (avg)"
        now = _get(current, "current", "value") if current else None
        return f"{now if now is not None else '<unknown>'}/{target.get('value')}"
    if kind == "Pods":
        now = _get(status, "pods", "current", "averageValue")
        return f"{now if now is not None else '<unknown>'}/{_get(spec, 'pods', 'target', 'averageValue')}"
    if kind in ("Resource", "ContainerResource"):
        field = "resource" if kind == "Resource" else "containerResource"
        source, current = spec.get(field) or {}, status.get(field) or {}
        target = source.get("target") or {}
        name = source.get("name", "")
        if target.get("averageValue") is not None:
            now = _get(current, "current", "averageValue") if current else None
            return f"{name}: {now if now is not None else '<unknown>'}/{target['averageValue']}"
        used = _get(current, "current", "averageUtilization") if current else None
        want = target.get("averageUtilization")
        return f"{name}: {'<unknown>' if used is None else f'{used}%'}/{'<auto>' if want is None else f'{want}%'}"
    return "<unknown type>"


def hpa_targets(obj: Obj) -> str:
    """The ``Targets`` cell of a HorizontalPodAutoscaler (autoscaling/v2, or v1's CPU target); at most 2 shown."""
    spec = _get(obj, "spec") or {}
    metrics = [m for m in _list(spec.get("metrics")) if isinstance(m, dict)]
    statuses = _list(_get(obj, "status", "currentMetrics"))
    if not metrics and spec.get("targetCPUUtilizationPercentage") is not None:  # autoscaling/v1
        used = _get(obj, "status", "currentCPUUtilizationPercentage")
        return f"cpu: {'<unknown>' if used is None else f'{used}%'}/{spec['targetCPUUtilizationPercentage']}%"
    if not metrics:
        return _NONE
    shown = [_hpa_metric(i, m, statuses) for i, m in enumerate(metrics)]
    if len(shown) > 2:
        return f"{', '.join(shown[:2])} + {len(shown) - 2} more..."
    return ", ".join(shown)


def _hpa_min(obj: Obj, now: dt.datetime) -> str:
    value = _get(obj, "spec", "minReplicas")
    return "<unset>" if value is None else str(value)


def format_endpoints(obj: Obj) -> str:
    """kube's ``formatEndpoints``: ``ip:port`` (or ``ip`` without ports), 3 shown, ``<none>`` if no subsets."""
    subsets = [s for s in _list(_get(obj, "subsets")) if isinstance(s, dict)]
    if not subsets:
        return _NONE
    shown: list[str] = []
    for ss in subsets:
        ips = [str(a.get("ip", "")) for a in _list(ss.get("addresses")) if isinstance(a, dict)]
        ports = [p for p in _list(ss.get("ports")) if isinstance(p, dict)]
        shown.extend(ips if not ports else [_host_port(ip, p.get("port")) for p in ports for ip in ips])
    return _more(shown, 3, "")


def _host_port(ip: str, port: Any) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _slice_ports(obj: Obj, now: dt.datetime) -> str:
    ports = [p for p in _list(_get(obj, "ports")) if isinstance(p, dict)]
    names = [str(p["port"]) if p.get("port") is not None else str(p.get("name") or "*") for p in ports]
    return _more(names, 3, "<unset>")


def _slice_endpoints(obj: Obj, now: dt.datetime) -> str:
    addresses = [
        str(a) for e in _list(_get(obj, "endpoints")) if isinstance(e, dict) for a in _list(e.get("addresses"))
    ]
    return _more(addresses, 3, "<unset>")


def _quota(limits: bool) -> Callable[[Obj, dt.datetime], str]:
    """``Request``/``Limit`` of a ResourceQuota: ``name: used/hard`` per resource, sorted by name."""

    def cell(obj: Obj, now: dt.datetime) -> str:
        hard = _get(obj, "spec", "hard") or {}
        used = _get(obj, "status", "used") or {}
        out = []
        for name in sorted(hard):
            if name.startswith("limits.") == limits:
                out.append(f"{name}: {_quantity(used.get(name))}/{hard[name]}")
        return ", ".join(out)

    return cell


def _controller_of(obj: Obj, now: dt.datetime) -> str:
    """``<kind>.<group>/<name>`` of the controller ownerReference (lowercase kind), ``<none>`` without one."""
    for ref in _list(_get(obj, "metadata", "ownerReferences")):
        if isinstance(ref, dict) and ref.get("controller"):
            group = str(ref.get("apiVersion") or "").rpartition("/")[0]
            kind = str(ref.get("kind") or "").lower()
            return f"{kind}.{group}/{ref.get('name')}" if group else f"{kind}/{ref.get('name')}"
    return _NONE


def _ingress_class_parameters(obj: Obj, now: dt.datetime) -> str:
    params = _get(obj, "spec", "parameters")
    if not isinstance(params, dict):
        return _NONE
    kind = str(params.get("kind", ""))
    if params.get("apiGroup"):
        kind += f".{params['apiGroup']}"
    return f"{kind}/{params.get('name', '')}"


def _storage_class_name(obj: Obj, now: dt.datetime) -> str:
    name = str(_get(obj, "metadata", "name") or "")
    annotations = _get(obj, "metadata", "annotations") or {}
    default = annotations.get("storageclass.kubernetes.io/is-default-class") or annotations.get(
        "storageclass.beta.kubernetes.io/is-default-class"
    )
    return f"{name} (default)" if default == "true" else name


def _node_status(obj: Obj, now: dt.datetime) -> str:
    ready = "Unknown"
    for c in _list(_get(obj, "status", "conditions")):
        if isinstance(c, dict) and c.get("type") == "Ready":
            ready = "Ready" if c.get("status") == "True" else "NotReady"
    return f"{ready},SchedulingDisabled" if _get(obj, "spec", "unschedulable") else ready


def _node_roles(obj: Obj, now: dt.datetime) -> str:
    roles = set()
    for key, value in (_get(obj, "metadata", "labels") or {}).items():
        if key.startswith("node-role.kubernetes.io/") and key != "node-role.kubernetes.io/":
            roles.add(key.removeprefix("node-role.kubernetes.io/"))
        elif key == "kubernetes.io/role" and value:
            roles.add(str(value))
    return ",".join(sorted(roles)) or _NONE


def _node_address(kind: str) -> Callable[[Obj, dt.datetime], str]:
    def cell(obj: Obj, now: dt.datetime) -> str:
        found = (a for a in _list(_get(obj, "status", "addresses")) if isinstance(a, dict) and a.get("type") == kind)
        return next((str(a.get("address", "")) for a in found), _NONE)

    return cell


def _csr_condition(obj: Obj, now: dt.datetime) -> str:
    types = [str(c.get("type")) for c in _list(_get(obj, "status", "conditions")) if isinstance(c, dict)]
    text = ",".join(types) or "Pending"
    return f"{text},Issued" if _get(obj, "status", "certificate") else text


def _csr_duration(obj: Obj, now: dt.datetime) -> str:
    seconds = _get(obj, "spec", "expirationSeconds")
    return _NONE if not isinstance(seconds, int) else human_duration(seconds)


def _flow_distinguisher(obj: Obj, now: dt.datetime) -> str:
    return str(_get(obj, "spec", "distinguisherMethod", "type") or _NONE)


def _flow_missing_pl(obj: Obj, now: dt.datetime) -> str:
    conditions = (c for c in _list(_get(obj, "status", "conditions")) if isinstance(c, dict))
    return next((str(c.get("status", "?")) for c in conditions if c.get("type") == "Dangling"), "?")


def _plc(*path: str) -> Callable[[Obj, dt.datetime], Any]:
    def cell(obj: Obj, now: dt.datetime) -> Any:
        limited = _get(obj, "spec", "limited")
        if not isinstance(limited, dict):
            return _NONE
        value = _get(limited, *path)
        return _NONE if value is None else value

    return cell


def _count(*path: str) -> Callable[[Obj, dt.datetime], int]:
    return lambda obj, now: len(_list(_get(obj, *path)))


def _bool(*path: str, default: bool = False) -> Callable[[Obj, dt.datetime], bool]:
    def cell(obj: Obj, now: dt.datetime) -> bool:
        value = _get(obj, *path)
        return value if isinstance(value, bool) else default

    return cell


def _param_kind(obj: Obj, now: dt.datetime) -> str:
    kind = _get(obj, "spec", "paramKind")
    return f"{kind.get('apiVersion', '')}/{kind.get('kind', '')}" if isinstance(kind, dict) else "<unset>"


_WEBHOOKS = (_NAME, _col("Webhooks", _count("webhooks"), "The number of webhooks.", type="integer"), _AGE)
_HPA = (
    _NAME,
    _col("Reference", _kind_name("spec", "scaleTargetRef"), "The scale target."),
    _col("Targets", lambda o, n: hpa_targets(o), "The current and target metric values."),
    _col("MinPods", _hpa_min, "The minimum number of replicas."),
    _col("MaxPods", _integer("spec", "maxReplicas"), "The maximum number of replicas.", type="integer"),
    _col("Replicas", _integer("status", "currentReplicas"), "The current number of replicas.", type="integer"),
    _AGE,
)

BUILTIN_COLUMNS[("", "persistentvolumeclaims")] = (
    _NAME,
    _col("Status", _pvc_status, "The phase of the claim."),
    _col("Volume", _text("spec", "volumeName"), "The bound volume."),
    _col("Capacity", _pvc_bound("capacity"), "The capacity of the bound volume."),
    _col("Access Modes", _pvc_bound("modes"), "The access modes of the bound volume."),
    _col("StorageClass", _storage_class_of, "The storage class."),
    _VOLUME_ATTRIBUTES_CLASS,
    _AGE,
    _VOLUME_MODE,
)
_JOB_TEMPLATE = ("spec", "jobTemplate", "spec", "template", "spec", "containers")
BUILTIN_COLUMNS[("batch", "cronjobs")] = (
    *BUILTIN_COLUMNS[("batch", "cronjobs")],
    _col("Containers", _containers_at(_JOB_TEMPLATE, "name"), "Names of each container.", 1),
    _col("Images", _containers_at(_JOB_TEMPLATE, "image"), "Images of each container.", 1),
    _col(
        "Selector",
        lambda o, n: format_selector(_get(o, "spec", "jobTemplate", "spec", "selector")),
        "The selector of the jobs' pods.",
        1,
    ),
)
BUILTIN_COLUMNS.update(
    {
        ("autoscaling", "horizontalpodautoscalers"): _HPA,
        ("", "persistentvolumes"): (
            _NAME,
            _col("Capacity", _text("spec", "capacity", "storage"), "The capacity."),
            _col("Access Modes", lambda o, n: access_modes(_get(o, "spec", "accessModes")), "Modes."),
            _col(
                "Reclaim Policy",
                _or("", "spec", "persistentVolumeReclaimPolicy"),
                "What happens to the volume when released.",
            ),
            _col(
                "Status",
                lambda o, n: (
                    "Terminating" if _get(o, "metadata", "deletionTimestamp") else _text("status", "phase")(o, n)
                ),
                "The phase of the volume.",
            ),
            _col("Claim", _pv_claim, "The bound claim."),
            _col("StorageClass", _storage_class_of, "The storage class."),
            _VOLUME_ATTRIBUTES_CLASS,
            _col("Reason", _text("status", "reason"), "Why the volume is in this phase."),
            _AGE,
            _VOLUME_MODE,
        ),
        ("", "nodes"): (
            _NAME,
            _col("Status", _node_status, "The status of the node."),
            _col("Roles", _node_roles, "The roles of the node."),
            _AGE,
            _col("Version", _text("status", "nodeInfo", "kubeletVersion"), "Kubelet version."),
            _col("Internal-IP", _node_address("InternalIP"), "Internal IP.", 1),
            _col("External-IP", _node_address("ExternalIP"), "External IP.", 1),
            _col("OS-Image", _text("status", "nodeInfo", "osImage"), "OS image.", 1),
            _col("Kernel-Version", _text("status", "nodeInfo", "kernelVersion"), "Kernel.", 1),
            _col("Container-Runtime", _text("status", "nodeInfo", "containerRuntimeVersion"), "Container runtime.", 1),
        ),
        ("", "endpoints"): (
            _NAME,
            _col("Endpoints", lambda o, n: format_endpoints(o), "The endpoint addresses."),
            _AGE,
        ),
        ("", "resourcequotas"): (
            _NAME,
            _AGE,
            _col("Request", _quota(False), "Used/hard of the request resources."),
            _col("Limit", _quota(True), "Used/hard of the limit resources."),
        ),
        ("", "limitranges"): (
            _NAME,
            _col("Created At", _created_at, "Time the limit range was created.", type="date"),
        ),
        ("", "podtemplates"): (
            _NAME,
            _col("Containers", _containers_at(("template", "spec", "containers"), "name"), "Names of each container."),
            _col("Images", _containers_at(("template", "spec", "containers"), "image"), "Images of each container."),
            _col(
                "Pod Labels",
                lambda o, n: format_labels(_get(o, "template", "metadata", "labels")),
                "The labels of the pod template.",
            ),
        ),
        ("", "replicationcontrollers"): (
            _NAME,
            *_REPLICA_COUNTS,
            _AGE,
            *_WIDE_TEMPLATE,
        ),
        ("apps", "controllerrevisions"): (
            _NAME,
            _col("Controller", _controller_of, "The controller of the revision."),
            _col("Revision", _integer("revision"), "The revision.", type="integer"),
            _AGE,
        ),
        ("policy", "poddisruptionbudgets"): (
            _NAME,
            _col("Min Available", _int_or_na("spec", "minAvailable"), "Minimum available pods."),
            _col("Max Unavailable", _int_or_na("spec", "maxUnavailable"), "Maximum unavailable pods."),
            _col("Allowed Disruptions", _integer("status", "disruptionsAllowed"), "Allowed now.", type="integer"),
            _AGE,
        ),
        ("networking.k8s.io", "networkpolicies"): (
            _NAME,
            _col("Pod-Selector", lambda o, n: format_selector(_get(o, "spec", "podSelector")), "Pods."),
            _AGE,
        ),
        ("networking.k8s.io", "ingressclasses"): (
            _NAME,
            _col("Controller", _text("spec", "controller"), "The controller of the class."),
            _col("Parameters", _ingress_class_parameters, "The parameters of the class."),
            _AGE,
        ),
        ("discovery.k8s.io", "endpointslices"): (
            _NAME,
            _col("AddressType", _text("addressType"), "The type of the addresses."),
            _col("Ports", _slice_ports, "The ports."),
            _col("Endpoints", _slice_endpoints, "The endpoint addresses."),
            _AGE,
        ),
        ("storage.k8s.io", "storageclasses"): (
            Column("Name", "string", _storage_class_name, "name", "Name must be unique within a namespace."),
            _col("Provisioner", _text("provisioner"), "The provisioner."),
            _col("ReclaimPolicy", _or("Delete", "reclaimPolicy"), "Reclaim policy."),
            _col("VolumeBindingMode", _or("Immediate", "volumeBindingMode"), "When volumes are bound."),
            _col("AllowVolumeExpansion", _bool("allowVolumeExpansion"), "Volumes may grow."),
            _AGE,
        ),
        ("storage.k8s.io", "volumeattachments"): (
            _NAME,
            _col("Attacher", _text("spec", "attacher"), "The attacher."),
            _col("PV", _text("spec", "source", "persistentVolumeName"), "The volume."),
            _col("Node", _text("spec", "nodeName"), "The node."),
            _col("Attached", _bool("status", "attached"), "Whether the volume is attached.", type="boolean"),
            _AGE,
        ),
        ("storage.k8s.io", "csinodes"): (
            _NAME,
            _col("Drivers", _count("spec", "drivers"), "The number of drivers.", type="integer"),
            _AGE,
        ),
        ("storage.k8s.io", "csistoragecapacities"): (
            _NAME,
            _col("StorageClassName", _text("storageClassName"), "The storage class."),
            _col("Capacity", _unset("capacity"), "The capacity."),
        ),
        ("scheduling.k8s.io", "priorityclasses"): (
            _NAME,
            _col("Value", _integer("value"), "The priority.", type="integer"),
            _col("Global-Default", _bool("globalDefault"), "The default priority class.", type="boolean"),
            _AGE,
            _col("PreemptionPolicy", _or("PreemptLowerPriority", "preemptionPolicy"), "The preemption policy."),
        ),
        ("node.k8s.io", "runtimeclasses"): (
            _NAME,
            _col("Handler", _text("handler"), "The CRI handler."),
            _AGE,
        ),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): _WEBHOOKS,
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): _WEBHOOKS,
        ("admissionregistration.k8s.io", "validatingadmissionpolicies"): (
            _NAME,
            _col("Validations", _count("spec", "validations"), "The number of validations.", type="integer"),
            _col("ParamKind", _param_kind, "The kind of the parameters."),
            _AGE,
        ),
        ("certificates.k8s.io", "certificatesigningrequests"): (
            _NAME,
            _AGE,
            _col("SignerName", _text("spec", "signerName"), "The signer."),
            _col("Requestor", _text("spec", "username"), "Who asked."),
            _col("RequestedDuration", _csr_duration, "The requested duration."),
            _col("Condition", _csr_condition, "The state of the request."),
        ),
        ("flowcontrol.apiserver.k8s.io", "flowschemas"): (
            _NAME,
            _col("PriorityLevel", _text("spec", "priorityLevelConfiguration", "name"), "The level."),
            _col("MatchingPrecedence", _text("spec", "matchingPrecedence"), "The precedence."),
            _col("DistinguisherMethod", _flow_distinguisher, "How flows are told apart."),
            _AGE,
            _col("MissingPL", _flow_missing_pl, "Whether the priority level is missing."),
        ),
        ("flowcontrol.apiserver.k8s.io", "prioritylevelconfigurations"): (
            _NAME,
            _col("Type", _text("spec", "type"), "Limited or Exempt."),
            _col("NominalConcurrencyShares", _plc("nominalConcurrencyShares"), "The shares."),
            _col("Queues", _plc("limitResponse", "queuing", "queues"), "The queues."),
            _col("HandSize", _plc("limitResponse", "queuing", "handSize"), "The hand size."),
            _col("QueueLengthLimit", _plc("limitResponse", "queuing", "queueLengthLimit"), "The queue length limit."),
            _AGE,
        ),
    }
)


# ---- custom resources ----------------------------------------------------------------------------------


def _json_path(obj: Any, path: str) -> Any:
    """The value at a simple JSONPath (``.spec.replicas``, ``.status.items[0].x``); None if absent."""
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    text = text.removeprefix("$")
    for part in (p for p in text.split(".") if p):
        name, _, index = part.partition("[")
        if name:
            obj = dig(obj, (name,))
        while index:
            number, _, index = index.partition("]")
            index = index.removeprefix("[")
            if not isinstance(obj, list) or not (number.isascii() and number.strip("-").isdigit()):
                return None
            try:
                obj = obj[int(number)]
            except IndexError:
                return None
    return obj


def printer_columns(columns: Sequence[PrinterColumn]) -> tuple[Column, ...]:
    """The Table columns of a custom resource: ``Name`` then its additionalPrinterColumns (``Name``/``Age`` if none)."""
    if not columns:
        return DEFAULT_COLUMNS

    def cell_for(col: PrinterColumn) -> Callable[[Obj, dt.datetime], Any]:
        def cell(obj: Obj, now: dt.datetime) -> Any:
            value = _json_path(obj, col.json_path)
            if value is None:
                return None
            if col.type == "date":
                return since(value, now)
            if isinstance(value, (dict, list)):
                return orjson.dumps(value).decode()
            return value

        return cell

    return (_NAME, *(Column(c.name, c.type, cell_for(c), c.format, c.description, c.priority) for c in columns))


def crd_printer_columns(crd: Any, version: str) -> tuple[PrinterColumn, ...] | None:
    """The ``additionalPrinterColumns`` of ``version`` in a CustomResourceDefinition object (None if not served)."""
    versions = (v for v in _list(_get(crd, "spec", "versions")) if isinstance(v, dict) and v.get("name") == version)
    return next((version_printer_columns(v) for v in versions), None)


def version_printer_columns(ver: Mapping[str, Any]) -> tuple[PrinterColumn, ...]:
    """The ``additionalPrinterColumns`` of one entry of a CRD's ``spec.versions``."""
    return tuple(
        PrinterColumn(
            name=str(c.get("name", "")),
            type=str(c.get("type", "string")),
            json_path=str(c.get("jsonPath", "")),
            format=str(c.get("format", "")),
            description=str(c.get("description", "")),
            priority=_int(c.get("priority")),
        )
        for c in _list(ver.get("additionalPrinterColumns"))
        if isinstance(c, dict) and c.get("name") and c.get("jsonPath")
    )


def columns_for(group: str, resource: str, custom: Sequence[PrinterColumn] | None = None) -> tuple[Column, ...]:
    """The columns of ``resource.group``: custom printer columns first, then built-ins, then ``Name``/``Age``."""
    if custom is not None:
        return printer_columns(custom)
    return BUILTIN_COLUMNS.get((group, resource), DEFAULT_COLUMNS)


# ---- documents -------------------------------------------------------------------------------------------


def _row_object(obj: Obj, include: str, version: str) -> Obj | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": obj.get("metadata") or {},
    }


def build_table(
    columns: Sequence[Column],
    objects: Iterable[Obj],
    *,
    include: str = "Metadata",
    version: str = "v1",
    list_meta: Obj | None = None,
    headers: bool = True,
    now: dt.datetime | None = None,
    view: Callable[[Obj], Obj] | None = None,
) -> Obj:
    """A ``meta.k8s.io Table`` of ``objects`` (``headers=False`` leaves out the column definitions, as watches do).

    ``view`` gives the form the cells are computed from (e.g. an autoscaling/v1
    HPA's v2 form, which kube's printers read); rows embed the object as served.
    """
    at = now or dt.datetime.now(dt.UTC)
    rows: list[Obj] = []
    for obj in objects:
        shown = view(obj) if view is not None else obj
        row: Obj = {"cells": [c.cell(shown, at) for c in columns]}
        embedded = _row_object(obj, include, version)
        if embedded is not None:
            row["object"] = embedded
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": list_meta or {},
        "columnDefinitions": [c.definition() for c in columns] if headers else [],
        "rows": rows,
    }


async def table_watch(
    lines: AsyncIterator[bytes],
    columns: Sequence[Column],
    *,
    include: str,
    version: str,
    view: Callable[[Obj], Obj] | None = None,
    limit: int = MAX_LINE_BYTES,
) -> AsyncGenerator[bytes, None]:
    """Re-encode a JSON watch stream (one event per line) with each object as a one-row Table.

    The first Table carries the column definitions, later ones do not (as
    kube-apiserver answers ``kubectl get -w``); ``BOOKMARK`` and ``ERROR``
    events pass unchanged. Lines are split by the one bounded splitter
    (:class:`~rangeshard.core.http1.LineSplitter`: ``LineTooLong`` past
    ``limit`` bytes).
    """
    splitter = LineSplitter(limit)
    headers = True
    async for chunk in lines:
        out: list[bytes] = []
        for line in splitter.split([chunk]):
            event = orjson.loads(line)
            obj = event.get("object")
            if event.get("type") in ("ADDED", "MODIFIED", "DELETED") and isinstance(obj, dict):
                meta = {"resourceVersion": _get(obj, "metadata", "resourceVersion") or ""}
                event["object"] = build_table(
                    columns, [obj], include=include, version=version, list_meta=meta, headers=headers, view=view
                )
                headers = False
            out.append(orjson.dumps(event) + b"\n")
        if out:
            yield b"".join(out)
    last = splitter.rest()
    if last is not None:
        yield last
