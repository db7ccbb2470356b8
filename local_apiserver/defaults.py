"""Server-side defaults of the built-in workload kinds, as kube-apiserver 1.32's defaulters set them.

Purpose
    The defaults of ``pkg/apis/{core,apps,batch}/v1/defaults.go`` (and the
    declarative ``+default`` markers of ``k8s.io/api``) that clients read back:
    every pod spec (a Pod's, and the template of a Deployment, ReplicaSet,
    StatefulSet, DaemonSet, Job, CronJob, ReplicationController or
    PodTemplate) gets ``restartPolicy``, ``dnsPolicy``, ``schedulerName``,
    ``terminationGracePeriodSeconds`` and ``securityContext``; every container
    its ``imagePullPolicy``, termination message path/policy, port protocols and
    probe timings; the workloads their strategies and history limits; Jobs the
    selector and pod labels kube's Job strategy generates from the Job's uid.
    Only fields kube sets are set; a value the client sent is always kept.

Invariants
    * Defaulting is idempotent: defaulting a defaulted object changes nothing
      (it runs again on every update, as kube defaults on every decode).
    * :func:`generate_job_selector` runs on create only (kube: the Job
      strategy's ``Validate``, after the uid is assigned), so the selector is
      the object's real uid and an update never regenerates it.

Concurrency model
    Pure functions mutating the object they are given (a copy owned by the caller).
"""

from __future__ import annotations

import copy
from typing import Any

Obj = dict[str, Any]

#: kube's ``batch.kubernetes.io/...`` labels (1.27+) and their legacy spellings, all set on a Job's pods.
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
LEGACY_JOB_UID_LABEL = "controller-uid"
LEGACY_JOB_NAME_LABEL = "job-name"

_MAX_INT32 = 2**31 - 1
_FILE_MODE = 0o644  # 420: a secret/configMap/downwardAPI/projected volume's defaultMode
_POD_SPEC = dict(
    restartPolicy="Always",
    terminationGracePeriodSeconds=30,
    dnsPolicy="ClusterFirst",
    schedulerName="default-scheduler",
    securityContext={},
)
_CLIENT_IP_TIMEOUT = 10800  # kube's DefaultClientIPServiceAffinitySeconds
_PROBE = dict(timeoutSeconds=1, periodSeconds=10, successThreshold=1, failureThreshold=3)
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


def _dict(parent: Any, key: str) -> Obj | None:
    """``parent[key]`` if both are dicts, else None."""
    if not isinstance(parent, dict):
        return None
    value = parent.get(key)
    return value if isinstance(value, dict) else None


def _list(parent: Any, key: str) -> list[Any]:
    """``parent[key]`` if it is a list (else empty: validation reports a wrong type, defaulting skips it)."""
    value = parent.get(key) if isinstance(parent, dict) else None
    return value if isinstance(value, list) else []


def _child(parent: Obj | None, key: str) -> Obj | None:
    """``parent[key]``, created empty if absent; None if ``parent`` is None or the value is not an object."""
    if parent is None:
        return None
    if parent.get(key) is None:
        parent[key] = {}
    value = parent[key]
    return value if isinstance(value, dict) else None


def _setdefaults(target: Obj, defaults: dict[str, Any]) -> None:
    for key, value in defaults.items():
        if target.get(key) is None:
            target[key] = copy.deepcopy(value)


def image_pull_policy(image: Any) -> str:
    """kube's default ``imagePullPolicy``: ``Always`` for a ``:latest`` or missing tag, else ``IfNotPresent``."""
    name, _, digest = str(image or "").partition("@")
    if not name:
        return "IfNotPresent"  # kube: an unparsable image has no tag (validation refuses it anyway)
    last = name.rsplit("/", 1)[-1]  # not the registry's host:port
    tag = last.split(":", 1)[1] if ":" in last else ("" if digest else "latest")  # by digest alone: no tag
    return "Always" if tag == "latest" else "IfNotPresent"


