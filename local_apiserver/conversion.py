"""Conversion between a served resource's API form and its stored form (resources sharing storage).

Purpose
    kube-apiserver serves some objects under two APIs; here that is

    * Events: stored as core/v1 ``Event`` and also served as
      ``events.k8s.io/v1`` (``regarding``/``note``/``reportingController``
      instead of ``involvedObject``/``message``/``reportingComponent``);
    * HorizontalPodAutoscalers: stored as ``autoscaling/v2`` (kube's storage
      version) and also served as ``autoscaling/v1``, converted as
      kube-apiserver converts them: a Resource ``cpu`` metric with an
      ``averageUtilization`` target is ``spec.targetCPUUtilizationPercentage``
      (its current value ``status.currentCPUUtilizationPercentage``); what v1
      cannot express (other metrics, their statuses, ``behavior``, status
      conditions) travels in kube's round-trip annotations
      ``autoscaling.alpha.kubernetes.io/{metrics,current-metrics,behavior,conditions}``
      (v1 ``MetricSpec``/``MetricStatus`` JSON), so a v1 client that reads,
      changes and writes back an HPA keeps its v2-only fields.

    :func:`to_api` turns a stored object into the form of the resource it is
    read through, :func:`to_storage` an object of any served form into the
    stored form; :func:`keep_status` carries the stored status across an
    update of the main resource through another form. This is the one
    conversion path: the store (get, list, update, create) and watches call it.

Invariants
    * Resources without ``stored_as`` are returned unchanged (no copy).
    * ``to_storage(to_api(spec, stored))`` keeps every field (for HPAs: up to
      the order of ``spec.metrics``, which v1 keeps as kube does: the CPU
      target last).
    * A malformed round-trip annotation is a 400 (kube: a decoding error),
      never a 500.

Concurrency model
    Pure functions.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import orjson

from local_apiserver.errors import bad_request
from local_apiserver.resources import ResourceSpec
from rangeshard.core.events import from_events_v1, to_events_v1
from rangeshard.core.objpath import get_path as get_path  # noqa: PLC0414 (re-exported for the handlers)
from rangeshard.core.objpath import set_path as set_path  # noqa: PLC0414 (re-exported for the handlers)

Obj = dict[str, Any]

HPA_V1 = "autoscaling/v1"
HPA_V2 = "autoscaling/v2"
METRICS_ANNOTATION = "autoscaling.alpha.kubernetes.io/metrics"
CURRENT_METRICS_ANNOTATION = "autoscaling.alpha.kubernetes.io/current-metrics"
BEHAVIOR_ANNOTATION = "autoscaling.alpha.kubernetes.io/behavior"
CONDITIONS_ANNOTATION = "autoscaling.alpha.kubernetes.io/conditions"
_ROUND_TRIP = (METRICS_ANNOTATION, CURRENT_METRICS_ANNOTATION, BEHAVIOR_ANNOTATION, CONDITIONS_ANNOTATION)
_STATUS_ANNOTATIONS = (CURRENT_METRICS_ANNOTATION, CONDITIONS_ANNOTATION)

# autoscaling/v1 MetricSpec / MetricStatus fields per metric type, and where v2 keeps them:
# type -> (member, [(v1 field, v2 dotted path)]) (kube's pkg/apis/autoscaling/v1/conversion.go).
_SPEC_FIELDS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "Resource": (
        "resource",
        (
            ("name", "name"),
            ("targetAverageUtilization", "target.averageUtilization"),
            ("targetAverageValue", "target.averageValue"),
        ),
    ),
    "ContainerResource": (
        "containerResource",
        (
            ("name", "name"),
            ("container", "container"),
            ("targetAverageUtilization", "target.averageUtilization"),
            ("targetAverageValue", "target.averageValue"),
        ),
    ),
    "Pods": (
        "pods",
        (("metricName", "metric.name"), ("selector", "metric.selector"), ("targetAverageValue", "target.averageValue")),
    ),
    "Object": (
        "object",
        (
            ("target", "describedObject"),
            ("metricName", "metric.name"),
            ("selector", "metric.selector"),
            ("targetValue", "target.value"),
            ("averageValue", "target.averageValue"),
        ),
    ),
    "External": (
        "external",
        (
            ("metricName", "metric.name"),
            ("metricSelector", "metric.selector"),
            ("targetValue", "target.value"),
            ("targetAverageValue", "target.averageValue"),
        ),
    ),
}


def _status_field(v1: str, v2: str) -> tuple[str, str]:
    if not v2.startswith("target."):
        return v1, v2
    return v1.replace("target", "current"), "current." + v2.removeprefix("target.")


# MetricStatus keeps "current" where MetricSpec keeps "target" (the Object metric's `target` is its object).
_STATUS_FIELDS = {
    kind: (member, tuple(_status_field(v1, v2) for v1, v2 in fields)) for kind, (member, fields) in _SPEC_FIELDS.items()
}


def to_api(spec: ResourceSpec, obj: Obj) -> Obj:
    """The stored ``obj`` as the resource ``spec`` serves it."""
    if spec.group == "events.k8s.io":
        return to_events_v1(obj)
    if spec.stored_as and spec.api_version == HPA_V1 and obj.get("apiVersion") != HPA_V1:
        return hpa_to_v1(obj)
    return obj


def to_storage(obj: Obj) -> Obj:
    """``obj`` (in any served form) in its stored form."""
    if obj.get("apiVersion") == "events.k8s.io/v1" and obj.get("kind") == "Event":
        return from_events_v1(obj)
    if obj.get("apiVersion") == HPA_V1 and obj.get("kind") == "HorizontalPodAutoscaler":
        return hpa_to_v2(obj)
    return obj


def copy_key(source: Mapping[str, Any], target: Obj, key: str) -> None:
    """``target[key]`` becomes ``source[key]``, or absent when ``source`` has none."""
    if key in source:
        target[key] = source[key]
    else:
        target.pop(key, None)


def keep_status(spec: ResourceSpec, current: Obj, new: Obj) -> None:
    """An update of the main resource keeps the stored status: also what a served form keeps of it elsewhere.

    An autoscaling/v1 HPA carries its v2 status in annotations; ``new`` gets
    ``current``'s (``new.status`` is already ``current``'s).
    """
    if not (spec.stored_as and spec.api_version == HPA_V1):
        return
    old = (current.get("metadata") or {}).get("annotations") or {}
    meta = new.setdefault("metadata", {})
    annotations = dict(meta.get("annotations") or {})
    for key in _STATUS_ANNOTATIONS:
        copy_key(old, annotations, key)
    set_or_drop(meta, "annotations", annotations)


# -- HorizontalPodAutoscaler --------------------------------------------------------------------------------------


def set_or_drop(target: Obj, key: str, value: Any) -> None:
    """``target[key] = value``, or no ``key`` at all when ``value`` is empty."""
    if value:
        target[key] = value
    else:
        target.pop(key, None)


def _dict(value: Any) -> Obj:
    return value if isinstance(value, dict) else {}


def _metric(metric: Any, table: dict[str, tuple[str, tuple[tuple[str, str], ...]]], to_v2: bool) -> Obj:
    """One MetricSpec (``table`` :data:`_SPEC_FIELDS`) or MetricStatus converted to v1 or (``to_v2``) to v2."""
    metric = _dict(metric)
    kind = metric.get("type")
    out: Obj = {"type": kind}
    if kind in table:
        member, fields = table[kind]
        source = _dict(metric.get(member))
        converted: Obj = {}
        for v1, v2 in fields:
            if not to_v2 and get_path(source, v2) is not None:
                converted[v1] = get_path(source, v2)
            elif to_v2 and source.get(v1) is not None:
                set_path(converted, v2, copy.deepcopy(source[v1]))
        if to_v2 and table is _SPEC_FIELDS:
            target = converted.setdefault("target", {})
            if kind in ("Resource", "ContainerResource"):
                target["type"] = "Utilization" if "averageUtilization" in target else "AverageValue"
            elif kind == "Pods":
                target["type"] = "AverageValue"
            else:
                target["type"] = "AverageValue" if "averageValue" in target else "Value"
        out[member] = converted
    return out


def cpu_utilization_metric(percent: Any) -> Obj:
    """The autoscaling/v2 metric of a CPU utilization target (``targetCPUUtilizationPercentage``)."""
    return {
        "type": "Resource",
        "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": percent}},
    }


def _is_cpu_utilization(metric: Any, field: str) -> bool:
    metric = _dict(metric)
    resource = _dict(metric.get("resource"))
    return (
        metric.get("type") == "Resource"
        and resource.get("name") == "cpu"
        and get_path(resource, f"{field}.averageUtilization") is not None
    )


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _hpa_copy(obj: Obj, api_version: str) -> tuple[Obj, Obj, Obj, Obj]:
    """``(obj without spec and status, as api_version; a copy of its metadata; its spec; the fields both keep)``."""
    out = {k: v for k, v in obj.items() if k not in ("spec", "status")}
    out["apiVersion"] = api_version
    out["kind"] = "HorizontalPodAutoscaler"
    spec = _dict(obj.get("spec"))
    kept: Obj = {k: spec[k] for k in ("scaleTargetRef", "minReplicas", "maxReplicas") if k in spec}
    return out, dict(_dict(obj.get("metadata"))), spec, kept


def hpa_to_v1(obj: Obj) -> Obj:
    """The autoscaling/v1 form of a stored autoscaling/v2 HorizontalPodAutoscaler."""
    out, meta, spec, new_spec = _hpa_copy(obj, HPA_V1)
    annotations = {k: v for k, v in _dict(meta.get("annotations")).items() if k not in _ROUND_TRIP}
    others = []
    for metric in spec.get("metrics") or []:
        if _is_cpu_utilization(metric, "target") and "targetCPUUtilizationPercentage" not in new_spec:
            new_spec["targetCPUUtilizationPercentage"] = metric["resource"]["target"]["averageUtilization"]
        else:
            others.append(_metric(metric, _SPEC_FIELDS, to_v2=False))
    if others:
        annotations[METRICS_ANNOTATION] = _json(others)
    if spec.get("behavior") is not None:
        annotations[BEHAVIOR_ANNOTATION] = _json(spec["behavior"])
    if "spec" in obj:
        out["spec"] = new_spec
    status = _dict(obj.get("status"))
    if status:
        new_status: Obj = {k: status[k] for k in ("observedGeneration", "lastScaleTime") if k in status}
        new_status["currentReplicas"] = status.get("currentReplicas", 0)
        new_status["desiredReplicas"] = status.get("desiredReplicas", 0)
        current = status.get("currentMetrics") or []
        for metric in current:
            if _is_cpu_utilization(metric, "current"):
                new_status["currentCPUUtilizationPercentage"] = metric["resource"]["current"]["averageUtilization"]
                break
        if current:
            annotations[CURRENT_METRICS_ANNOTATION] = _json([_metric(m, _STATUS_FIELDS, to_v2=False) for m in current])
        if status.get("conditions"):
            annotations[CONDITIONS_ANNOTATION] = _json(status["conditions"])
        out["status"] = new_status
    set_or_drop(meta, "annotations", annotations)
    out["metadata"] = meta
    return out


def _annotation_json(annotations: Obj, key: str, *, listed: bool = True) -> Any:
    """The JSON in annotation ``key`` (None if absent); 400 if it does not parse, or is no list when ``listed``."""
    raw = annotations.get(key)
    if raw is None:
        return None
    try:
        value = orjson.loads(raw) if isinstance(raw, str) else None
    except orjson.JSONDecodeError as e:
        raise bad_request(f"annotation {key}: not valid JSON: {e}") from e
    if listed and not isinstance(value, list):
        raise bad_request(f"annotation {key}: expected a JSON list")
    return value


def hpa_to_v2(obj: Obj) -> Obj:
    """The stored (autoscaling/v2) form of an autoscaling/v1 HorizontalPodAutoscaler."""
    out, meta, spec, new_spec = _hpa_copy(obj, HPA_V2)
    annotations = _dict(meta.get("annotations"))
    metrics = [_metric(m, _SPEC_FIELDS, to_v2=True) for m in _annotation_json(annotations, METRICS_ANNOTATION) or []]
    cpu = spec.get("targetCPUUtilizationPercentage")
    if cpu is not None:
        metrics.append(cpu_utilization_metric(cpu))
    if metrics:
        new_spec["metrics"] = metrics
    if annotations.get(BEHAVIOR_ANNOTATION) is not None:
        new_spec["behavior"] = _annotation_json(annotations, BEHAVIOR_ANNOTATION, listed=False)
    if "spec" in obj:
        out["spec"] = new_spec
    status = _dict(obj.get("status"))
    if "status" in obj:
        new_status: Obj = {
            k: status[k]
            for k in ("observedGeneration", "lastScaleTime", "currentReplicas", "desiredReplicas")
            if k in status
        }
        current = _annotation_json(annotations, CURRENT_METRICS_ANNOTATION)
        if current is not None:
            new_status["currentMetrics"] = [_metric(m, _STATUS_FIELDS, to_v2=True) for m in current]
        elif (used := status.get("currentCPUUtilizationPercentage")) is not None:
            cpu = {"name": "cpu", "current": {"averageUtilization": used}}
            new_status["currentMetrics"] = [{"type": "Resource", "resource": cpu}]
        conditions = _annotation_json(annotations, CONDITIONS_ANNOTATION)
        if conditions:
            new_status["conditions"] = conditions
        out["status"] = new_status
    kept = {k: v for k, v in annotations.items() if k not in _ROUND_TRIP}
    set_or_drop(meta, "annotations", kept)
    out["metadata"] = meta
    return out
