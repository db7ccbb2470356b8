"""Server-side printing: ``meta.k8s.io/v1 Table`` answers for ``Accept: application/json;as=Table;...``.

Purpose
    kubectl asks every ``get`` (list, single object and ``-w`` watch) for a
    ``Table`` and prints the columns the server defines. This module knows
    the columns kube-apiserver prints for the kinds rangeshard's servers
    serve (pods, replicasets, deployments, namespaces, configmaps, leases,
    core/v1 events), the ``additionalPrinterColumns`` of custom resources and
    the default ``Name``/``Age`` table of anything else, and builds the Table
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
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

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
    for item in accept.split(","):
        parts = [p.strip() for p in item.split(";")]
        media = parts[0].lower()
        if media not in ("application/json", "*/*", "application/*"):
            continue
        params = {k.strip().lower(): v.strip() for k, _, v in (p.partition("=") for p in parts[1:])}
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
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


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


def _containers(obj: Obj, field: str) -> str:
    cs = _list(_get(obj, "spec", "template", "spec", "containers"))
    return ",".join(str(c.get(field, "")) for c in cs if isinstance(c, dict))


def _name(obj: Obj, now: dt.datetime) -> Any:
    return _get(obj, "metadata", "name") or ""


_NAME = Column("Name", "string", _name, "name", "Name must be unique within a namespace.")
_AGE = Column("Age", "string", _age, "", "CreationTimestamp is a timestamp representing the server time of creation.")


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


def _pod_reason(obj: Obj, now: dt.datetime) -> str:
    return pod_status(obj)[2]


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


def _or_none(*path: str) -> Callable[[Obj, dt.datetime], Any]:
    def cell(obj: Obj, now: dt.datetime) -> Any:
        value = _get(obj, *path)
        return value if value not in (None, "") else _NONE

    return cell


def _integer(*path: str) -> Callable[[Obj, dt.datetime], Any]:
    return lambda obj, now: _int(_get(obj, *path))


_WIDE_WORKLOAD = (
    Column("Containers", "string", lambda o, n: _containers(o, "name"), "", "Names of each container.", 1),
    Column("Images", "string", lambda o, n: _containers(o, "image"), "", "Images referenced by each container.", 1),
    Column("Selector", "string", lambda o, n: format_selector(_get(o, "spec", "selector")), "", "Label selector.", 1),
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


#: Columns per ``(group, resource)``, as kube-apiserver's printers define them.
BUILTIN_COLUMNS: dict[tuple[str, str], tuple[Column, ...]] = {
    ("", "pods"): (
        _NAME,
        Column("Ready", "string", _pod_ready, "", "The aggregate readiness state of this pod for accepting traffic."),
        Column("Status", "string", _pod_reason, "", "The aggregate status of the containers in this pod."),
        Column("Restarts", "string", _pod_restarts, "", "The number of times the containers in this pod restarted."),
        _AGE,
        Column("IP", "string", _or_none("status", "podIP"), "", "IP address allocated to the pod.", 1),
        Column("Node", "string", _or_none("spec", "nodeName"), "", "Name of the node this pod runs on.", 1),
        Column("Nominated Node", "string", _or_none("status", "nominatedNodeName"), "", "Nominated node.", 1),
        Column("Readiness Gates", "string", _readiness_gates, "", "Pod readiness gates.", 1),
    ),
    ("apps", "replicasets"): (
        _NAME,
        Column("Desired", "integer", _integer("spec", "replicas"), "", "Number of desired pods."),
        Column("Current", "integer", _integer("status", "replicas"), "", "Number of actual replicas."),
        Column("Ready", "integer", _integer("status", "readyReplicas"), "", "The number of ready replicas."),
        _AGE,
        *_WIDE_WORKLOAD,
    ),
    ("apps", "deployments"): (
        _NAME,
        Column(
            "Ready",
            "string",
            lambda o, n: f"{_int(_get(o, 'status', 'readyReplicas'))}/{_int(_get(o, 'spec', 'replicas'))}",
            "",
            "Number of the pod with ready state.",
        ),
        Column("Up-to-date", "integer", _integer("status", "updatedReplicas"), "", "Updated replicas."),
        Column("Available", "integer", _integer("status", "availableReplicas"), "", "Available replicas."),
        _AGE,
        *_WIDE_WORKLOAD,
    ),
    ("", "namespaces"): (
        _NAME,
        Column("Status", "string", lambda o, n: _get(o, "status", "phase") or "", "", "The status of the namespace."),
        _AGE,
    ),
    ("", "configmaps"): (
        _NAME,
        Column(
            "Data",
            "integer",
            lambda o, n: len(_get(o, "data") or {}) + len(_get(o, "binaryData") or {}),
            "",
            "Number of keys.",
        ),
        _AGE,
    ),
    ("coordination.k8s.io", "leases"): (
        _NAME,
        Column("Holder", "string", lambda o, n: _get(o, "spec", "holderIdentity") or "", "", "The holder."),
        _AGE,
    ),
    ("", "events"): (
        Column("Last Seen", "string", _event_last_seen, "", "Time when this event was last seen."),
        Column("Type", "string", lambda o, n: _get(o, "type") or "", "", "Type of this event."),
        Column("Reason", "string", lambda o, n: _get(o, "reason") or "", "", "Why the action was taken."),
        Column("Object", "string", _event_object, "", "The object that this event is about."),
        Column(
            "Subobject",
            "string",
            lambda o, n: _get(o, "involvedObject", "fieldPath") or _get(o, "regarding", "fieldPath") or "",
            "",
            "The field of the object this event is about.",
            1,
        ),
        Column("Source", "string", _event_source, "", "The component reporting this event.", 1),
        Column("Message", "string", lambda o, n: _get(o, "message") or _get(o, "note") or "", "", "Message."),
        Column("First Seen", "string", _event_first_seen, "", "Time when this event was first seen.", 1),
        Column("Count", "integer", _event_count, "", "The number of times this event has occurred.", 1),
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


def _ready_of(obj: Obj, now: dt.datetime) -> str:
    return f"{_int(_get(obj, 'status', 'readyReplicas'))}/{_int(_get(obj, 'spec', 'replicas'))}"


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


def _cronjob_last(obj: Obj, now: dt.datetime) -> str:
    last = _get(obj, "status", "lastScheduleTime")
    return since(last, now) if last else "<none>"


def _pvc_modes(obj: Obj, now: dt.datetime) -> str:
    short = {"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX", "ReadWriteOncePod": "RWOP"}
    return ",".join(short.get(str(m), str(m)) for m in _list(_get(obj, "status", "accessModes")))


def _ingress_hosts(obj: Obj, now: dt.datetime) -> str:
    hosts = [str(r.get("host")) for r in _list(_get(obj, "spec", "rules")) if isinstance(r, dict) and r.get("host")]
    return ",".join(hosts) if hosts else "*"


def _ingress_address(obj: Obj, now: dt.datetime) -> str:
    out = [i.get("ip") or i.get("hostname") for i in _list(_get(obj, "status", "loadBalancer", "ingress"))]
    return ",".join(str(a) for a in out if a)


def _ingress_ports(obj: Obj, now: dt.datetime) -> str:
    return "80, 443" if _list(_get(obj, "spec", "tls")) else "80"


def _created_at(obj: Obj, now: dt.datetime) -> str:
    return str(_get(obj, "metadata", "creationTimestamp") or "")


def _role_ref(obj: Obj, now: dt.datetime) -> str:
    ref = _get(obj, "roleRef") or {}
    return f"{ref.get('kind', '')}/{ref.get('name', '')}"


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
    Column("Role", "string", _role_ref, "", "Role of the binding."),
    _AGE,
    Column("Users", "string", _subjects("User"), "", "Users in the binding.", 1),
    Column("Groups", "string", _subjects("Group"), "", "Groups in the binding.", 1),
    Column("ServiceAccounts", "string", _subjects("ServiceAccount"), "", "ServiceAccounts in the binding.", 1),
)
_ROLE = (_NAME, Column("Created At", "date", _created_at, "", "Time the role was created."))

BUILTIN_COLUMNS.update(
    {
        ("", "secrets"): (
            _NAME,
            Column("Type", "string", lambda o, n: _get(o, "type") or "", "", "The type of the secret."),
            Column("Data", "integer", lambda o, n: len(_get(o, "data") or {}), "", "The number of keys."),
            _AGE,
        ),
        ("", "serviceaccounts"): (
            _NAME,
            Column("Secrets", "integer", lambda o, n: len(_list(_get(o, "secrets"))), "", "The number of secrets."),
            _AGE,
        ),
        ("", "services"): (
            _NAME,
            Column(
                "Type", "string", lambda o, n: _get(o, "spec", "type") or "ClusterIP", "", "The type of the service."
            ),
            Column(
                "Cluster-IP", "string", lambda o, n: _get(o, "spec", "clusterIP") or "<none>", "", "The cluster IP."
            ),
            Column("External-IP", "string", _svc_external_ip, "", "The external IPs."),
            Column("Port(s)", "string", _svc_ports, "", "The ports of the service."),
            _AGE,
            Column(
                "Selector",
                "string",
                lambda o, n: format_selector({"matchLabels": _get(o, "spec", "selector") or {}}) or "<none>",
                "",
                "The selector.",
                1,
            ),
        ),
        ("", "persistentvolumeclaims"): (
            _NAME,
            Column("Status", "string", lambda o, n: _get(o, "status", "phase") or "", "", "The phase of the claim."),
            Column("Volume", "string", lambda o, n: _get(o, "spec", "volumeName") or "", "", "The bound volume."),
            Column(
                "Capacity", "string", lambda o, n: _get(o, "status", "capacity", "storage") or "", "", "The capacity."
            ),
            Column("Access Modes", "string", _pvc_modes, "", "The access modes."),
            Column("StorageClass", "string", lambda o, n: _get(o, "spec", "storageClassName") or "", "", "The class."),
            _AGE,
        ),
        ("apps", "statefulsets"): (
            _NAME,
            Column("Ready", "string", _ready_of, "", "Ready replicas."),
            _AGE,
            *_WIDE_WORKLOAD[:2],
        ),
        ("apps", "daemonsets"): (
            _NAME,
            Column("Desired", "integer", _integer("status", "desiredNumberScheduled"), "", "Desired pods."),
            Column("Current", "integer", _integer("status", "currentNumberScheduled"), "", "Current pods."),
            Column("Ready", "integer", _integer("status", "numberReady"), "", "Ready pods."),
            Column("Up-to-date", "integer", _integer("status", "updatedNumberScheduled"), "", "Updated pods."),
            Column("Available", "integer", _integer("status", "numberAvailable"), "", "Available pods."),
            Column(
                "Node Selector",
                "string",
                lambda o, n: (
                    ",".join(
                        f"{k}={v}"
                        for k, v in sorted((_get(o, "spec", "template", "spec", "nodeSelector") or {}).items())
                    )
                    or "<none>"
                ),
                "",
                "The node selector.",
            ),
            _AGE,
            *_WIDE_WORKLOAD,
        ),
        ("batch", "jobs"): (
            _NAME,
            Column("Status", "string", _job_status, "", "The status of the job."),
            Column("Completions", "string", _job_completions, "", "The completions."),
            Column("Duration", "string", _job_duration, "", "How long the job ran."),
            _AGE,
            *_WIDE_WORKLOAD,
        ),
        ("batch", "cronjobs"): (
            _NAME,
            Column("Schedule", "string", lambda o, n: _get(o, "spec", "schedule") or "", "", "The schedule."),
            Column("Timezone", "string", lambda o, n: _get(o, "spec", "timeZone") or "<none>", "", "The time zone."),
            Column("Suspend", "boolean", lambda o, n: bool(_get(o, "spec", "suspend")), "", "Suspended."),
            Column("Active", "integer", lambda o, n: len(_list(_get(o, "status", "active"))), "", "Active jobs."),
            Column("Last Schedule", "string", _cronjob_last, "", "When the job was last scheduled."),
            _AGE,
        ),
        ("networking.k8s.io", "ingresses"): (
            _NAME,
            Column("Class", "string", lambda o, n: _get(o, "spec", "ingressClassName") or "<none>", "", "The class."),
            Column("Hosts", "string", _ingress_hosts, "", "The hosts."),
            Column("Address", "string", _ingress_address, "", "The addresses."),
            Column("Ports", "string", _ingress_ports, "", "The ports."),
            _AGE,
        ),
        ("rbac.authorization.k8s.io", "roles"): _ROLE,
        ("rbac.authorization.k8s.io", "clusterroles"): _ROLE,
        ("rbac.authorization.k8s.io", "rolebindings"): _BINDING,
        ("rbac.authorization.k8s.io", "clusterrolebindings"): _BINDING,
    }
)
DEFAULT_COLUMNS: tuple[Column, ...] = (_NAME, _AGE)


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
            if not isinstance(obj, dict):
                return None
            obj = obj.get(name)
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
    for ver in _list(_get(crd, "spec", "versions")):
        if not isinstance(ver, dict) or ver.get("name") != version:
            continue
        return version_printer_columns(ver)
    return None


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
) -> Obj:
    """A ``meta.k8s.io Table`` of ``objects`` (``headers=False`` leaves out the column definitions, as watches do)."""
    at = now or dt.datetime.now(dt.UTC)
    rows: list[Obj] = []
    for obj in objects:
        row: Obj = {"cells": [c.cell(obj, at) for c in columns]}
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
    lines: AsyncIterator[bytes], columns: Sequence[Column], *, include: str, version: str
) -> AsyncGenerator[bytes, None]:
    """Re-encode a JSON watch stream (one event per line) with each object as a one-row Table.

    The first Table carries the column definitions, later ones do not (as
    kube-apiserver answers ``kubectl get -w``); ``BOOKMARK`` and ``ERROR``
    events pass unchanged.
    """
    pending = b""
    headers = True
    async for chunk in lines:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        out: list[bytes] = []
        for line in complete:
            if not line.strip():
                continue
            event = orjson.loads(line)
            obj = event.get("object")
            if event.get("type") in ("ADDED", "MODIFIED", "DELETED") and isinstance(obj, dict):
                meta = {"resourceVersion": _get(obj, "metadata", "resourceVersion") or ""}
                event["object"] = build_table(
                    columns, [obj], include=include, version=version, list_meta=meta, headers=headers
                )
                headers = False
            out.append(orjson.dumps(event) + b"\n")
        if out:
            yield b"".join(out)
    if pending.strip():
        yield pending
