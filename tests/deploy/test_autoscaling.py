"""deploy/autoscaling: a HorizontalPodAutoscaler (autoscaling/v2) on the managers' StatefulSet, on the proxy's metric.

The HPA targets the StatefulSet the use renders, reads the metric the proxy
exports per instance (``rangeshard_unreconciled_objects{type, instance}``)
through the external-metrics adapter whose rules ship with it, and scales
down one pod at a time (each pod parks, then its neighbour absorbs its range).
The server-side dry run of the overlay is ``test_server_apply``'s.
"""

from __future__ import annotations

from typing import Any

import yaml

from range_filter_proxy.progress import METRIC_OBJECTS
from tests.deploy.test_manifests import DEPLOY, by_kind, one, render


def test_the_hpa_scales_the_managers_statefulset_on_the_proxys_metric() -> None:
    docs = render(DEPLOY / "overlays/autoscaling")
    (hpa,) = by_kind(docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["metadata"]["namespace"] == "rangeshard"
    sts = one(docs, "StatefulSet", "rangeshard-controller-manager")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("apps/v1", "StatefulSet", sts["metadata"]["name"])
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == METRIC_OBJECTS
    assert metric["external"]["target"]["type"] == "AverageValue"
    pdb = one(docs, "PodDisruptionBudget", "rangeshard-controller-manager")
    assert hpa["spec"]["minReplicas"] >= 2 and pdb["spec"]["maxUnavailable"] == 1
    down = hpa["spec"]["behavior"]["scaleDown"]
    assert [p["value"] for p in down["policies"]] == [1] and down["stabilizationWindowSeconds"] >= 300
    proxy = one(docs, "Deployment", "rangeshard-proxy")
    notes = proxy["spec"]["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] == "/metrics"


def test_the_adapter_rules_serve_the_metric_the_hpa_names() -> None:
    values: dict[str, Any] = yaml.safe_load((DEPLOY / "autoscaling/prometheus-adapter-values.yaml").read_text())
    (rule,) = values["rules"]["external"]
    assert rule["name"]["as"] == METRIC_OBJECTS and METRIC_OBJECTS in rule["seriesQuery"]
    # One series per proxy replica and instance: the max per instance, then the sum the HPA divides.
    assert rule["metricsQuery"].startswith("sum by (type) (max by (namespace, type, instance)")
