"""The one REST path parser and resource identity (rangeshard.core.rest), and their users' agreement."""

from __future__ import annotations

import pytest

from controller_manager.resources import DEPLOYMENTS, PODS, Resource
from hashing.resources import parse_resource_name
from local_apiserver.resources import RESOURCES
from local_apiserver.routing import Target, parse_target
from rangeshard.core.kubeapi import ApiError
from rangeshard.core.rest import (
    GVR,
    RestPath,
    group_version,
    group_version_path,
    parse_rest_path,
)

PODS_GVR = GVR("", "v1", "pods")
RS_GVR = GVR("apps", "v1", "replicasets")
NS_GVR = GVR("", "v1", "namespaces")


def test_gvr_identity() -> None:
    assert PODS_GVR.api_version == "v1" and RS_GVR.api_version == "apps/v1"
    assert PODS_GVR.label == "pods" and RS_GVR.label == "replicasets.apps"
    assert PODS_GVR.base_path == "/api/v1" and RS_GVR.base_path == "/apis/apps/v1"
    assert str(RS_GVR) == "apps/v1/replicasets" and str(PODS_GVR) == "v1/pods"
    assert RS_GVR.path() == "/apis/apps/v1/replicasets"
    assert RS_GVR.path("ns") == "/apis/apps/v1/namespaces/ns/replicasets"
    assert PODS_GVR.path("a b", "x/y", "status") == "/api/v1/namespaces/a%20b/pods/x%2Fy/status"
    assert NS_GVR.path(name="kube-system") == "/api/v1/namespaces/kube-system"
    assert group_version("", "v1") == "v1" and group_version_path("batch", "v1") == "/apis/batch/v1"
    # Frozen, hashable, ordered: usable as a dict key (the proxy's caches are keyed by it).
    assert {PODS_GVR: 1}[GVR("", "v1", "pods")] == 1
    assert sorted([RS_GVR, PODS_GVR]) == [PODS_GVR, RS_GVR]
    with pytest.raises(AttributeError):
        PODS_GVR.resource = "x"  # type: ignore[misc]


def test_richer_types_derive_their_identity() -> None:
    assert PODS.gvr == PODS_GVR and DEPLOYMENTS.gvr == GVR("apps", "v1", "deployments")
    widgets = Resource("widgets", "example.com", "v1", "Widget")
    assert widgets.gvr.path("ns", "w") == "/apis/example.com/v1/namespaces/ns/widgets/w"
    assert widgets.api_version == "example.com/v1"
    for spec in RESOURCES:
        assert spec.gvr == GVR(spec.group, spec.version, spec.resource)
        assert spec.api_version == spec.gvr.api_version and spec.group_resource == spec.gvr.label


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/api/v1/pods", RestPath(PODS_GVR, None, None)),
        ("/api/v1/pods/", RestPath(PODS_GVR, None, None)),
        ("/api/v1/namespaces/a/pods", RestPath(PODS_GVR, "a", None)),
        ("/api/v1/namespaces/a/pods/x", RestPath(PODS_GVR, "a", "x")),
        ("/api/v1/namespaces/a/pods/x/status", RestPath(PODS_GVR, "a", "x", "status")),
        ("/api/v1/namespaces/a/pods/x/proxy/p/q", RestPath(PODS_GVR, "a", "x", "proxy", ("p", "q"))),
        ("/apis/apps/v1/replicasets", RestPath(RS_GVR, None, None)),
        ("/apis/apps/v1/namespaces/a/replicasets/r/scale", RestPath(RS_GVR, "a", "r", "scale")),
        ("/api/v1/watch/pods", RestPath(PODS_GVR, None, None, watch_prefix=True)),
        ("/api/v1/watch/namespaces/a/pods/x", RestPath(PODS_GVR, "a", "x", watch_prefix=True)),
        # The namespaces resource itself: cluster-scoped, with its status and finalize subresources.
        ("/api/v1/namespaces", RestPath(NS_GVR, None, None)),
        ("/api/v1/namespaces/a", RestPath(NS_GVR, None, "a")),
        ("/api/v1/namespaces/a/status", RestPath(NS_GVR, None, "a", "status")),
        ("/api/v1/namespaces/a/finalize", RestPath(NS_GVR, None, "a", "finalize")),
        ("/apis/example.com/v1/namespaces/n/widgets", RestPath(GVR("example.com", "v1", "widgets"), "n", None)),
    ],
)
def test_parse_rest_path(path: str, expected: RestPath) -> None:
    assert parse_rest_path(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/",
        "/api",
        "/api/v1",
        "/apis",
        "/apis/apps",
        "/apis/apps/v1",
        "/api/v1/watch",
        "/version",
        "/healthz",
        "/metrics",
        "/openapi/v2",
        "/apix/v1/pods",
        "/api/v1//pods",
        "/api/v1/namespaces//pods",
        "//api/v1/pods//x",
    ],
)
def test_not_a_resource_path(path: str) -> None:
    assert parse_rest_path(path) is None


def test_parse_resource_name() -> None:
    assert parse_resource_name("pods") == ("pods", None, "")
    assert parse_resource_name(" replicasets.apps ") == ("replicasets", None, "apps")
    assert parse_resource_name("deployments.v1.apps") == ("deployments", "v1", "apps")
    assert parse_resource_name("widgets.example.com") == ("widgets", None, "example.com")
    assert parse_resource_name("widgets.v1beta1.example.com") == ("widgets", "v1beta1", "example.com")
    with pytest.raises(ValueError, match="empty"):
        parse_resource_name("  ")


def test_namespace_subresource_is_the_namespace_everywhere() -> None:
    """Once diverged: the manager's endpoint read /api/v1/namespaces/a/status as a collection named "status"."""
    for path in ("/api/v1/namespaces/a/status", "/api/v1/namespaces/a/finalize"):
        parsed = parse_rest_path(path)
        assert parsed is not None and (parsed.gvr.label, parsed.collection) == ("namespaces", False)
    target = parse_target("/api/v1/namespaces/a")
    assert isinstance(target, Target) and target.spec.resource == "namespaces"
    assert (target.namespace, target.name, target.subresource) == (None, "a", "")


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1//pods",
        "/api/v1/namespaces//pods",
        "/api/v1/namespaces/a/pods/x/status/extra",
        "/api/v1/namespaces/a/nodes",
        "/api/v1/namespaces/a/namespaces",
        "/api/v1/namespaces/a/status",
        "/api/v2/pods",
        "/apis/apps/v1/namespaces/a/status",
        "/apis/nope.example.com/v1/widgets",
        "/apix",
    ],
)
def test_local_apiserver_bad_paths_are_404(path: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_target(path)
    assert err.value.code == 404


def test_local_apiserver_targets() -> None:
    pod = parse_target("/api/v1/watch/namespaces/a/pods/x")
    assert isinstance(pod, Target)
    assert (pod.spec.gvr, pod.namespace, pod.name, pod.watch_path) == (PODS_GVR, "a", "x", True)
    scale = parse_target("/apis/apps/v1/namespaces/a/replicasets/r/scale")
    assert isinstance(scale, Target) and (scale.spec.gvr, scale.subresource) == (RS_GVR, "scale")
    assert parse_target("/apis/apps/v1")["groupVersion"] == "apps/v1"  # type: ignore[index]
    assert parse_target("/api/v1")["groupVersion"] == "v1"  # type: ignore[index]
