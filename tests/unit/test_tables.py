"""The shared Table printers (rangeshard.core.tables): ages, pod status, selectors, CRD printer columns."""

from __future__ import annotations

import datetime as dt

import pytest

from rangeshard.core import tables

NOW = dt.datetime(2026, 1, 10, 12, 0, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (59, "59s"),
        (119, "119s"),
        (120, "2m"),
        (310, "5m10s"),
        (900, "15m"),
        (3 * 3600 + 600, "3h10m"),
        (20 * 3600, "20h"),
        (2 * 86400 + 4 * 3600, "2d4h"),
        (30 * 86400, "30d"),
        (3 * 365 * 86400 + 86400, "3y1d"),
        (10 * 365 * 86400, "10y"),
    ],
)
def test_human_duration_matches_kube(seconds: int, text: str) -> None:
    assert tables.human_duration(seconds) == text


def test_pod_status_reasons() -> None:
    pod = {
        "spec": {"containers": [{"name": "a"}, {"name": "b"}], "initContainers": [{"name": "i"}]},
        "status": {
            "phase": "Pending",
            "initContainerStatuses": [{"name": "i", "state": {"waiting": {"reason": "PodInitializing"}}}],
        },
    }
    assert tables.pod_status(pod)[:3] == (0, 2, "Init:0/1")
    pod["status"] = {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "a",
                "ready": True,
                "restartCount": 1,
                "state": {"running": {}},
                "lastState": {"terminated": {"finishedAt": "2026-01-10T11:55:00Z"}},
            },
            {"name": "b", "ready": True, "restartCount": 0, "state": {"running": {}}},
        ],
    }
    ready, total, reason, restarts, _ = tables.pod_status(pod)
    assert (ready, total, reason, restarts) == (2, 2, "Running", 1)
    restarts_cell = next(c for c in tables.BUILTIN_COLUMNS[("", "pods")] if c.name == "Restarts")
    assert restarts_cell.cell(pod, NOW) == "1 (5m ago)"
    pod["metadata"] = {"deletionTimestamp": "2026-01-10T11:59:00Z"}
    assert tables.pod_status(pod)[2] == "Terminating"


def test_selector_and_table_document() -> None:
    selector = {
        "matchLabels": {"b": "2", "a": "1"},
        "matchExpressions": [{"key": "c", "operator": "In", "values": ["y", "x"]}],
    }
    assert tables.format_selector(selector) == "a=1,b=2,c in (x,y)"
    assert tables.format_selector({}) == "<none>"
    cm = {"metadata": {"name": "c", "creationTimestamp": "2026-01-10T11:58:00Z"}, "data": {"k": "v"}}
    doc = tables.build_table(tables.columns_for("", "configmaps"), [cm], include="None", now=NOW)
    assert doc["rows"] == [{"cells": ["c", 1, "2m"]}]
    assert [c["name"] for c in doc["columnDefinitions"]] == ["Name", "Data", "Age"]
    assert tables.table_version("application/json;as=Table;v=v1;g=meta.k8s.io,application/json") == "v1"
    assert tables.table_version("application/json, application/json;as=Table;v=v1;g=meta.k8s.io") is None
    with pytest.raises(ValueError, match="Unsupported value"):
        tables.include_object("All")


