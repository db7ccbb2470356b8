"""Validation and defaulting of objects sent by clients.

Purpose
    Check what kube-apiserver checks before an object reaches storage, to the
    extent this server knows the schema: the body is a JSON object of the
    endpoint's kind/apiVersion, metadata has the right types, names are
    DNS subdomains (labels for namespaces), labels and annotations are valid,
    and a few per-kind rules (pods have containers, workloads have a selector
    matching their template, replicas are non-negative integers, Jobs run to
    completion and select their own uid). Defaults what kube-apiserver's
    defaulters set (pods and workloads: :mod:`local_apiserver.defaults`).

Invariants
    * Type errors in the body are 400 BadRequest (kube: decode errors);
      semantic errors are 422 Invalid with one cause per field.
    * Validation never mutates its input; ``apply_defaults`` mutates the
      object it is given (a fresh copy owned by the caller).

Concurrency model
    Pure functions.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
from typing import Any

from local_apiserver.conversion import METRICS_ANNOTATION, cpu_utilization_metric
from local_apiserver.crd import crd_defaults, crd_problems
from local_apiserver.defaults import JOB_UID_LABEL, generate_job_selector, service_defaults, workload_defaults
from local_apiserver.errors import bad_request, invalid
from local_apiserver.resources import CRD_RESOURCE, ResourceSpec
from local_apiserver.schema import apply_schema_defaults, schema_problems
from rangeshard.core.objpath import get_path
from rangeshard.core.selectors import LabelSelector, Requirement, label_key_problem, label_value_problem

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

_STRING_MAPS = ("labels", "annotations")
_HPA_DEFAULT_CPU = 80  # kube's autoscaling.DefaultCPUUtilization
_WORKLOAD_GROUPS = ("", "apps", "batch")
# The spec fields kube-apiserver's defaulters set (those controllers and printers read), per built-in resource
# without a function of its own (pods and workloads: local_apiserver.defaults).
_SPEC_DEFAULTS: dict[str, dict[str, Any]] = {
    # Filesystem volumes; a PV is retained by default.
    "persistentvolumeclaims": dict(volumeMode="Filesystem"),
    "persistentvolumes": dict(volumeMode="Filesystem", persistentVolumeReclaimPolicy="Retain"),
}


def name_problem(spec: ResourceSpec, name: str) -> str | None:
    """Why ``name`` is not a valid object name for ``spec`` (None if valid)."""
    if spec.resource == "namespaces":
        if len(name) > 63 or not _DNS_LABEL.match(name):
            return (
                f"a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                f"start and end with an alphanumeric character (at most 63 characters), got {name!r}"
            )
        return None
    if spec.group == "rbac.authorization.k8s.io":  # kube's ValidateRBACName: any path segment (system:...)
        if name in (".", "..") or "/" in name or "%" in name:
            return f"may not be '.' or '..' and may not contain '/' or '%', got {name!r}"
        return None
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        return (
            f"a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
            f"must start and end with an alphanumeric character (at most 253 characters), got {name!r}"
        )
    return None


def check_body_shape(spec: ResourceSpec, body: Any) -> dict[str, Any]:
    """400 unless ``body`` is a JSON object of this endpoint's kind/apiVersion with typed metadata."""
    if not isinstance(body, dict):
        raise bad_request(f"the body of a {spec.kind} request must be a JSON object, got {type(body).__name__}")
    kind = body.get("kind")
    api_version = body.get("apiVersion")
    if kind is not None and kind != spec.kind:
        raise bad_request(
            f"the kind in the data ({kind!r}) does not match the kind of the endpoint ({spec.kind!r}, "
            f"apiVersion {spec.api_version})"
        )
    if api_version is not None and api_version != spec.api_version:
        raise bad_request(
            f"the API version in the data ({api_version}) does not match the expected API version ({spec.api_version})"
        )
    meta = {} if body.get("metadata") is None else body["metadata"]
    if not isinstance(meta, dict):
        raise bad_request("metadata must be a JSON object")
    for key in ("name", "generateName", "namespace", "resourceVersion", "uid"):
        if key in meta and meta[key] is not None and not isinstance(meta[key], str):
            raise bad_request(f"metadata.{key} must be a string, got {type(meta[key]).__name__}")
    for key in _STRING_MAPS:
        value = meta.get(key)
        if value is None:
            continue
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise bad_request(f"metadata.{key} must be a map of strings")
    for key in ("spec", "status"):
        if body.get(key) is not None and not isinstance(body[key], dict):
            raise bad_request(f"{key} must be a JSON object, got {type(body[key]).__name__}")
    for key, item, what in (("finalizers", str, "strings"), ("ownerReferences", dict, "objects")):
        value = meta.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, item) for v in value)):
            raise bad_request(f"metadata.{key} must be a list of {what}")
    return body


