"""Issue 23's leftovers: Job pods run to Succeeded, kube's categories, autoscaling/v1 HPAs, more default kinds.

The module runs its own local API server with a simulated node (``--simulate-node``), so pods are bound
and started; kubectl, the official client and plain HTTP talk to it through the usual fixtures.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from local_apiserver.conversion import CONDITIONS_ANNOTATION, METRICS_ANNOTATION, hpa_to_v1, hpa_to_v2
from local_apiserver.process import LocalApiServerProcess
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.etcdserver import EtcdServer
from tests.helpers import wait_until
from tests.local_apiserver.conftest import Server

NODE = "leftover-node"

# What kube-apiserver 1.32 declares (rest.CategoriesProvider); every other served resource has none.
KUBE_CATEGORIES = {
    ("", "pods"): ["all"],
    ("", "services"): ["all"],
    ("", "replicationcontrollers"): ["all"],
    ("apps", "deployments"): ["all"],
    ("apps", "replicasets"): ["all"],
    ("apps", "statefulsets"): ["all"],
    ("apps", "daemonsets"): ["all"],
    ("batch", "jobs"): ["all"],
    ("batch", "cronjobs"): ["all"],
    ("autoscaling", "horizontalpodautoscalers"): ["all"],
    ("apiextensions.k8s.io", "customresourcedefinitions"): ["api-extensions"],
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): ["api-extensions"],
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): ["api-extensions"],
    ("admissionregistration.k8s.io", "validatingadmissionpolicies"): ["api-extensions"],
    ("admissionregistration.k8s.io", "validatingadmissionpolicybindings"): ["api-extensions"],
}


@pytest.fixture(scope="module")
def apiserver(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """This module's server: the conftest's, plus a simulated node."""
    prefix = f"/test-leftovers-{uuid.uuid4().hex[:10]}"
    log_file = tmp_path_factory.mktemp("las") / "apiserver.log"
    proc = LocalApiServerProcess(
        etcd_server.url, prefix=prefix, log_file=log_file, extra_args=["--simulate-node", NODE]
    )
    proc.start()
    yield Server(proc, prefix)
    proc.stop()
    with EtcdClient(EtcdConfig.from_urls(etcd_server.url)) as client:
        client.delete_prefix(prefix + "/")


def _pod(name: str, restart_policy: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"job-name": "j"}},
        "spec": {
            "restartPolicy": restart_policy,
            "containers": [{"name": "a", "image": "busybox"}, {"name": "b", "image": "busybox"}],
        },
    }


def test_run_to_completion_pods_succeed_and_always_pods_keep_running(
    kube: Any, namespace: str, kubectl: Callable[..., Any]
) -> None:
    core = k8s.CoreV1Api(kube)
    for name, policy in (("never", "Never"), ("onfailure", "OnFailure"), ("always", "Always")):
        core.create_namespaced_pod(namespace, _pod(name, policy))

    def phase(name: str) -> str:
        return str(core.read_namespaced_pod(name, namespace).status.phase)

    wait_until(lambda: phase("always") == "Running", 10, "the Always pod running")
    wait_until(lambda: phase("never") == "Succeeded" and phase("onfailure") == "Succeeded", 10, "both finished")
    # Both started after (or with) the Always pod, which keeps running.
    always = core.read_namespaced_pod("always", namespace)
    assert always.status.phase == "Running"
    assert all(c.state.running is not None and c.ready for c in always.status.container_statuses)
    for name in ("never", "onfailure"):
        pod = core.read_namespaced_pod(name, namespace)
        assert pod.status.start_time is not None and pod.status.pod_ip
        assert [c.name for c in pod.status.container_statuses] == ["a", "b"]
        for c in pod.status.container_statuses:
            term = c.state.terminated
            assert c.state.running is None and term is not None, c
            assert (term.exit_code, term.reason) == (0, "Completed") and not c.ready and not c.started
            assert term.finished_at >= term.started_at
        conds = {c.type: c for c in pod.status.conditions}
        assert conds["Ready"].status == "False" and conds["Ready"].reason == "PodCompleted"
        assert conds["ContainersReady"].status == "False" and conds["PodScheduled"].status == "True"
    # kubectl shows them as kube does; a field selector on the phase finds them.
    lines = kubectl("get", "pods", "-n", namespace).stdout.splitlines()
    status = {line.split()[0]: line.split()[2] for line in lines[1:]}
    assert status == {"always": "Running", "never": "Completed", "onfailure": "Completed"}, lines
    done = core.list_namespaced_pod(namespace, field_selector="status.phase=Succeeded").items
    assert sorted(p.metadata.name for p in done) == ["never", "onfailure"]
    # A finished pod is removed at once on delete (no grace period), and is never restarted.
    kubectl("delete", "pod/never", "-n", namespace)
    assert [p.metadata.name for p in core.list_namespaced_pod(namespace).items] == ["always", "onfailure"]
    assert phase("onfailure") == "Succeeded"


def _discovery(http: httpx.Client) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Every top-level resource of legacy discovery: (group, version, resource) -> its APIResource."""
    lists = [("", "v1", http.get("/api/v1").json())]
    for group in http.get("/apis").json()["groups"]:
        for v in group["versions"]:
            lists.append((group["name"], v["version"], http.get(f"/apis/{v['groupVersion']}").json()))
    return {(g, v, r["name"]): r for g, v, doc in lists for r in doc["resources"] if "/" not in r["name"]}