def _container(container: Obj) -> None:
    if not container.get("imagePullPolicy"):
        container["imagePullPolicy"] = image_pull_policy(container.get("image"))
    _setdefaults(container, dict(terminationMessagePath="/dev/termination-log", terminationMessagePolicy="File"))
    for port in _list(container, "ports"):
        if isinstance(port, dict) and not port.get("protocol"):
            port["protocol"] = "TCP"
    for probe_key in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = _dict(container, probe_key)
        if probe is None:
            continue
        _setdefaults(probe, _PROBE)
        http_get = _dict(probe, "httpGet")
        if http_get is not None:
            _setdefaults(http_get, dict(path="/", scheme="HTTP"))


def _volume(volume: Obj) -> None:
    for source in ("secret", "configMap", "downwardAPI", "projected"):
        found = _dict(volume, source)
        if found is not None and found.get("defaultMode") is None:
            found["defaultMode"] = _FILE_MODE


def pod_spec_defaults(pod_spec: Any) -> None:
    """kube's ``SetDefaults_PodSpec`` and the per-container/volume defaults of any pod spec."""
    if not isinstance(pod_spec, dict):
        return
    _setdefaults(pod_spec, _POD_SPEC)
    for key in _CONTAINER_LISTS:
        for container in _list(pod_spec, key):
            if isinstance(container, dict):
                _container(container)
    for volume in _list(pod_spec, "volumes"):
        if isinstance(volume, dict):
            _volume(volume)


def pod_defaults(pod: Obj) -> None:
    """A Pod's: the pod spec defaults plus ``SetDefaults_Pod`` (service links; requests default to limits)."""
    pod_spec = _dict(pod, "spec")
    if pod_spec is None:
        return
    pod_spec_defaults(pod_spec)
    if pod_spec.get("enableServiceLinks") is None:
        pod_spec["enableServiceLinks"] = True
    for key in ("initContainers", "containers"):
        for container in _list(pod_spec, key):
            resources = _dict(container, "resources")
            limits = _dict(resources, "limits")
            if resources is None or not limits:
                continue
            requests = _child(resources, "requests")
            if requests is not None:
                for name, value in limits.items():
                    requests.setdefault(name, value)


def _template_spec(body_spec: Any) -> Any:
    return (_dict(body_spec, "template") or {}).get("spec")


def _rolling(body_spec: Obj, key: str, rolling_defaults: dict[str, Any]) -> None:
    """A Deployment's ``strategy`` / a DaemonSet's ``updateStrategy``: RollingUpdate, and its missing parameters."""
    strategy = _child(body_spec, key)
    if strategy is None:
        return  # not an object: left for validation
    if not strategy.get("type"):
        strategy["type"] = "RollingUpdate"
    if strategy["type"] == "RollingUpdate":
        rolling = _child(strategy, "rollingUpdate")
        if rolling is not None:
            _setdefaults(rolling, rolling_defaults)


def _deployment(body_spec: Obj) -> None:
    _setdefaults(body_spec, dict(replicas=1, revisionHistoryLimit=10, progressDeadlineSeconds=600))
    _rolling(body_spec, "strategy", dict(maxUnavailable="25%", maxSurge="25%"))


def _daemonset(body_spec: Obj) -> None:
    _setdefaults(body_spec, dict(revisionHistoryLimit=10))
    _rolling(body_spec, "updateStrategy", dict(maxUnavailable=1, maxSurge=0))


def _statefulset(body_spec: Obj) -> None:
    _setdefaults(body_spec, dict(replicas=1, podManagementPolicy="OrderedReady", revisionHistoryLimit=10))
    strategy = _child(body_spec, "updateStrategy")
    if strategy is not None:
        if not strategy.get("type"):
            strategy["type"] = "RollingUpdate"
            _child(strategy, "rollingUpdate")
        # The partition only when rollingUpdate is there (an explicit RollingUpdate type without it stays so).
        rolling = _dict(strategy, "rollingUpdate")
        if strategy["type"] == "RollingUpdate" and rolling is not None and rolling.get("partition") is None:
            rolling["partition"] = 0
    for claim in _list(body_spec, "volumeClaimTemplates"):
        if isinstance(claim, dict):  # PersistentVolumeClaims: kube defaults them as it does a stored one
            claim_spec = _dict(claim, "spec")
            if claim_spec is not None:
                claim_spec.setdefault("volumeMode", "Filesystem")
            status = _child(claim, "status")
            if status is not None:
                status.setdefault("phase", "Pending")
    retention = _child(body_spec, "persistentVolumeClaimRetentionPolicy")
    if retention is not None:
        _setdefaults(retention, dict(whenDeleted="Retain", whenScaled="Retain"))


