"""The official ``kubernetes`` Python client against the local API server."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from kubernetes import client as _client
from kubernetes import watch as _watch
from kubernetes.client.exceptions import ApiException

from hashing import HashRange, range_to_selector
from tests.local_apiserver.conftest import deployment, metric, wait_for

# The client's pydantic models make every field Optional; tests check values at run time.
k: Any = _client
kwatch: Any = _watch


def _message(e: ApiException) -> str:
    return str(json.loads(str(e.body))["message"])


def cm(name: str, labels: dict[str, str] | None = None, **data: str) -> k.V1ConfigMap:
    return k.V1ConfigMap(metadata=k.V1ObjectMeta(name=name, labels=labels), data=data or None)


def test_create_get_list_replace_and_stale_conflict(kube: Any, namespace: str) -> None:
    core = k.CoreV1Api(kube)
    created = core.create_namespaced_config_map(namespace, cm("a", x="1"))
    assert created.metadata.uid and created.metadata.creation_timestamp
    rv = created.metadata.resource_version
    listed = core.list_namespaced_config_map(namespace)
    assert [i.metadata.name for i in listed.items] == ["a"]
    assert int(listed.metadata.resource_version) >= int(rv)

    created.data = {"x": "2"}
    replaced = core.replace_namespaced_config_map("a", namespace, created)
    assert int(replaced.metadata.resource_version) > int(rv)
    assert replaced.metadata.uid == created.metadata.uid

    stale = core.read_namespaced_config_map("a", namespace)
    stale.metadata.resource_version = rv  # the first version: stale now
    stale.data = {"x": "3"}
    with pytest.raises(ApiException) as info:
        core.replace_namespaced_config_map("a", namespace, stale)
    assert info.value.status == 409
    assert "the object has been modified" in _message(info.value)
    assert core.read_namespaced_config_map("a", namespace).data == {"x": "2"}

    with pytest.raises(ApiException) as info:
        core.create_namespaced_config_map(namespace, cm("a"))
    assert info.value.status == 409
    assert json.loads(str(info.value.body))["reason"] == "AlreadyExists"


def test_generate_name_and_namespace_must_exist(kube: Any, namespace: str) -> None:
    core = k.CoreV1Api(kube)
    obj = core.create_namespaced_config_map(namespace, k.V1ConfigMap(metadata=k.V1ObjectMeta(generate_name="gen-")))
    assert obj.metadata.name.startswith("gen-") and len(obj.metadata.name) == len("gen-") + 5
    with pytest.raises(ApiException) as info:
        core.create_namespaced_config_map("no-such-namespace", cm("a"))
    assert info.value.status == 404
    assert _message(info.value) == 'namespaces "no-such-namespace" not found'


def test_label_selectors_equality_and_set_based(kube: Any, namespace: str) -> None:
    core = k.CoreV1Api(kube)
    core.create_namespaced_config_map(namespace, cm("dev", {"env": "dev", "tier": "web"}))
    core.create_namespaced_config_map(namespace, cm("prod", {"env": "prod", "tier": "web"}))
    core.create_namespaced_config_map(namespace, cm("old", {"env": "prod", "legacy": "yes"}))
    core.create_namespaced_config_map(namespace, cm("none"))

    def names(**kw: Any) -> list[str]:
        return sorted(i.metadata.name for i in core.list_namespaced_config_map(namespace, **kw).items)

    assert names(label_selector="env in (dev,prod),!legacy") == ["dev", "prod"]
    assert names(label_selector="env notin (dev)") == ["none", "old", "prod"]
    assert names(label_selector="env=prod,tier==web") == ["prod"]
    assert names(label_selector="env!=prod") == ["dev", "none"]
    assert names(label_selector="legacy") == ["old"]
    assert names(field_selector="metadata.name=dev") == ["dev"]
    assert names(field_selector="metadata.name!=dev,metadata.namespace=" + namespace) == ["none", "old", "prod"]
    everywhere = k.CoreV1Api(kube).list_config_map_for_all_namespaces(label_selector="env=dev")
    assert [i.metadata.name for i in everywhere.items] == ["dev"]


def test_pagination_reads_one_revision(kube: Any, namespace: str) -> None:
    core = k.CoreV1Api(kube)
    for i in range(5):
        core.create_namespaced_config_map(namespace, cm(f"c{i}"))
    first = core.list_namespaced_config_map(namespace, limit=2)
    assert [i.metadata.name for i in first.items] == ["c0", "c1"]
    token = first.metadata._continue
    assert token
    core.create_namespaced_config_map(namespace, cm("c2a"))  # after the snapshot: not in this list
    names = [i.metadata.name for i in first.items]
    while token:
        page = core.list_namespaced_config_map(namespace, limit=2, _continue=token)
        assert page.metadata.resource_version == first.metadata.resource_version
        names += [i.metadata.name for i in page.items]
        token = page.metadata._continue
    assert names == ["c0", "c1", "c2", "c3", "c4"]


def test_watch_initial_then_changes_and_resume_from_resource_version(
    kube: Any, namespace: str, http: httpx.Client
) -> None:
    core = k.CoreV1Api(kube)
    first = core.create_namespaced_config_map(namespace, cm("one"))
    w = kwatch.Watch()
    events = []
    for ev in w.stream(core.list_namespaced_config_map, namespace, timeout_seconds=5):
        events.append((ev["type"], ev["object"].metadata.name))
        if len(events) == 1:
            core.create_namespaced_config_map(namespace, cm("two"))
        if len(events) == 2:
            w.stop()
    assert events == [("ADDED", "one"), ("ADDED", "two")]

    # Resume from the first object's version: exactly the later changes, in order.
    core.patch_namespaced_config_map("one", namespace, {"data": {"k": "v"}})
    core.delete_namespaced_config_map("two", namespace)
    w = kwatch.Watch()
    seen = []
    for ev in w.stream(
        core.list_namespaced_config_map, namespace, resource_version=first.metadata.resource_version, timeout_seconds=5
    ):
        seen.append((ev["type"], ev["object"].metadata.name))
        if len(seen) == 3:
            w.stop()
    assert seen == [("ADDED", "two"), ("MODIFIED", "one"), ("DELETED", "two")]
    wait_for(lambda: metric(http, "local_apiserver_watches", resource="configmaps") == 0, what="watch gauge back to 0")


def test_watch_label_selector_turns_updates_into_added_and_deleted(kube: Any, namespace: str) -> None:
    core = k.CoreV1Api(kube)
    start = core.list_namespaced_config_map(namespace).metadata.resource_version
    core.create_namespaced_config_map(namespace, cm("x", {"sel": "no"}))
    core.patch_namespaced_config_map("x", namespace, {"metadata": {"labels": {"sel": "yes"}}})
    core.patch_namespaced_config_map("x", namespace, {"data": {"a": "b"}})
    core.patch_namespaced_config_map("x", namespace, {"metadata": {"labels": {"sel": "no"}}})
    w = kwatch.Watch()
    seen = []
    for ev in w.stream(
        core.list_namespaced_config_map, namespace, label_selector="sel=yes", resource_version=start, timeout_seconds=5
    ):
        seen.append(ev["type"])
        if len(seen) == 3:
            w.stop()
    assert seen == ["ADDED", "MODIFIED", "DELETED"]


def test_watch_bookmarks_and_open_watch_gauge(kube: Any, namespace: str, http: httpx.Client) -> None:
    core = k.CoreV1Api(kube)
    obj = core.create_namespaced_config_map(namespace, cm("b"))
    before = metric(http, "local_apiserver_watches", resource="configmaps")
    w = kwatch.Watch()
    bookmark_rv = None
    for ev in w.stream(
        core.list_namespaced_config_map,
        namespace,
        resource_version=obj.metadata.resource_version,
        allow_watch_bookmarks=True,
        timeout_seconds=10,
    ):
        if ev["type"] == "BOOKMARK":
            assert metric(http, "local_apiserver_watches", resource="configmaps") == before + 1
            bookmark_rv = ev["raw_object"]["metadata"]["resourceVersion"]
            w.stop()
    assert bookmark_rv is not None
    assert int(bookmark_rv) >= int(obj.metadata.resource_version)
    wait_for(lambda: metric(http, "local_apiserver_watches", resource="configmaps") == before, what="gauge drop")


def test_status_and_scale_subresources(kube: Any, namespace: str) -> None:
    apps = k.AppsV1Api(kube)
    created = apps.create_namespaced_deployment(namespace, deployment("d", replicas=2))
    assert created.status is None or created.status.replicas in (None, 0)
    # status subresource: only status changes, generation does not move
    status = apps.patch_namespaced_deployment_status(
        "d", namespace, {"status": {"replicas": 2}, "spec": {"replicas": 9}}
    )
    assert status.status.replicas == 2
    assert status.spec.replicas == 2
    assert status.metadata.generation == 1
    # main resource: status is ignored, spec changes bump generation
    body = apps.read_namespaced_deployment("d", namespace)
    body.status.replicas = 7
    body.spec.replicas = 3
    updated = apps.replace_namespaced_deployment("d", namespace, body)
    assert updated.status.replicas == 2 and updated.spec.replicas == 3
    assert updated.metadata.generation == 2
    # scale subresource
    scale = apps.read_namespaced_deployment_scale("d", namespace)
    assert scale.spec.replicas == 3 and scale.status.replicas == 2 and scale.status.selector == "app=d"
    scaled = apps.patch_namespaced_deployment_scale("d", namespace, {"spec": {"replicas": 6}})
    assert scaled.spec.replicas == 6
    assert apps.read_namespaced_deployment("d", namespace).metadata.generation == 3
    stale = scale
    stale.spec.replicas = 1
    with pytest.raises(ApiException) as info:
        apps.replace_namespaced_deployment_scale("d", namespace, stale)
    assert info.value.status == 409


def test_json_patch_and_finalizers(kube: Any, namespace: str) -> None:
    core = k.CoreV1Api(kube)
    core.create_namespaced_config_map(namespace, cm("f", a="1"))
    patched = core.patch_namespaced_config_map(
        "f",
        namespace,
        [
            {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/hold"]},
            {"op": "replace", "path": "/data/a", "value": "2"},
        ],
        _content_type="application/json-patch+json",
    )
    assert patched.data == {"a": "2"}
    core.delete_namespaced_config_map("f", namespace)
    held = core.read_namespaced_config_map("f", namespace)
    assert held.metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map("f", namespace, {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as info:
        core.read_namespaced_config_map("f", namespace)
    assert info.value.status == 404


def _owned(kind: str, api_version: str, owner: Any) -> list[k.V1OwnerReference]:
    return [
        k.V1OwnerReference(
            api_version=api_version, kind=kind, name=owner.metadata.name, uid=owner.metadata.uid, controller=True
        )
    ]


def _tree(kube: Any, namespace: str, name: str) -> tuple[Any, Any, Any]:
    apps, core = k.AppsV1Api(kube), k.CoreV1Api(kube)
    dep = apps.create_namespaced_deployment(namespace, deployment(name))
    rs_body = deployment(f"{name}-rs")
    rs_body.update(kind="ReplicaSet")
    rs_body["metadata"]["ownerReferences"] = [r.to_dict() for r in _owned("Deployment", "apps/v1", dep)]
    rs = apps.create_namespaced_replica_set(namespace, rs_body)
    pod = core.create_namespaced_pod(
        namespace,
        k.V1Pod(
            metadata=k.V1ObjectMeta(name=f"{name}-pod", owner_references=_owned("ReplicaSet", "apps/v1", rs)),
            spec=k.V1PodSpec(containers=[k.V1Container(name="c", image="nginx")]),
        ),
    )
    return dep, rs, pod


def _gone(fn: Any, *args: Any) -> bool:
    try:
        fn(*args)
    except ApiException as e:
        return bool(e.status == 404)
    return False


def test_background_cascading_deletion(kube: Any, namespace: str) -> None:
    apps, core = k.AppsV1Api(kube), k.CoreV1Api(kube)
    _tree(kube, namespace, "bg")
    apps.delete_namespaced_deployment("bg", namespace)
    assert _gone(apps.read_namespaced_deployment, "bg", namespace)
    wait_for(lambda: _gone(apps.read_namespaced_replica_set, "bg-rs", namespace), what="replicaset collected")
    wait_for(lambda: _gone(core.read_namespaced_pod, "bg-pod", namespace), what="pod collected")


def test_orphan_and_foreground_deletion(kube: Any, namespace: str) -> None:
    apps, core = k.AppsV1Api(kube), k.CoreV1Api(kube)
    _tree(kube, namespace, "or")
    apps.delete_namespaced_deployment("or", namespace, propagation_policy="Orphan")
    rs = wait_for(
        lambda: (r := apps.read_namespaced_replica_set("or-rs", namespace)).metadata.owner_references is None and r,
        what="owner reference dropped",
    )
    assert rs.metadata.name == "or-rs"
    assert core.read_namespaced_pod("or-pod", namespace).metadata.owner_references

    _tree(kube, namespace, "fg")
    apps.delete_namespaced_deployment("fg", namespace, propagation_policy="Foreground")
    wait_for(lambda: _gone(core.read_namespaced_pod, "fg-pod", namespace), what="pod collected first")
    wait_for(lambda: _gone(apps.read_namespaced_deployment, "fg", namespace), what="owner deleted")
    # The references have no blockOwnerDeletion: as kube, the owner does not wait for them; they go too.
    wait_for(lambda: _gone(apps.read_namespaced_replica_set, "fg-rs", namespace), what="replicaset collected")


def test_dependent_created_after_its_owner_is_collected(kube: Any, namespace: str) -> None:
    core = k.CoreV1Api(kube)
    owner = core.create_namespaced_config_map(namespace, cm("owner"))
    core.delete_namespaced_config_map("owner", namespace)
    late = cm("late")
    late.metadata.owner_references = _owned("ConfigMap", "v1", owner)
    core.create_namespaced_config_map(namespace, late)
    wait_for(lambda: _gone(core.read_namespaced_config_map, "late", namespace), what="dangling dependent collected")


def test_namespace_deletion_empties_it(kube: Any) -> None:
    core = k.CoreV1Api(kube)
    core.create_namespace(k.V1Namespace(metadata=k.V1ObjectMeta(name="doomed")))
    core.create_namespaced_config_map("doomed", cm("x"))
    core.delete_namespace("doomed")
    wait_for(lambda: _gone(core.read_namespace, "doomed"), what="namespace removed")
    assert _gone(core.read_namespaced_config_map, "x", "doomed")


def test_shard_selector_filters_lists(kube: Any, namespace: str) -> None:
    core = k.CoreV1Api(kube)
    uids = {core.create_namespaced_config_map(namespace, cm(f"s{i}")).metadata.uid for i in range(6)}
    lower = range_to_selector(HashRange(0, (2**63 - 1) // 2))
    upper = range_to_selector(HashRange((2**63 - 1) // 2 + 1, 2**63 - 1))
    a = core.list_namespaced_config_map(namespace, shard_selector=str(lower))
    b = core.list_namespaced_config_map(namespace, shard_selector=str(upper))
    got_a = {i.metadata.uid for i in a.items}
    got_b = {i.metadata.uid for i in b.items}
    assert got_a | got_b == uids and not got_a & got_b


def test_root_paths_one_step_here_chains_only_through_the_proxy(http: httpx.Client, namespace: str) -> None:
    """``root.uid`` (no via) is the chain of one step, as everywhere; a chain through other kinds is 400 here."""
    for i in range(4):
        http.post(f"/api/v1/namespaces/{namespace}/configmaps", json={"metadata": {"name": f"r{i}"}})
    whole = "'0x0000000000000000', '0x10000000000000000'"
    one_step = http.get(
        f"/api/v1/namespaces/{namespace}/configmaps",
        params={"shardSelector": f"shardRange(object.metadata.ownerReferences.root.uid, {whole})"},
    )
    assert one_step.status_code == 200 and len(one_step.json()["items"]) == 4
    chained = http.get(
        f"/api/v1/namespaces/{namespace}/configmaps",
        params={"shardSelector": f"shardRange(object.metadata.ownerReferences.root(replicasets.apps).uid, {whole})"},
    )
    assert chained.status_code == 400 and chained.json()["kind"] == "Status"
    assert "only the range filter proxy" in chained.json()["message"]


def test_send_initial_events_ends_with_an_annotated_bookmark(http: httpx.Client, namespace: str) -> None:
    for name in ("i1", "i2"):
        http.post(f"/api/v1/namespaces/{namespace}/configmaps", json={"metadata": {"name": name}})
    params = {
        "watch": "true",
        "sendInitialEvents": "true",
        "allowWatchBookmarks": "true",
        "resourceVersionMatch": "NotOlderThan",
        "timeoutSeconds": "5",
    }
    with http.stream("GET", f"/api/v1/namespaces/{namespace}/configmaps", params=params) as resp:
        events = []
        for line in resp.iter_lines():
            events.append(json.loads(line))
            if events[-1]["type"] == "BOOKMARK":
                break
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events] == [
        ("ADDED", "i1"),
        ("ADDED", "i2"),
        ("BOOKMARK", None),
    ]
    bookmark = events[-1]["object"]["metadata"]
    assert bookmark["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert int(bookmark["resourceVersion"]) >= int(events[1]["object"]["metadata"]["resourceVersion"])