def test_discovery_categories_are_kube_s(http: httpx.Client) -> None:
    found = _discovery(http)
    for (group, version, resource), entry in found.items():
        want = KUBE_CATEGORIES.get((group, resource))
        assert entry.get("categories") == want, (group, version, resource, entry.get("categories"))
    assert {(g, r) for g, _, r in found} >= set(KUBE_CATEGORIES)


ALL_MANIFESTS = """
apiVersion: v1
kind: Pod
metadata: {name: p}
spec: {containers: [{name: c, image: busybox}]}
---
apiVersion: v1
kind: Service
metadata: {name: s}
spec: {ports: [{port: 80}]}
---
apiVersion: v1
kind: ReplicationController
metadata: {name: rc}
spec: {replicas: 0, selector: {app: rc}, template: {metadata: {labels: {app: rc}}, spec: {containers: [{name: c, image: i}]}}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: ds}
spec: {selector: {matchLabels: {app: ds}}, template: {metadata: {labels: {app: ds}}, spec: {containers: [{name: c, image: i}]}}}
---
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: rs}
spec: {replicas: 0, selector: {matchLabels: {app: rs}}, template: {metadata: {labels: {app: rs}}, spec: {containers: [{name: c, image: i}]}}}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: cj}
spec: {schedule: "*/5 * * * *", jobTemplate: {spec: {template: {spec: {restartPolicy: Never, containers: [{name: c, image: i}]}}}}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: hpa}
spec: {scaleTargetRef: {apiVersion: apps/v1, kind: ReplicaSet, name: rs}, maxReplicas: 3}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm}
---
apiVersion: v1
kind: Secret
metadata: {name: sec}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: ing}
spec: {defaultBackend: {service: {name: s, port: {number: 80}}}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: pdb}
spec: {minAvailable: 1, selector: {matchLabels: {app: rs}}}
---
apiVersion: storage.k8s.io/v1
kind: CSIStorageCapacity
metadata: {name: cap}
storageClassName: fast
capacity: 10Gi
"""