def job_spec_defaults(body_spec: Obj) -> None:
    """kube's ``SetDefaults_Job`` on a Job spec (also a CronJob's ``jobTemplate.spec``), with 1.32's feature gates."""
    if body_spec.get("completions") is None and body_spec.get("parallelism") is None:
        body_spec["completions"] = 1
    _setdefaults(body_spec, dict(parallelism=1, completionMode="NonIndexed", suspend=False))
    if body_spec.get("backoffLimit") is None:
        # JobBackoffLimitPerIndex (beta, on in 1.32): a per-index limit lifts the global one.
        body_spec["backoffLimit"] = _MAX_INT32 if body_spec.get("backoffLimitPerIndex") is not None else 6
    failure_policy = _dict(body_spec, "podFailurePolicy")
    for rule in _list(failure_policy, "rules"):
        for pattern in _list(rule, "onPodConditions"):
            if isinstance(pattern, dict) and not pattern.get("status"):
                pattern["status"] = "True"
    if body_spec.get("podReplacementPolicy") is None:
        # JobPodReplacementPolicy (beta, on in 1.32).
        body_spec["podReplacementPolicy"] = "Failed" if failure_policy is not None else "TerminatingOrFailed"
    pod_spec_defaults(_template_spec(body_spec))


def _job(obj: Obj, body_spec: Obj) -> None:
    job_spec_defaults(body_spec)
    meta = obj.setdefault("metadata", {})
    labels = _dict(_dict(_dict(body_spec, "template"), "metadata"), "labels")
    if labels and not meta.get("labels"):
        meta["labels"] = dict(labels)  # kube: a Job without labels takes its template's


def _replication_controller(obj: Obj, body_spec: Obj) -> None:
    body_spec.setdefault("replicas", 1)
    template = _dict(body_spec, "template")
    labels = (_dict(template, "metadata") or {}).get("labels")
    if isinstance(labels, dict) and labels:
        if not body_spec.get("selector"):
            body_spec["selector"] = dict(labels)
        meta = obj.setdefault("metadata", {})
        if not meta.get("labels"):
            meta["labels"] = dict(labels)
    pod_spec_defaults((template or {}).get("spec"))


def workload_defaults(resource: str, obj: Obj) -> bool:
    """Default a built-in workload or pod ``obj`` of ``resource``; False if ``resource`` is not one of them."""
    body_spec = _dict(obj, "spec")
    if resource == "pods":
        pod_defaults(obj)
    elif resource == "podtemplates":
        pod_spec_defaults((_dict(obj, "template") or {}).get("spec"))
    elif body_spec is None:
        return resource in _WORKLOADS
    elif resource == "replicasets":
        body_spec.setdefault("replicas", 1)
        pod_spec_defaults(_template_spec(body_spec))
    elif resource == "deployments":
        _deployment(body_spec)
        pod_spec_defaults(_template_spec(body_spec))
    elif resource == "statefulsets":
        _statefulset(body_spec)
        pod_spec_defaults(_template_spec(body_spec))
    elif resource == "daemonsets":
        _daemonset(body_spec)
        pod_spec_defaults(_template_spec(body_spec))
    elif resource == "jobs":
        _job(obj, body_spec)
    elif resource == "cronjobs":
        _setdefaults(
            body_spec,
            dict(suspend=False, concurrencyPolicy="Allow", successfulJobsHistoryLimit=3, failedJobsHistoryLimit=1),
        )
        job_spec = _dict(_dict(body_spec, "jobTemplate"), "spec")
        if job_spec is not None:
            job_spec_defaults(job_spec)
    elif resource == "replicationcontrollers":
        _replication_controller(obj, body_spec)
    else:
        return False
    return True