def validate_object(spec: ResourceSpec, obj: dict[str, Any]) -> None:
    """422 Invalid listing every semantic problem of ``obj`` (already shape-checked)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    causes: list[tuple[str, str]] = []
    if not name:
        causes.append(("metadata.name", "Required value: name or generateName is required"))
    else:
        problem = name_problem(spec, name)
        if problem:
            causes.append(("metadata.name", f"Invalid value: {name!r}: {problem}"))
    for key in _STRING_MAPS:
        for k, v in (meta.get(key) or {}).items():
            problem = label_key_problem(k)
            if problem:
                causes.append((f"metadata.{key}", f"Invalid value: {k!r}: {problem}"))
            if key == "labels":
                problem = label_value_problem(v)
                if problem:
                    causes.append(("metadata.labels", f"Invalid value: {v!r}: {problem}"))
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for req in ("apiVersion", "kind", "name", "uid"):
            if not isinstance(ref.get(req), str) or not ref.get(req):
                causes.append((f"metadata.ownerReferences[{i}].{req}", "Required value"))
    controllers = [r for r in meta.get("ownerReferences") or [] if r.get("controller") is True]
    if len(controllers) > 1:
        causes.append(("metadata.ownerReferences", "Invalid value: only one reference can have Controller set to true"))
    causes.extend(_kind_rules(spec, obj))
    if isinstance(spec.schema, dict):
        # Defaults apply before validation (kube defaults on decode): check a defaulted copy.
        defaulted = copy.deepcopy(obj)
        apply_schema_defaults(spec.schema, defaulted)
        causes.extend(schema_problems(spec.schema, defaulted))
    if causes:
        raise invalid(spec.kind, name, causes)


def _containers(pod_spec: Any, path: str) -> list[tuple[str, str]]:
    containers = pod_spec.get("containers") if isinstance(pod_spec, dict) else None
    if not isinstance(containers, list) or not containers:
        return [(f"{path}.containers", "Required value")]
    causes: list[tuple[str, str]] = []
    names: set[str] = set()
    for i, c in enumerate(containers):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c.get("name"):
            causes.append((f"{path}.containers[{i}].name", "Required value"))
            continue
        if c["name"] in names:
            causes.append((f"{path}.containers[{i}].name", f"Duplicate value: {c['name']!r}"))
        names.add(c["name"])
        if not isinstance(c.get("image"), str) or not c.get("image"):
            causes.append((f"{path}.containers[{i}].image", "Required value"))
    return causes


_OPERATORS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}


def selector_requirements(
    selector: Any, path: str = "spec.selector"
) -> tuple[list[Requirement], list[tuple[str, str]]]:
    """A ``metav1.LabelSelector`` as requirements, plus the problems found (field, message)."""
    if not isinstance(selector, dict):
        return [], [(path, "Required value")]
    reqs: list[Requirement] = []
    causes: list[tuple[str, str]] = []
    match = selector.get("matchLabels") or {}
    if not isinstance(match, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in match.items()):
        causes.append((f"{path}.matchLabels", "Invalid value: must be a map of strings"))
    else:
        reqs.extend(Requirement(k, "=", (v,)) for k, v in sorted(match.items()))
    exprs = selector.get("matchExpressions") or []
    if not isinstance(exprs, list):
        causes.append((f"{path}.matchExpressions", "Invalid value: must be a list"))
        exprs = []
    for i, expr in enumerate(exprs):
        where = f"{path}.matchExpressions[{i}]"
        if not isinstance(expr, dict) or not isinstance(expr.get("key"), str) or not expr.get("key"):
            causes.append((f"{where}.key", "Required value"))
            continue
        op = expr.get("operator")
        values = expr.get("values") or []
        if op not in _OPERATORS:
            causes.append((f"{where}.operator", f"Unsupported value: {op!r}: In, NotIn, Exists, DoesNotExist"))
        elif not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            causes.append((f"{where}.values", "Invalid value: must be a list of strings"))
        elif op in ("In", "NotIn") and not values:
            causes.append((f"{where}.values", "Required value: must be specified for In and NotIn"))
        elif op in ("Exists", "DoesNotExist") and values:
            causes.append((f"{where}.values", "Forbidden: may not be specified for Exists and DoesNotExist"))
        else:
            reqs.append(Requirement(expr["key"], _OPERATORS[op], tuple(values)))
    if not causes and not reqs:
        causes.append((path, "Invalid value: empty selector is invalid for deployment and replicaset"))
    return reqs, causes


def _kind_rules(spec: ResourceSpec, obj: dict[str, Any]) -> list[tuple[str, str]]:
    causes: list[tuple[str, str]] = []
    body_spec = obj.get("spec")
    if spec.crd is not None:
        return causes  # custom resources: their openAPIV3Schema only
    if spec.resource == CRD_RESOURCE:
        return crd_problems(obj)
    if spec.resource == "pods":
        causes.extend(_containers(body_spec, "spec"))
    elif spec.resource in ("replicasets", "deployments"):
        if not isinstance(body_spec, dict):
            return [("spec", "Required value")]
        replicas = body_spec.get("replicas")
        if replicas is not None and (not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0):
            causes.append(("spec.replicas", f"Invalid value: {replicas!r}: must be a non-negative integer"))
        template = body_spec.get("template")
        if not isinstance(template, dict):
            return [*causes, ("spec.template", "Required value")]
        tmeta = template.get("metadata") or {}
        labels = tmeta.get("labels") if isinstance(tmeta, dict) else None
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            causes.append(("spec.template.metadata.labels", "Invalid value: must be a map of strings"))
            labels = {}
        _check_selector(body_spec.get("selector"), labels, causes)
        causes.extend(_containers(template.get("spec"), "spec.template.spec"))
    elif spec.resource == "jobs" and spec.group == "batch":
        causes.extend(_job_rules(obj))
    elif spec.resource == "cronjobs" and spec.group == "batch":
        pod_spec = get_path(body_spec, "jobTemplate.spec.template.spec")
        causes.extend(_job_restart_policy(pod_spec, "spec.jobTemplate.spec.template.spec"))
    elif spec.resource == "services" and spec.group == "":
        ports = body_spec.get("ports") if isinstance(body_spec, dict) else None
        if ports is not None and (not isinstance(ports, list) or not all(isinstance(p, dict) for p in ports)):
            causes.append(("spec.ports", "Invalid value: must be a list of ServicePort objects"))
    elif spec.resource == "configmaps":
        for key in ("data", "binaryData"):
            data = obj.get(key)
            if data is not None and (not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values())):
                causes.append((key, "Invalid value: must be a map of strings"))
    return causes


def _check_selector(selector: Any, labels: dict[str, Any], causes: list[tuple[str, str]]) -> bool:
    """Add ``spec.selector``'s problems, or its mismatch with the template's ``labels``, to ``causes``; parsed?"""
    reqs, problems = selector_requirements(selector)
    causes.extend(problems)
    if not problems and not LabelSelector(tuple(reqs)).matches(labels):
        causes.append(("spec.template.metadata.labels", "Invalid value: `selector` does not match template `labels`"))
    return not problems


def _job_restart_policy(pod_spec: Any, path: str) -> list[tuple[str, str]]:
    """A Job's pods run to completion: kube refuses ``restartPolicy: Always`` (its default) in a Job's template."""
    if not isinstance(pod_spec, dict):
        return []
    policy = pod_spec.get("restartPolicy") or "Always"
    if policy in ("OnFailure", "Never"):
        return []
    return [(f"{path}.restartPolicy", f'Unsupported value: "{policy}": supported values: "OnFailure", "Never"')]


def _job_rules(obj: dict[str, Any]) -> list[tuple[str, str]]:
    """kube's ValidateJob, in part: a template with containers, a run-to-completion policy, a matching selector.

    Unless ``spec.manualSelector`` is true, the selector and the template must
    carry the generated ``batch.kubernetes.io/controller-uid`` of this Job (see
    :func:`local_apiserver.defaults.generate_job_selector`).
    """
    body_spec = obj.get("spec")
    if not isinstance(body_spec, dict):
        return [("spec", "Required value")]
    template = body_spec.get("template")
    if not isinstance(template, dict):
        return [("spec.template", "Required value")]
    causes = _containers(template.get("spec"), "spec.template.spec")
    causes.extend(_job_restart_policy(template.get("spec"), "spec.template.spec"))
    tmeta = template.get("metadata") or {}
    labels = tmeta.get("labels") if isinstance(tmeta, dict) else None
    labels = labels if isinstance(labels, dict) else {}
    selector = body_spec.get("selector")
    if selector is None:
        return [*causes, ("spec.selector", "Required value")]
    parsed = _check_selector(selector, labels, causes)
    uid = str((obj.get("metadata") or {}).get("uid") or "")
    if body_spec.get("manualSelector") is not True and uid and parsed:
        for where, values in (
            ("spec.selector.matchLabels", get_path(selector, "matchLabels")),
            ("spec.template.metadata.labels", labels),
        ):
            found = values.get(JOB_UID_LABEL) if isinstance(values, dict) else None
            if found != uid:
                why = f"Invalid value: {found!r}: must be '{uid}' (spec.manualSelector is not true)"
                causes.append((f"{where}[{JOB_UID_LABEL}]", why))
    return causes


def prepare_for_create(spec: ResourceSpec, obj: dict[str, Any]) -> None:
    """What kube's create strategies do once the uid is assigned, before validation: a Job's generated selector."""
    if spec.resource == "jobs" and spec.group == "batch":
        generate_job_selector(obj)


def check_job_update(current: dict[str, Any], new: dict[str, Any]) -> None:
    """kube's Job update rule this server checks: ``spec.selector`` never changes (422)."""
    old_selector = (current.get("spec") or {}).get("selector")
    new_spec = new.get("spec")
    selector = new_spec.get("selector") if isinstance(new_spec, dict) else None
    if selector != old_selector:
        name = str((current.get("metadata") or {}).get("name") or "")
        raise invalid("Job", name, [("spec.selector", f"Invalid value: {json.dumps(selector)}: field is immutable")])