def test_kubectl_get_all_lists_what_kube_lists(kubectl: Callable[..., Any], namespace: str) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=ALL_MANIFESTS)
    names = kubectl("get", "all", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(names) == [
        "cronjob.batch/cj",
        "daemonset.apps/ds",
        "horizontalpodautoscaler.autoscaling/hpa",  # once, though served in two versions
        "pod/p",
        "replicaset.apps/rs",
        "replicationcontroller/rc",
        "service/s",
    ], names
    extensions = kubectl("get", "api-extensions", "-o", "name").stdout.split()
    assert not any(n.startswith(("pod/", "service/")) for n in extensions)


HPA_V2 = """
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web, labels: {tier: front}}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  maxReplicas: 5
  metrics:
  - type: Resource
    resource: {name: memory, target: {type: AverageValue, averageValue: 1Gi}}
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 70}}
  behavior:
    scaleDown: {stabilizationWindowSeconds: 120}
"""


def test_hpa_served_as_v1_and_v2(kube: Any, namespace: str, kubectl: Callable[..., Any], http: httpx.Client) -> None:
    group = http.get("/apis/autoscaling").json()
    assert [v["version"] for v in group["versions"]] == ["v2", "v1"]
    assert group["preferredVersion"]["version"] == "v2"
    v1_resources = {r["name"]: r for r in http.get("/apis/autoscaling/v1").json()["resources"]}
    assert v1_resources["horizontalpodautoscalers"]["shortNames"] == ["hpa"]
    assert "horizontalpodautoscalers/status" in v1_resources
    v1 = k8s.AutoscalingV1Api(kube)
    v2 = k8s.AutoscalingV2Api(kube)
    # Created through v1: read through v2 as a CPU utilization metric (minReplicas defaulted to 1).
    v1.create_namespaced_horizontal_pod_autoscaler(
        namespace,
        {
            "metadata": {"name": "api"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api"},
                "maxReplicas": 4,
                "targetCPUUtilizationPercentage": 60,
            },
        },
    )
    got = v2.read_namespaced_horizontal_pod_autoscaler("api", namespace)
    assert got.api_version == "autoscaling/v2" and got.spec.min_replicas == 1 and got.spec.max_replicas == 4
    [metric] = got.spec.metrics
    assert (metric.type, metric.resource.name) == ("Resource", "cpu")
    assert (metric.resource.target.type, metric.resource.target.average_utilization) == ("Utilization", 60)
    # Created through v2 (kubectl apply): v1 shows the CPU target; what v1 cannot say is in kube's annotations.
    kubectl("apply", "-n", namespace, "-f", "-", input=HPA_V2)
    old = v1.read_namespaced_horizontal_pod_autoscaler("web", namespace)
    assert old.api_version == "autoscaling/v1" and old.spec.target_cpu_utilization_percentage == 70
    assert '"memory"' in old.metadata.annotations[METRICS_ANNOTATION]
    # A v1 client's read-modify-write keeps the v2-only fields.
    old.spec.max_replicas = 8
    v1.replace_namespaced_horizontal_pod_autoscaler("web", namespace, old)
    new = v2.read_namespaced_horizontal_pod_autoscaler("web", namespace)
    assert new.spec.max_replicas == 8 and new.spec.behavior.scale_down.stabilization_window_seconds == 120
    assert [(m.resource.name, m.resource.target.type) for m in new.spec.metrics] == [
        ("memory", "AverageValue"),
        ("cpu", "Utilization"),
    ]
    assert not [k for k in new.metadata.annotations if k.startswith("autoscaling.alpha")]  # never stored
    # Status written through v2 is read through v1 (currentCPUUtilizationPercentage, conditions annotation).
    status = {
        "status": {
            "currentReplicas": 2,
            "desiredReplicas": 3,
            "currentMetrics": [
                {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 42}}}
            ],
            "conditions": [{"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale"}],
        }
    }
    v2.patch_namespaced_horizontal_pod_autoscaler_status("web", namespace, status)
    seen = v1.read_namespaced_horizontal_pod_autoscaler("web", namespace)
    assert seen.status.current_cpu_utilization_percentage == 42 and seen.status.desired_replicas == 3
    assert "AbleToScale" in seen.metadata.annotations[CONDITIONS_ANNOTATION]
    # A v1 update that drops the annotations changes no status (kube keeps the stored status).
    raw = http.get(f"/apis/autoscaling/v1/namespaces/{namespace}/horizontalpodautoscalers/web").json()
    raw["metadata"]["annotations"] = {METRICS_ANNOTATION: raw["metadata"]["annotations"][METRICS_ANNOTATION]}
    raw["spec"]["minReplicas"] = 2
    put = http.put(f"/apis/autoscaling/v1/namespaces/{namespace}/horizontalpodautoscalers/web", json=raw)
    assert put.status_code == 200, put.text
    after = v2.read_namespaced_horizontal_pod_autoscaler("web", namespace)
    assert after.spec.min_replicas == 2 and [c.type for c in after.status.conditions] == ["AbleToScale"]
    assert after.status.current_metrics[0].resource.current.average_utilization == 42
    # Lists, selectors and watches through v1 see the objects in v1 form.
    listed = v1.list_namespaced_horizontal_pod_autoscaler(namespace, label_selector="tier=front")
    assert [h.metadata.name for h in listed.items] == ["web"]
    w = k8s_watch.Watch()
    kubectl("label", "hpa/web", "-n", namespace, "changed=yes")
    events = []
    for ev in w.stream(
        v1.list_namespaced_horizontal_pod_autoscaler,
        namespace,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=5,
    ):
        events.append(ev)
        w.stop()
    assert events[0]["type"] == "MODIFIED" and events[0]["object"].api_version == "autoscaling/v1"
    assert events[0]["object"].spec.target_cpu_utilization_percentage == 70
    # Unknown fields follow the v1 schema; kubectl (preferred v2) and a v1 delete see the same objects.
    bad = http.post(
        f"/apis/autoscaling/v1/namespaces/{namespace}/horizontalpodautoscalers?fieldValidation=Strict",
        json={
            "apiVersion": "autoscaling/v1",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "bad"},
            "spec": {"maxReplicas": 1, "metrics": []},
        },
    )
    assert bad.status_code == 400 and 'unknown field "spec.metrics"' in bad.json()["message"], bad.text
    names = kubectl("get", "hpa", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(names) == ["horizontalpodautoscaler.autoscaling/api", "horizontalpodautoscaler.autoscaling/web"]
    v1.delete_namespaced_horizontal_pod_autoscaler("api", namespace)
    assert [h.metadata.name for h in v2.list_namespaced_horizontal_pod_autoscaler(namespace).items] == ["web"]


def test_hpa_conversion_round_trips_every_metric_type() -> None:
    stored = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "h", "annotations": {"keep": "me"}},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d"},
            "minReplicas": 1,
            "maxReplicas": 5,
            "metrics": [
                {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "10"}}},
                {"type": "ContainerResource", "containerResource": {"name": "cpu", "container": "app", "target": {"type": "Utilization", "averageUtilization": 50}}},
                {"type": "External", "external": {"metric": {"name": "q", "selector": {"matchLabels": {"a": "b"}}}, "target": {"type": "Value", "value": "3"}}},
                {"type": "Object", "object": {"describedObject": {"kind": "Service", "name": "s", "apiVersion": "v1"}, "metric": {"name": "r"}, "target": {"type": "AverageValue", "averageValue": "3"}}},
                {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}},
            ],
        },
        "status": {
            "currentReplicas": 1,
            "desiredReplicas": 2,
            "currentMetrics": [
                {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 40, "averageValue": "100m"}}},
                {"type": "External", "external": {"metric": {"name": "q"}, "current": {"value": "2"}}},
            ],
        },
    }  # fmt: skip
    v1 = hpa_to_v1(stored)
    assert v1["spec"]["targetCPUUtilizationPercentage"] == 50 and "metrics" not in v1["spec"]
    assert v1["status"]["currentCPUUtilizationPercentage"] == 40
    assert hpa_to_v2(v1) == stored