_WORKLOADS = frozenset(
    ("replicasets", "deployments", "statefulsets", "daemonsets", "jobs", "cronjobs", "replicationcontrollers")
)


def service_defaults(obj: Obj) -> None:
    """kube's ``SetDefaults_Service`` (the cluster IP and IP families are the allocator's: local_apiserver.services)."""
    body_spec = _dict(obj, "spec")
    if body_spec is None:
        return
    if not body_spec.get("type"):
        body_spec["type"] = "ClusterIP"
    svc_type = body_spec["type"]
    if not body_spec.get("sessionAffinity"):
        body_spec["sessionAffinity"] = "None"
    if body_spec["sessionAffinity"] == "None":
        body_spec.pop("sessionAffinityConfig", None)
    elif body_spec["sessionAffinity"] == "ClientIP":
        client_ip = _dict(_dict(body_spec, "sessionAffinityConfig"), "clientIP")
        if client_ip is None or client_ip.get("timeoutSeconds") is None:
            body_spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": _CLIENT_IP_TIMEOUT}}
    for port in _list(body_spec, "ports"):
        if not isinstance(port, dict):
            continue
        if not port.get("protocol"):
            port["protocol"] = "TCP"
        if port.get("targetPort") in (None, 0, "") and port.get("port") is not None:
            port["targetPort"] = port["port"]
    external = svc_type in ("NodePort", "LoadBalancer") or (svc_type == "ClusterIP" and body_spec.get("externalIPs"))
    if external and not body_spec.get("externalTrafficPolicy"):
        body_spec["externalTrafficPolicy"] = "Cluster"
    if body_spec.get("internalTrafficPolicy") is None and svc_type in ("ClusterIP", "NodePort", "LoadBalancer"):
        body_spec["internalTrafficPolicy"] = "Cluster"
    if svc_type == "LoadBalancer" and body_spec.get("allocateLoadBalancerNodePorts") is None:
        body_spec["allocateLoadBalancerNodePorts"] = True


def generate_job_selector(obj: Obj) -> None:
    """kube's Job ``generateSelector`` on create, unless ``spec.manualSelector`` is true.

    The pod template gets the ``batch.kubernetes.io/controller-uid`` and
    ``batch.kubernetes.io/job-name`` labels and their legacy spellings (each
    only if absent: a conflicting value is refused by validation), and the
    selector matches ``batch.kubernetes.io/controller-uid`` = the Job's uid.
    """
    body_spec = _dict(obj, "spec")
    meta = _dict(obj, "metadata") or {}
    if body_spec is None or body_spec.get("manualSelector") is True:
        return
    uid = str(meta.get("uid") or "")
    name = str(meta.get("name") or "")
    template = body_spec.get("template")
    selector = body_spec.get("selector")
    if not isinstance(template, dict) or not isinstance(selector, dict | None):
        return  # validation refuses a missing template or a malformed selector
    labels = _child(_child(template, "metadata"), "labels")
    match = _child(_child(body_spec, "selector"), "matchLabels")
    if labels is None or match is None:
        return  # malformed template metadata or matchLabels: left as sent for validation to refuse
    if labels and not meta.get("labels"):
        # kube's SetDefaults_Job (on decode, before the strategy): a Job without labels takes its template's.
        obj.setdefault("metadata", {})["labels"] = dict(labels)
    for key, value in (
        (LEGACY_JOB_NAME_LABEL, name),
        (JOB_NAME_LABEL, name),
        (LEGACY_JOB_UID_LABEL, uid),
        (JOB_UID_LABEL, uid),
    ):
        labels.setdefault(key, value)
    match.setdefault(JOB_UID_LABEL, uid)


__all__ = [
    "JOB_NAME_LABEL",
    "JOB_UID_LABEL",
    "LEGACY_JOB_NAME_LABEL",
    "LEGACY_JOB_UID_LABEL",
    "generate_job_selector",
    "image_pull_policy",
    "job_spec_defaults",
    "pod_defaults",
    "pod_spec_defaults",
    "service_defaults",
    "workload_defaults",
]