def check_scale_body(body: Any) -> int:
    """The ``spec.replicas`` of an ``autoscaling/v1`` Scale body (400/422 if malformed)."""
    if not isinstance(body, dict):
        raise bad_request("a Scale must be a JSON object")
    if body.get("kind") not in (None, "Scale"):
        raise bad_request(f"the kind in the data ({body.get('kind')!r}) does not match 'Scale'")
    if body.get("apiVersion") not in (None, "autoscaling/v1"):
        raise bad_request(f"the API version in the data ({body.get('apiVersion')}) does not match autoscaling/v1")
    spec = body.get("spec") or {}
    replicas = spec.get("replicas", 0) if isinstance(spec, dict) else None
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        name = str((body.get("metadata") or {}).get("name") or "")
        raise invalid(
            "Scale", name, [("spec.replicas", f"Invalid value: {replicas!r}: must be greater than or equal to 0")]
        )
    return replicas


def apply_defaults(spec: ResourceSpec, obj: dict[str, Any]) -> None:
    """Fill the defaults kube-apiserver's defaulters set for fields controllers read."""
    body_spec = obj.get("spec")
    if isinstance(spec.schema, dict):
        apply_schema_defaults(spec.schema, obj)
    elif spec.crd is not None:
        return
    elif spec.resource == CRD_RESOURCE:
        crd_defaults(obj)
    elif spec.group in _WORKLOAD_GROUPS and workload_defaults(spec.resource, obj):
        if spec.resource == "pods" and isinstance(body_spec, dict):
            status = obj.setdefault("status", {})
            if isinstance(status, dict):
                status.setdefault("phase", "Pending")
    elif spec.resource in _SPEC_DEFAULTS and isinstance(body_spec, dict):
        for key, value in _SPEC_DEFAULTS[spec.resource].items():
            body_spec.setdefault(key, copy.deepcopy(value))
        _default_phase(obj, "Pending")  # PVs and PVCs: until bound
    elif spec.resource == "services" and spec.group == "":
        service_defaults(obj)
    elif spec.resource == "secrets" and spec.group == "":
        _secret_defaults(obj)
    elif spec.resource == "horizontalpodautoscalers" and isinstance(body_spec, dict):
        _hpa_defaults(spec, obj, body_spec)
    elif spec.resource == "namespaces":
        meta = obj.setdefault("metadata", {})
        meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta.get("name", "")
        obj["spec"] = obj.get("spec") or {}
        _default_phase(obj, "Active")


