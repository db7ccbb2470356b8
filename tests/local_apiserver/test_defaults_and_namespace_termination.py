"""Server-side defaults of the built-in workloads and a terminating namespace (issue 23), with the official
client and real kubectl.

Defaults: what kube-apiserver 1.32's defaulters set (``pkg/apis/{core,apps,batch}/v1/defaults.go``) on Jobs
(with the selector and pod labels generated from the Job's uid), StatefulSets, DaemonSets, Services and every
pod spec (a Pod's and every workload's template), while values the client set are kept. Namespaces: a deleted
namespace whose content is held by a finalizer shows ``Terminating`` and refuses new content with kube's 403.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from local_apiserver.defaults import image_pull_policy
from tests.local_apiserver.conftest import wait_for

UID_LABEL = "batch.kubernetes.io/controller-uid"
HOLD = "example.org/hold"

POD_SPEC_DEFAULTS = {
    "dnsPolicy": "ClusterFirst",
    "schedulerName": "default-scheduler",
    "terminationGracePeriodSeconds": 30,
    "securityContext": {},
}
CONTAINER_DEFAULTS = {"terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}


def _get(kubectl: Callable[..., Any], namespace: str, what: str) -> dict[str, Any]:
    return json.loads(kubectl("get", what, "-n", namespace, "-o", "json").stdout)


def _template(restart: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "pinned", "image": "registry.local/app:1.2", "ports": [{"containerPort": 8080}]},
            {"name": "latest", "image": "busybox"},
        ]
    }
    if restart:
        spec["restartPolicy"] = restart
    return {"metadata": {"labels": labels} if labels else {}, "spec": spec}


def _assert_pod_spec_defaults(pod_spec: dict[str, Any], restart: str = "Always") -> None:
    assert pod_spec["restartPolicy"] == restart
    assert {k: pod_spec.get(k) for k in POD_SPEC_DEFAULTS} == POD_SPEC_DEFAULTS, pod_spec
    pinned, latest = pod_spec["containers"]
    assert {k: pinned.get(k) for k in CONTAINER_DEFAULTS} == CONTAINER_DEFAULTS, pinned
    assert pinned["imagePullPolicy"] == "IfNotPresent" and latest["imagePullPolicy"] == "Always"
    assert pinned["ports"] == [{"containerPort": 8080, "protocol": "TCP"}]


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("busybox", "Always"),
        ("busybox:latest", "Always"),
        ("registry.local:5000/app", "Always"),
        ("registry.local:5000/app:1.2", "IfNotPresent"),
        ("app@sha256:0123", "IfNotPresent"),
        ("app:latest@sha256:0123", "Always"),
    ],
)
def test_image_pull_policy_follows_the_tag(image: str, policy: str) -> None:
    assert image_pull_policy(image) == policy


def test_job_gets_kube_defaults_and_a_selector_on_its_uid(
    kube: Any, kubectl: Callable[..., Any], namespace: str
) -> None:
    batch = k8s.BatchV1Api(kube)
    created = batch.create_namespaced_job(
        namespace,
        {"metadata": {"name": "migrate"}, "spec": {"template": _template("Never", {"app": "migrate"})}},
    )
    uid = created.metadata.uid
    assert created.spec.selector.match_labels == {UID_LABEL: uid}  # in the create response already
    job = _get(kubectl, namespace, "job/migrate")
    spec = job["spec"]
    assert spec["selector"] == {"matchLabels": {UID_LABEL: uid}}
    assert job["metadata"]["labels"] == {"app": "migrate"}  # a Job without labels takes its template's
    assert spec["template"]["metadata"]["labels"] == {
        "app": "migrate",
        UID_LABEL: uid,
        "controller-uid": uid,
        "batch.kubernetes.io/job-name": "migrate",
        "job-name": "migrate",
    }
    assert {k: spec.get(k) for k in ("backoffLimit", "completions", "parallelism", "completionMode", "suspend")} == {
        "backoffLimit": 6,
        "completions": 1,
        "parallelism": 1,
        "completionMode": "NonIndexed",
        "suspend": False,
    }
    assert spec["podReplacementPolicy"] == "TerminatingOrFailed" and "manualSelector" not in spec
    _assert_pod_spec_defaults(spec["template"]["spec"], restart="Never")
    path = "jsonpath={.spec.selector.matchLabels.batch\\.kubernetes\\.io/controller-uid}"
    assert kubectl("get", "job", "migrate", "-n", namespace, "-o", path).stdout == uid

    # Values the client set are kept; parallelism alone leaves completions unset; a manual selector is not touched.
    batch.create_namespaced_job(
        namespace,
        {
            "metadata": {"name": "manual", "labels": {"team": "a"}},
            "spec": {
                "manualSelector": True,
                "selector": {"matchLabels": {"app": "manual"}},
                "parallelism": 3,
                "backoffLimit": 2,
                "suspend": True,
                "podReplacementPolicy": "Failed",
                "template": _template("OnFailure", {"app": "manual"}),
            },
        },
    )
    spec = _get(kubectl, namespace, "job/manual")["spec"]
    assert spec["selector"] == {"matchLabels": {"app": "manual"}}
    assert spec["template"]["metadata"]["labels"] == {"app": "manual"}
    assert (spec["parallelism"], spec["backoffLimit"], spec["suspend"], spec["podReplacementPolicy"]) == (
        3,
        2,
        True,
        "Failed",
    )
    assert "completions" not in spec
    assert _get(kubectl, namespace, "job/manual")["metadata"]["labels"] == {"team": "a"}

    # The selector is immutable; a Job's pods must run to completion; a generated selector must name this Job.
    with pytest.raises(ApiException) as refused:
        batch.patch_namespaced_job("migrate", namespace, {"spec": {"selector": {"matchLabels": {UID_LABEL: "x"}}}})
    assert refused.value.status == 422 and "spec.selector" in refused.value.body and "immutable" in refused.value.body
    with pytest.raises(ApiException) as refused:
        batch.create_namespaced_job(namespace, {"metadata": {"name": "forever"}, "spec": {"template": _template()}})
    assert refused.value.status == 422
    assert 'spec.template.spec.restartPolicy: Unsupported value: \\"Always\\"' in refused.value.body
    with pytest.raises(ApiException) as refused:
        batch.create_namespaced_job(
            namespace,
            {
                "metadata": {"name": "foreign"},
                "spec": {"selector": {"matchLabels": {UID_LABEL: "other"}}, "template": _template("Never")},
            },
        )
    assert refused.value.status == 422 and UID_LABEL in refused.value.body


_CONTAINERS = [{"name": "c", "image": "i"}]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/apis/batch/v1/namespaces/{ns}/jobs", {"spec": {"selector": "x", "template": {"spec": {}}}}),
        ("/apis/batch/v1/namespaces/{ns}/jobs", {"spec": {"selector": {"matchLabels": "x"}, "template": {}}}),
        ("/apis/batch/v1/namespaces/{ns}/jobs", {"spec": {"template": {"metadata": "x"}}}),
        ("/apis/apps/v1/namespaces/{ns}/statefulsets", {"spec": {"updateStrategy": "x", "template": 5}}),
        ("/apis/apps/v1/namespaces/{ns}/daemonsets", {"spec": {"updateStrategy": {"rollingUpdate": []}}}),
        ("/api/v1/namespaces/{ns}/services", {"spec": {"ports": 5, "sessionAffinityConfig": 1}}),
        ("/api/v1/namespaces/{ns}/pods", {"spec": {"containers": [{**_CONTAINERS[0], "ports": 5, "resources": 1}]}}),
        ("/api/v1/namespaces/{ns}/pods", {"spec": {"containers": _CONTAINERS, "volumes": [{"secret": 3}]}}),
    ],
)
def test_malformed_workloads_are_refused_not_defaulted_into_a_500(
    http: httpx.Client, namespace: str, path: str, body: dict[str, Any]
) -> None:
    answer = http.post(path.format(ns=namespace), json={"metadata": {"name": "bad"}, **body})
    # Refused (400/422), or stored as sent where this server has no rule for the field: never a 500.
    assert answer.status_code in (201, 400, 422), answer.text


def test_statefulset_and_daemonset_defaults(kube: Any, kubectl: Callable[..., Any], namespace: str) -> None:
    apps = k8s.AppsV1Api(kube)
    labels = {"app": "db"}
    apps.create_namespaced_stateful_set(
        namespace,
        {
            "metadata": {"name": "db"},
            "spec": {
                "serviceName": "db",
                "selector": {"matchLabels": labels},
                "template": _template(labels=labels),
                "volumeClaimTemplates": [
                    {
                        "metadata": {"name": "data"},
                        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
                    }
                ],
            },
        },
    )
    spec = _get(kubectl, namespace, "sts/db")["spec"]
    assert (spec["replicas"], spec["podManagementPolicy"], spec["revisionHistoryLimit"]) == (1, "OrderedReady", 10)
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    claim = spec["volumeClaimTemplates"][0]
    assert claim["spec"]["volumeMode"] == "Filesystem" and claim["status"] == {"phase": "Pending"}
    assert "minReadySeconds" not in spec  # kube sets no default for it
    _assert_pod_spec_defaults(spec["template"]["spec"])

    apps.create_namespaced_stateful_set(
        namespace,
        {
            "metadata": {"name": "kept"},
            "spec": {
                "serviceName": "kept",
                "replicas": 3,
                "podManagementPolicy": "Parallel",
                "updateStrategy": {"type": "OnDelete"},
                "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete"},
                "selector": {"matchLabels": labels},
                "template": _template(labels=labels),
            },
        },
    )
    spec = _get(kubectl, namespace, "sts/kept")["spec"]
    assert (spec["replicas"], spec["podManagementPolicy"], spec["updateStrategy"]) == (
        3,
        "Parallel",
        {"type": "OnDelete"},
    )
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Retain"}

    manifest = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": _template(labels={"app": "agent"})},
    }
    kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
    spec = _get(kubectl, namespace, "ds/agent")["spec"]
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    assert spec["revisionHistoryLimit"] == 10
    _assert_pod_spec_defaults(spec["template"]["spec"])
    # Defaulting is idempotent: applying the same manifest again changes nothing.
    again = kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
    assert "daemonset.apps/agent unchanged" in again.stdout, again.stdout
    assert _get(kubectl, namespace, "ds/agent")["metadata"]["generation"] == 1


def test_every_pod_spec_gets_the_pod_defaults(kube: Any, kubectl: Callable[..., Any], namespace: str) -> None:
    labels = {"app": "w"}
    workload = {"selector": {"matchLabels": labels}, "template": _template(labels=labels)}
    manifests = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w"}, "spec": workload},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "w"}, "spec": workload},
        {
            "apiVersion": "v1",
            "kind": "ReplicationController",
            "metadata": {"name": "w"},
            "spec": {"template": _template(labels=labels)},
        },
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "w"}, "template": _template()},
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "w"},
            "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": _template("Never")}}},
        },
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w"}, "spec": _template()["spec"]},
    ]
    kubectl("apply", "-n", namespace, "-f", "-", input="---\n".join(yaml.safe_dump(m) for m in manifests))
    found = {
        item["kind"]: item
        for item in _get(kubectl, namespace, "deploy,rs,rc,podtemplates,cronjobs,pods")["items"]
        if item["metadata"]["name"] == "w"
    }
    _assert_pod_spec_defaults(found["Deployment"]["spec"]["template"]["spec"])
    assert found["Deployment"]["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"},
    }
    _assert_pod_spec_defaults(found["ReplicaSet"]["spec"]["template"]["spec"])
    rc = found["ReplicationController"]
    _assert_pod_spec_defaults(rc["spec"]["template"]["spec"])
    assert rc["spec"]["selector"] == labels and rc["metadata"]["labels"] == labels and rc["spec"]["replicas"] == 1
    _assert_pod_spec_defaults(found["PodTemplate"]["template"]["spec"])
    job_spec = found["CronJob"]["spec"]["jobTemplate"]["spec"]
    _assert_pod_spec_defaults(job_spec["template"]["spec"], restart="Never")
    assert (job_spec["backoffLimit"], job_spec["completionMode"]) == (6, "NonIndexed")
    assert "selector" not in job_spec  # the CronJob controller's Jobs get theirs when created
    pod = found["Pod"]
    _assert_pod_spec_defaults(pod["spec"])
    assert pod["spec"]["enableServiceLinks"] is True and pod["status"]["phase"] == "Pending"

    # What the client set is kept (the official client, a pod).
    kept = k8s.CoreV1Api(kube).create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "kept"},
            "spec": {
                "restartPolicy": "OnFailure",
                "dnsPolicy": "Default",
                "terminationGracePeriodSeconds": 5,
                "containers": [
                    {
                        "name": "c",
                        "image": "busybox:latest",
                        "imagePullPolicy": "Never",
                        "ports": [{"containerPort": 53, "protocol": "UDP"}],
                        "resources": {"limits": {"cpu": "1"}},
                    }
                ],
            },
        },
    )
    assert (kept.spec.restart_policy, kept.spec.dns_policy, kept.spec.termination_grace_period_seconds) == (
        "OnFailure",
        "Default",
        5,
    )
    container = kept.spec.containers[0]
    assert container.image_pull_policy == "Never" and container.ports[0].protocol == "UDP"
    assert container.resources.requests == {"cpu": "1"}  # a Pod's requests default to its limits


def test_service_defaults(kube: Any, kubectl: Callable[..., Any], namespace: str) -> None:
    core = k8s.CoreV1Api(kube)
    core.create_namespaced_service(namespace, {"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}})
    spec = _get(kubectl, namespace, "svc/web")["spec"]
    assert (spec["type"], spec["sessionAffinity"], spec["internalTrafficPolicy"]) == ("ClusterIP", "None", "Cluster")
    assert (spec["ipFamilies"], spec["ipFamilyPolicy"]) == (["IPv4"], "SingleStack")
    assert spec["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 80}]
    assert "externalTrafficPolicy" not in spec
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "lb"},
            "spec": {
                "type": "LoadBalancer",
                "sessionAffinity": "ClientIP",
                "ports": [{"port": 53, "protocol": "UDP", "targetPort": 5353}],
            },
        },
    )
    spec = _get(kubectl, namespace, "svc/lb")["spec"]
    assert (spec["externalTrafficPolicy"], spec["allocateLoadBalancerNodePorts"]) == ("Cluster", True)
    assert spec["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": 10800}}
    (port,) = spec["ports"]
    assert (port["protocol"], port["targetPort"]) == ("UDP", 5353) and 30000 <= port["nodePort"] <= 32767


def test_a_deleted_namespace_is_terminating_until_empty_and_refuses_new_content(
    kube: Any, kubectl: Callable[..., Any], namespace: str
) -> None:
    core = k8s.CoreV1Api(kube)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "held", "finalizers": [HOLD]}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "free"}})
    kubectl("delete", "namespace", namespace, "--wait=false")

    row = kubectl("get", "namespace", namespace, "--no-headers").stdout.split()
    assert row[:2] == [namespace, "Terminating"], row
    ns = core.read_namespace(namespace)
    assert ns.status.phase == "Terminating" and ns.metadata.deletion_timestamp is not None
    # The content without finalizers goes; the held ConfigMap stays (being deleted).
    wait_for(lambda: [c.metadata.name for c in core.list_namespaced_config_map(namespace).items] == ["held"])
    assert core.read_namespaced_config_map("held", namespace).metadata.deletion_timestamp is not None
    # The namespace says why it stays, with kube's namespace-controller conditions.
    wanted = {
        "NamespaceContentRemaining": ("True", "Some resources are remaining: configmaps. has 1 resource instances"),
        "NamespaceFinalizersRemaining": (
            "True",
            f"Some content in the namespace has finalizers remaining: {HOLD} in 1 resource instances",
        ),
        "NamespaceDeletionContentFailure": (
            "False",
            "All content successfully deleted, may be waiting on finalization",
        ),
    }

    def conditions() -> dict[str, tuple[str, str]]:
        found = core.read_namespace(namespace).status.conditions or []
        return {c.type: (c.status, c.message) for c in found if c.type in wanted}

    wait_for(lambda: conditions() == wanted, what="namespace conditions")

    with pytest.raises(ApiException) as refused:
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "late"}})
    status = json.loads(refused.value.body)
    assert refused.value.status == 403 and status["reason"] == "Forbidden", status
    assert status["message"] == (
        f'configmaps "late" is forbidden: unable to create new content in namespace {namespace} '
        "because it is being terminated"
    )
    assert status["details"]["causes"] == [
        {
            "reason": "NamespaceTerminating",
            "message": f"namespace {namespace} is being terminated",
            "field": "metadata.namespace",
        }
    ]
    late = json.dumps({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "late"}})
    failed = kubectl("create", "-n", namespace, "-f", "-", input=late, check=False)
    assert failed.returncode != 0
    assert f"unable to create new content in namespace {namespace} because it is being terminated" in failed.stderr

    # The finalizer's owner lets go: the ConfigMap and then the namespace leave.
    core.patch_namespaced_config_map("held", namespace, {"metadata": {"finalizers": None}})
    wait_for(lambda: kubectl("get", "namespace", namespace, check=False).returncode != 0, what="namespace gone")