def test_crd_printer_columns() -> None:
    crd = {
        "spec": {
            "versions": [
                {
                    "name": "v1",
                    "additionalPrinterColumns": [
                        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
                        {"name": "First", "type": "string", "jsonPath": ".spec.items[0].name", "priority": 1},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ]
        }
    }
    printer = tables.crd_printer_columns(crd, "v1")
    assert printer is not None and tables.crd_printer_columns(crd, "v2") is None
    columns = tables.columns_for("example.com", "widgets", printer)
    obj = {
        "metadata": {"name": "w", "creationTimestamp": "2026-01-10T11:00:00Z"},
        "spec": {"replicas": 3, "items": [{"name": "x"}]},
    }
    doc = tables.build_table(columns, [obj], now=NOW)
    assert [c["name"] for c in doc["columnDefinitions"]] == ["Name", "Replicas", "First", "Age"]
    assert doc["rows"][0]["cells"] == ["w", 3, "x", "60m"]
    assert [c.name for c in tables.columns_for("example.com", "widgets", ())] == ["Name", "Age"]


def test_event_columns_for_core_and_events_k8s_io() -> None:
    core_event = {
        "metadata": {"name": "e0", "creationTimestamp": "2026-01-10T11:00:00Z"},
        "type": "Warning",
        "reason": "BackOff",
        "involvedObject": {"kind": "Pod", "name": "p", "fieldPath": "spec.containers{c}"},
        "message": "back-off",
        "source": {"component": "kubelet", "host": "n1"},
        "count": 3,
        "lastTimestamp": "2026-01-10T11:59:00Z",
    }
    new_event = {
        "metadata": {"name": "e1", "creationTimestamp": "2026-01-10T11:55:00Z"},
        "type": "Normal",
        "reason": "ScalingReplicaSet",
        "regarding": {"kind": "Deployment", "name": "web"},
        "note": "Scaled up",
        "reportingController": "deployment-controller",
    }
    doc = tables.build_table(tables.columns_for("", "events"), [core_event], include="None", now=NOW)
    assert doc["rows"][0]["cells"] == [
        "60s",
        "Warning",
        "BackOff",
        "pod/p",
        "spec.containers{c}",
        "kubelet, n1",
        "back-off",
        "60m",
        3,
        "e0",
    ]
    doc = tables.build_table(tables.columns_for("events.k8s.io", "events"), [new_event], include="None", now=NOW)
    assert doc["rows"][0]["cells"][:4] == ["5m", "Normal", "ScalingReplicaSet", "deployment/web"]
    assert doc["rows"][0]["cells"][5:7] == ["deployment-controller", "Scaled up"]


def _cells(group: str, resource: str, obj: dict[str, object]) -> dict[str, object]:
    return {c.name: c.cell(obj, NOW) for c in tables.columns_for(group, resource)}


def test_service_columns() -> None:
    lb = {
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.9", "ports": [{"port": 443, "nodePort": 30443}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}},
    }
    c = _cells("", "services", lb)
    assert (c["Type"], c["Cluster-IP"], c["External-IP"], c["Port(s)"]) == (
        "LoadBalancer",
        "10.96.0.9",
        "1.2.3.4",
        "443:30443/TCP",
    )
    pending = _cells("", "services", {"spec": {"type": "LoadBalancer", "ports": []}})
    assert pending["External-IP"] == "<pending>" and pending["Port(s)"] == "<none>"
    ext = _cells("", "services", {"spec": {"type": "ExternalName", "externalName": "db.example.com"}})
    assert ext["External-IP"] == "db.example.com"
    assert _cells("", "services", {"spec": {"clusterIP": "None", "selector": {"app": "x"}}})["Selector"] == "app=x"


def test_job_cronjob_and_binding_columns() -> None:
    done = {
        "spec": {"completions": 3},
        "status": {
            "succeeded": 3,
            "startTime": "2026-01-10T11:00:00Z",
            "completionTime": "2026-01-10T11:02:05Z",
            "conditions": [{"type": "Complete", "status": "True"}],
        },
    }
    c = _cells("batch", "jobs", done)
    assert (c["Status"], c["Completions"], c["Duration"]) == ("Complete", "3/3", "2m5s")
    cj = _cells("batch", "cronjobs", {"spec": {"schedule": "*/5 * * * *"}, "status": {}})
    assert (cj["Schedule"], cj["Suspend"], cj["Active"], cj["Last Schedule"]) == ("*/5 * * * *", False, 0, "<none>")
    binding = {
        "roleRef": {"kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "User", "name": "ann"}, {"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}],
    }
    b = _cells("rbac.authorization.k8s.io", "rolebindings", binding)
    assert (b["Role"], b["Users"], b["ServiceAccounts"], b["Groups"]) == ("ClusterRole/view", "ann", "ns/sa", "")
    pvc = _cells(
        "", "persistentvolumeclaims", {"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce", "ReadOnlyMany"]}}
    )
    assert pvc["Status"] == "Bound" and pvc["Access Modes"] == "RWO,ROX"
