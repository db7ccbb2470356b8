"""The shared Table printers (rangeshard.core.tables): ages, pod status, selectors, CRD printer columns."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator

import orjson
import pytest

from local_apiserver.resources import RESOURCES
from rangeshard.core import tables
from rangeshard.core.errors import LineTooLong
from rangeshard.core.http1 import MAX_LINE_BYTES

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
    assert (cj["Schedule"], cj["Suspend"], cj["Active"], cj["Last Schedule"]) == ("*/5 * * * *", "<unset>", 0, "<none>")
    binding = {
        "roleRef": {"kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "User", "name": "ann"}, {"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}],
    }
    b = _cells("rbac.authorization.k8s.io", "rolebindings", binding)
    assert (b["Role"], b["Users"], b["ServiceAccounts"], b["Groups"]) == ("ClusterRole/view", "ann", "ns/sa", "")
    pvc = _cells(
        "",
        "persistentvolumeclaims",
        {"spec": {"volumeName": "pv1"}, "status": {"phase": "Bound", "accessModes": ["ReadOnlyMany", "ReadWriteOnce"]}},
    )
    assert pvc["Status"] == "Bound" and pvc["Access Modes"] == "RWO,ROX"


def _header(group: str, resource: str, wide: bool = False) -> list[str]:
    return [c.name for c in tables.columns_for(group, resource) if wide or c.priority == 0]


def test_hpa_columns_v2_and_v1() -> None:
    assert _header("autoscaling", "horizontalpodautoscalers") == [
        "Name", "Reference", "Targets", "MinPods", "MaxPods", "Replicas", "Age",
    ]  # fmt: skip
    hpa = {
        "metadata": {"name": "web", "creationTimestamp": "2026-01-10T11:55:00Z"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "minReplicas": 2,
            "maxReplicas": 10,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}],
        },
        "status": {"currentReplicas": 3, "currentMetrics": [{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 45}}}]},
    }  # fmt: skip
    c = _cells("autoscaling", "horizontalpodautoscalers", hpa)
    assert [c[k] for k in ("Name", "Reference", "Targets", "MinPods", "MaxPods", "Replicas", "Age")] == [
        "web", "Deployment/web", "cpu: 45%/80%", "2", 10, 3, "5m",
    ]  # fmt: skip
    # No current metric yet, no minReplicas, and autoscaling/v1's shape.
    fresh = {
        "spec": {
            "scaleTargetRef": {"kind": "StatefulSet", "name": "db"},
            "maxReplicas": 4,
            "metrics": hpa["spec"]["metrics"],
        }
    }
    c = _cells("autoscaling", "horizontalpodautoscalers", fresh)
    assert (c["Reference"], c["Targets"], c["MinPods"], c["Replicas"]) == (
        "StatefulSet/db",
        "cpu: <unknown>/80%",
        "<unset>",
        0,
    )
    v1 = {
        "spec": {"maxReplicas": 3, "targetCPUUtilizationPercentage": 50},
        "status": {"currentCPUUtilizationPercentage": 7},
    }
    assert tables.hpa_targets(v1) == "cpu: 7%/50%"
    assert tables.hpa_targets({"spec": {"maxReplicas": 3}}) == "<none>"


def test_hpa_targets_of_every_metric_type_and_more() -> None:
    metrics = [
        {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "10"}}},
        {"type": "External", "external": {"metric": {"name": "q"}, "target": {"type": "Value", "value": "3"}}},
        {
            "type": "Object",
            "object": {"metric": {"name": "r"}, "target": {"type": "AverageValue", "averageValue": "2"}},
        },
        {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "1Gi"}}},
        {
            "type": "ContainerResource",
            "containerResource": {"name": "cpu", "container": "app", "target": {"type": "Utilization"}},
        },
        {"type": "Unknown"},
    ]
    status = [
        {"type": "Pods", "pods": {"current": {"averageValue": "4"}}},
        {"type": "External", "external": {"current": {"value": "2"}}},
        {"type": "Object", "object": {"current": {"averageValue": "1"}}},
        {"type": "Resource", "resource": {"name": "memory", "current": {"averageValue": "512Mi"}}},
    ]  # fmt: skip
    one = [tables.hpa_targets({"spec": {"metrics": [m]}, "status": {"currentMetrics": [s] if s else []}})
           for m, s in zip(metrics, [*status, None, None], strict=True)]  # fmt: skip
    assert one == ["4/10", "2/3", "1/2 (avg)", "memory: 512Mi/1Gi", "cpu: <unknown>/<auto>", "<unknown type>"]
    assert tables.hpa_targets({"spec": {"metrics": metrics}, "status": {"currentMetrics": status}}) == (
        "4/10, 2/3 + 4 more..."
    )


def test_storage_and_volume_columns() -> None:
    assert _header("", "persistentvolumeclaims", wide=True) == [
        "Name", "Status", "Volume", "Capacity", "Access Modes", "StorageClass", "VolumeAttributesClass", "Age", "VolumeMode",
    ]  # fmt: skip
    pending = _cells(
        "", "persistentvolumeclaims", {"spec": {"storageClassName": "fast"}, "status": {"phase": "Pending"}}
    )
    assert (pending["Status"], pending["Capacity"], pending["Access Modes"]) == ("Pending", "", "")
    assert (pending["VolumeAttributesClass"], pending["VolumeMode"]) == ("<unset>", "<unset>")
    going = {
        "metadata": {
            "deletionTimestamp": "2026-01-10T11:00:00Z",
            "annotations": {"volume.beta.kubernetes.io/storage-class": "old"},
        }
    }
    assert _cells("", "persistentvolumeclaims", going)["Status"] == "Terminating"
    assert _cells("", "persistentvolumeclaims", going)["StorageClass"] == "old"
    pv = {
        "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOncePod", "ReadWriteMany"],
                 "persistentVolumeReclaimPolicy": "Retain", "claimRef": {"namespace": "ns", "name": "data"},
                 "volumeAttributesClassName": "gold", "volumeMode": "Block"},
        "status": {"phase": "Bound"},
    }  # fmt: skip
    c = _cells("", "persistentvolumes", pv)
    assert [c[k] for k in ("Capacity", "Access Modes", "Reclaim Policy", "Status", "Claim", "VolumeAttributesClass", "VolumeMode")] == [
        "5Gi", "RWX,RWOP", "Retain", "Bound", "ns/data", "gold", "Block",
    ]  # fmt: skip
    sc = {
        "metadata": {"name": "std", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "p",
    }
    c = _cells("storage.k8s.io", "storageclasses", sc)
    assert [c[k] for k in ("Name", "Provisioner", "ReclaimPolicy", "VolumeBindingMode", "AllowVolumeExpansion")] == [
        "std (default)", "p", "Delete", "Immediate", False,
    ]  # fmt: skip
    va = {
        "spec": {"attacher": "a", "nodeName": "n", "source": {"persistentVolumeName": "pv"}},
        "status": {"attached": True},
    }
    c = _cells("storage.k8s.io", "volumeattachments", va)
    assert (c["Attacher"], c["PV"], c["Node"], c["Attached"]) == ("a", "pv", "n", True)
    assert _cells("storage.k8s.io", "csistoragecapacities", {"storageClassName": "s"})["Capacity"] == "<unset>"
    assert _cells("storage.k8s.io", "csinodes", {"spec": {"drivers": [{"name": "a"}, {"name": "b"}]}})["Drivers"] == 2


def test_endpoint_columns() -> None:
    ep = {"subsets": [
        {"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}], "ports": [{"port": 80}, {"port": 443}]},
        {"addresses": [{"ip": "fd00::1"}]},
    ]}  # fmt: skip
    assert tables.format_endpoints(ep) == "10.0.0.1:80,10.0.0.2:80,10.0.0.1:443 + 2 more..."
    assert (
        tables.format_endpoints({"subsets": [{"addresses": [{"ip": "fd00::1"}], "ports": [{"port": 80}]}]})
        == "[fd00::1]:80"
    )
    assert tables.format_endpoints({}) == "<none>"
    assert tables.format_endpoints({"subsets": [{"notReadyAddresses": [{"ip": "10.0.0.3"}]}]}) == ""
    eps = {"addressType": "IPv4", "ports": [{"port": 80}, {"name": "dns"}, {}, {"port": 9}],
           "endpoints": [{"addresses": ["10.0.0.1"]}]}  # fmt: skip
    c = _cells("discovery.k8s.io", "endpointslices", eps)
    assert (c["AddressType"], c["Ports"], c["Endpoints"]) == ("IPv4", "80,dns,* + 1 more...", "10.0.0.1")
    empty = _cells("discovery.k8s.io", "endpointslices", {"addressType": "IPv6"})
    assert (empty["Ports"], empty["Endpoints"]) == ("<unset>", "<unset>")


def test_core_policy_and_apps_columns() -> None:
    quota = {
        "spec": {"hard": {"pods": "10", "limits.cpu": "4", "requests.memory": "1Gi"}},
        "status": {"used": {"pods": "3"}},
    }
    c = _cells("", "resourcequotas", quota)
    assert (c["Request"], c["Limit"]) == ("pods: 3/10, requests.memory: 0/1Gi", "limits.cpu: 0/4")
    tmpl = {
        "template": {
            "metadata": {"labels": {"b": "2", "a": "1"}},
            "spec": {"containers": [{"name": "c", "image": "i:1"}]},
        }
    }
    c = _cells("", "podtemplates", tmpl)
    assert (c["Containers"], c["Images"], c["Pod Labels"]) == ("c", "i:1", "a=1,b=2")
    assert _cells("", "podtemplates", {})["Pod Labels"] == "<none>"
    rc = {"spec": {"replicas": 2, "selector": {"app": "x"}}, "status": {"replicas": 1}}
    c = _cells("", "replicationcontrollers", rc)
    assert (c["Desired"], c["Current"], c["Ready"], c["Selector"]) == (2, 1, 0, "app=x")
    rev = {
        "metadata": {
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "controller": True}]
        },
        "revision": 4,
    }
    assert (_cells("apps", "controllerrevisions", rev)["Controller"], _cells("apps", "controllerrevisions", rev)["Revision"]) == (
        "statefulset.apps/db", 4,
    )  # fmt: skip
    pdb = _cells(
        "policy", "poddisruptionbudgets", {"spec": {"maxUnavailable": "25%"}, "status": {"disruptionsAllowed": 1}}
    )
    assert (pdb["Min Available"], pdb["Max Unavailable"], pdb["Allowed Disruptions"]) == ("N/A", "25%", 1)
    node = {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": "", "kubernetes.io/role": "edge"}},
            "spec": {"unschedulable": True},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": "v1.32.0"},
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.5"}]}}  # fmt: skip
    c = _cells("", "nodes", node)
    assert [c[k] for k in ("Status", "Roles", "Version", "Internal-IP", "External-IP")] == [
        "Ready,SchedulingDisabled", "control-plane,edge", "v1.32.0", "10.0.0.5", "<none>",
    ]  # fmt: skip
    assert (_cells("", "nodes", {})["Status"], _cells("", "nodes", {})["Roles"]) == ("Unknown", "<none>")
    cj = _cells(
        "batch",
        "cronjobs",
        {
            "spec": {
                "suspend": True,
                "jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}},
            }
        },
    )
    assert (cj["Suspend"], cj["Containers"], cj["Images"], cj["Selector"]) == ("True", "c", "i", "<none>")


def test_networking_scheduling_and_admission_columns() -> None:
    cls = {
        "spec": {
            "controller": "k8s.io/ingress-nginx",
            "parameters": {"apiGroup": "k8s.example.com", "kind": "IngressParameters", "name": "p"},
        }
    }
    c = _cells("networking.k8s.io", "ingressclasses", cls)
    assert (c["Controller"], c["Parameters"]) == ("k8s.io/ingress-nginx", "IngressParameters.k8s.example.com/p")
    np = {"spec": {"podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["b", "a"]}]}}}
    assert _cells("networking.k8s.io", "networkpolicies", np)["Pod-Selector"] == "tier in (a,b)"
    assert _cells("networking.k8s.io", "networkpolicies", {"spec": {"podSelector": {}}})["Pod-Selector"] == "<none>"
    pc = _cells(
        "scheduling.k8s.io", "priorityclasses", {"value": 5, "globalDefault": True, "preemptionPolicy": "Never"}
    )
    assert (pc["Value"], pc["Global-Default"], pc["PreemptionPolicy"]) == (5, True, "Never")
    assert _cells("node.k8s.io", "runtimeclasses", {"handler": "runc"})["Handler"] == "runc"
    hooks = {"webhooks": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}
    assert _cells("admissionregistration.k8s.io", "mutatingwebhookconfigurations", hooks)["Webhooks"] == 3
    vap = {"spec": {"validations": [{"expression": "true"}], "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}}}
    c = _cells("admissionregistration.k8s.io", "validatingadmissionpolicies", vap)
    assert (c["Validations"], c["ParamKind"]) == (1, "v1/ConfigMap")
    csr = {"spec": {"signerName": "example.org/s", "username": "ann", "expirationSeconds": 7200},
           "status": {"conditions": [{"type": "Approved"}], "certificate": "Zm9v"}}  # fmt: skip
    c = _cells("certificates.k8s.io", "certificatesigningrequests", csr)
    assert [c[k] for k in ("SignerName", "Requestor", "RequestedDuration", "Condition")] == [
        "example.org/s",
        "ann",
        "120m",
        "Approved,Issued",
    ]
    assert _cells("certificates.k8s.io", "certificatesigningrequests", {})["Condition"] == "Pending"
    fs = {"spec": {"priorityLevelConfiguration": {"name": "pl"}, "matchingPrecedence": 100},
          "status": {"conditions": [{"type": "Dangling", "status": "False"}]}}  # fmt: skip
    c = _cells("flowcontrol.apiserver.k8s.io", "flowschemas", fs)
    assert [c[k] for k in ("PriorityLevel", "MatchingPrecedence", "DistinguisherMethod", "MissingPL")] == [
        "pl",
        "100",
        "<none>",
        "False",
    ]
    exempt = _cells("flowcontrol.apiserver.k8s.io", "prioritylevelconfigurations", {"spec": {"type": "Exempt"}})
    assert [exempt[k] for k in ("Type", "NominalConcurrencyShares", "Queues", "HandSize", "QueueLengthLimit")] == [
        "Exempt", "<none>", "<none>", "<none>", "<none>",
    ]  # fmt: skip
    rejecting = {
        "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 3, "limitResponse": {"type": "Reject"}}}
    }
    c = _cells("flowcontrol.apiserver.k8s.io", "prioritylevelconfigurations", rejecting)
    assert (c["NominalConcurrencyShares"], c["Queues"]) == (3, "<none>")


def test_every_served_kind_has_kube_s_columns_or_name_and_age() -> None:
    for spec in RESOURCES:
        names = [c.name for c in tables.columns_for(spec.group, spec.resource)]
        assert names[0] in ("Name", "Last Seen"), (spec.resource, names)
        # Every cell computes on an empty object (no KeyError/TypeError on missing fields).
        for c in tables.columns_for(spec.group, spec.resource):
            c.cell({}, NOW)


def test_build_table_cells_from_a_view_rows_embed_the_served_object() -> None:
    served = {"apiVersion": "autoscaling/v1", "metadata": {"name": "h"}, "spec": {"targetCPUUtilizationPercentage": 5}}
    stored = {"apiVersion": "autoscaling/v2", "metadata": {"name": "h"}, "spec": {"metrics": [{"type": "Pods", "pods": {"target": {"averageValue": "1"}}}]}}  # fmt: skip
    cols = tables.columns_for("autoscaling", "horizontalpodautoscalers")
    table = tables.build_table(cols, [served], include="Object", now=NOW, view=lambda o: stored)
    (row,) = table["rows"]
    assert row["cells"][2] == "<unknown>/1" and row["object"] is served
    assert tables.build_table(cols, [served], now=NOW)["rows"][0]["cells"][2] == "cpu: <unknown>/5%"


@pytest.mark.parametrize("selector", ["zone=a", ["zone=a"], 7, None])
def test_daemonset_node_selector_that_is_not_a_map_prints_none(selector: object) -> None:
    """A DaemonSet whose ``spec.template.spec.nodeSelector`` is not a map shows ``<none>`` in NODE SELECTOR."""
    cols = tables.columns_for("apps", "daemonsets")
    bad = {"metadata": {"name": "bad"}, "spec": {"template": {"spec": {"nodeSelector": selector}}}}
    good = {
        "metadata": {"name": "good"},
        "spec": {"template": {"spec": {"nodeSelector": {"zone": "a", "disk": "ssd"}}}},
    }
    table = tables.build_table(cols, [bad, good], now=NOW)
    at = [d["name"] for d in table["columnDefinitions"]].index("Node Selector")
    assert [row["cells"][at] for row in table["rows"]] == ["<none>", "disk=ssd,zone=a"]


async def _chunks(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _table_watch(*chunks: bytes, limit: int = MAX_LINE_BYTES) -> list[bytes]:
    async def run() -> list[bytes]:
        watch = tables.table_watch(_chunks(*chunks), tables.DEFAULT_COLUMNS, include="None", version="v1", limit=limit)
        return [out async for out in watch]

    return asyncio.run(run())


def _event(name: str, etype: str = "ADDED") -> bytes:
    obj = {"kind": "ConfigMap", "metadata": {"name": name, "resourceVersion": "7"}}
    return orjson.dumps({"type": etype, "object": obj}) + b"\n"


def test_a_table_watch_joins_lines_split_across_chunks_and_passes_bookmarks() -> None:
    first, second = _event("a"), _event("b")
    bookmark = b'{"type":"BOOKMARK","object":{"kind":"ConfigMap","metadata":{"resourceVersion":"9"}}}\n'
    out = b"".join(_table_watch(first[:10], first[10:] + second[:5], second[5:] + b"\n" + bookmark))
    events = [orjson.loads(line) for line in out.splitlines()]
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    assert [e["object"]["kind"] for e in events] == ["Table", "Table", "ConfigMap"]
    assert [e["object"]["rows"][0]["cells"][0] for e in events[:2]] == ["a", "b"]
    assert "columnDefinitions" in events[0]["object"] and not events[1]["object"].get("columnDefinitions")


def test_a_table_watch_line_without_end_is_cut_at_the_one_limit() -> None:
    endless = [b"x" * 1000] * 50  # 50 kB, never a newline
    with pytest.raises(LineTooLong) as e:
        _table_watch(_event("a"), *endless, limit=4096)
    assert e.value.limit == 4096