MORE_KINDS = """
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: NAME}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}]
  validations: [{expression: "object.spec.replicas <= 5"}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: NAME}
spec: {policyName: NAME, validationActions: [Deny]}
---
apiVersion: storage.k8s.io/v1
kind: CSIStorageCapacity
metadata: {name: cap}
storageClassName: fast
capacity: 10Gi
"""


def test_admission_policies_and_storage_capacities_are_served(
    kubectl: Callable[..., Any], namespace: str, http: httpx.Client
) -> None:
    name = f"vap-{namespace}"
    out = kubectl("apply", "-n", namespace, "-f", "-", input=MORE_KINDS.replace("NAME", name)).stdout
    assert f"validatingadmissionpolicy.admissionregistration.k8s.io/{name} created" in out, out
    assert f"validatingadmissionpolicybinding.admissionregistration.k8s.io/{name} created" in out, out
    assert "csistoragecapacity.storage.k8s.io/cap created" in out, out
    policy = http.get(f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}").json()
    assert policy["metadata"]["generation"] == 1 and "namespace" not in policy["metadata"]
    status = http.get(f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}/status")
    assert status.status_code == 200
    cap = http.get(f"/apis/storage.k8s.io/v1/namespaces/{namespace}/csistoragecapacities/cap").json()
    assert cap["capacity"] == "10Gi"
    assert kubectl("get", "csistoragecapacities", "-n", namespace, "-o", "name").stdout.split() == [
        "csistoragecapacity.storage.k8s.io/cap"
    ]
    policy_yaml = MORE_KINDS.split("---", maxsplit=1)[0].replace("NAME", f"{name}-x")
    strict = kubectl(
        "apply",
        "-f",
        "-",
        "--validate=strict",
        check=False,
        input=policy_yaml.replace("  failurePolicy", "  colour: red\n  failurePolicy"),
    )
    assert strict.returncode != 0 and 'unknown field "spec.colour"' in strict.stderr, strict.stderr
    kubectl("delete", f"validatingadmissionpolicy/{name}", f"validatingadmissionpolicybinding/{name}")
    assert http.get(f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}").status_code == 404


def test_bad_service_cluster_ip_range_is_one_line_exit_2(etcd_server: EtcdServer) -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "local_apiserver", "--etcd", etcd_server.url, "--service-cluster-ip-range", "banana"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2, bad
    assert bad.stderr.strip().count("\n") == 0 and "Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.startswith("error: --service-cluster-ip-range: 'banana' is not an IPv4 CIDR"), bad.stderr