def _default_phase(obj: dict[str, Any], phase: str) -> None:
    status = obj.get("status")
    obj["status"] = status = status if isinstance(status, dict) else {}
    status.setdefault("phase", phase)


def _hpa_defaults(spec: ResourceSpec, obj: dict[str, Any], body_spec: dict[str, Any]) -> None:
    """kube's HPA defaults: ``minReplicas`` 1; no metrics means CPU at 80 % utilization (both versions)."""
    body_spec.setdefault("minReplicas", 1)
    if spec.version == "v1":
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        if body_spec.get("targetCPUUtilizationPercentage") is None and METRICS_ANNOTATION not in annotations:
            body_spec["targetCPUUtilizationPercentage"] = _HPA_DEFAULT_CPU
    elif not body_spec.get("metrics"):
        body_spec["metrics"] = [cpu_utilization_metric(_HPA_DEFAULT_CPU)]


def _secret_defaults(obj: dict[str, Any]) -> None:
    """kube's Secret handling: ``stringData`` merged into base64 ``data`` (not stored), ``type`` defaulted.

    Invalid base64 in ``data`` is a 422 naming the key, like kube-apiserver's.
    """
    name = str((obj.get("metadata") or {}).get("name") or "")
    data = {} if obj.get("data") is None else obj["data"]
    if not isinstance(data, dict):
        raise invalid("Secret", name, [("data", f"Invalid value: {type(data).__name__}: must be a map")])
    causes: list[tuple[str, str]] = []
    for key, value in data.items():
        if not isinstance(value, str):
            causes.append((f"data[{key}]", "Invalid value: must be a base64 string"))
            continue
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            causes.append((f"data[{key}]", f"Invalid value: {value[:20]!r}: illegal base64 data"))
    string_data = obj.pop("stringData", None)
    if string_data is not None:
        if not isinstance(string_data, dict):
            causes.append(("stringData", "Invalid value: must be a map of strings"))
        else:
            for key, value in string_data.items():
                if not isinstance(value, str):
                    causes.append((f"stringData[{key}]", "Invalid value: must be a string"))
                else:
                    data[key] = base64.b64encode(value.encode()).decode()  # stringData wins over data
    if causes:
        raise invalid("Secret", name, causes)
    if data:
        obj["data"] = data
    obj.setdefault("type", "Opaque")


def check_secret_update(current: dict[str, Any], new: dict[str, Any]) -> None:
    """kube's Secret update rules: ``type`` never changes; ``immutable: true`` freezes ``data`` and itself."""
    name = str((current.get("metadata") or {}).get("name") or "")
    causes: list[tuple[str, str]] = []
    if new.get("type", current.get("type")) != current.get("type"):
        causes.append(("type", f'Invalid value: "{new.get("type")}": field is immutable'))
    if current.get("immutable") is True:
        if (new.get("data") or {}) != (current.get("data") or {}):
            causes.append(("data", "Forbidden: field is immutable when `immutable` is set"))
        if new.get("immutable") is not True:
            causes.append(("immutable", "Forbidden: field is immutable when `immutable` is set"))
    if causes:
        raise invalid("Secret", name, causes)


__all__ = [
    "apply_defaults",
    "check_body_shape",
    "check_job_update",
    "check_scale_body",
    "check_secret_update",
    "name_problem",
    "prepare_for_create",
    "validate_object",
]
