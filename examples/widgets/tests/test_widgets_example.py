"""The widgets example under the rangeshard test kit: three sharded managers, one ConfigMap per Widget, no overlap.

Uses only the kit's fixtures (``rangeshard_cluster``, ``rangeshard_namespace``,
``rangeshard_managers``): real etcd, the local API server serving the Widget
CRD, the range filter proxy, and real manager processes loading
``widgetctl:WidgetController`` through their config file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from widgetctl import CRD, WIDGETS, WidgetController, configmap_name

from hashing import hash_key
from rangeshard.testing import TestCluster, wait_until

N_WIDGETS = 24


@pytest.fixture
def api(rangeshard_cluster: TestCluster) -> Iterator[Any]:
    rangeshard_cluster.apply(CRD)
    with rangeshard_cluster.api_client() as client:
        yield client


def widget(name: str, color: str) -> dict[str, Any]:
    return {"apiVersion": WIDGETS.api_version, "kind": "Widget", "metadata": {"name": name}, "spec": {"color": color}}


def configmaps(core: Any, ns: str) -> dict[str, dict[str, Any]]:
    return {cm.metadata.name: cm for cm in core.list_namespaced_config_map(ns).items}


def test_three_managers_shard_widgets_without_overlap(
    api: Any, rangeshard_namespace: str, rangeshard_managers: Any
) -> None:
    ns = rangeshard_namespace
    custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)
    managers = rangeshard_managers(WidgetController, n=3, workers=2)
    keys = sorted(m.record.hash_key for m in managers.snapshot())
    assert keys == [2**61 - 1, 2**62 - 1, 2**63 - 1]  # the halving keys: each newcomer split the largest range
    for i in range(N_WIDGETS):
        custom.create_namespaced_custom_object("example.com", "v1", ns, "widgets", widget(f"w{i}", "red"))

    def all_configmaps(color: str) -> bool:
        cms = configmaps(core, ns)
        return all(
            configmap_name(f"w{i}") in cms and cms[configmap_name(f"w{i}")].data.get("color") == color
            for i in range(N_WIDGETS)
        )

    wait_until(lambda: all_configmaps("red"), 60, "a ConfigMap per Widget")
    listed = custom.list_namespaced_custom_object("example.com", "v1", ns, "widgets")["items"]
    uids = [w["metadata"]["uid"] for w in listed]
    snapshot = managers.snapshot()
    owners = {m.instance_id for m in (snapshot.owner_of(hash_key(uid)) for uid in uids) if m is not None}
    cm = configmaps(core, ns)["w0-widget"]
    owner = custom.get_namespaced_custom_object("example.com", "v1", ns, "widgets", "w0")
    assert cm.metadata.owner_references[0].uid == owner["metadata"]["uid"]
    assert cm.data == {"color": "red", "size": "M", "message": ""}  # size: the CRD schema's default
    wait_until(
        lambda: custom.get_namespaced_custom_object("example.com", "v1", ns, "widgets", "w0").get("status"),
        30,
        "the Widget's status",
    )

    for i in range(N_WIDGETS):
        custom.patch_namespaced_custom_object("example.com", "v1", ns, "widgets", f"w{i}", {"spec": {"color": "blue"}})
    wait_until(lambda: all_configmaps("blue"), 60, "ConfigMaps following their Widgets")

    custom.delete_namespaced_custom_object("example.com", "v1", ns, "widgets", "w1")
    wait_until(lambda: "w1-widget" not in configmaps(core, ns), 30, "the owned ConfigMap to be collected")

    records = managers.assert_no_overlap()
    assert records >= 2 * N_WIDGETS
    reconcilers = {r.instance_id for r in managers.audit_records()}
    # Every manager whose range holds a Widget reconciled its share (a quarter range holds none of
    # the 24 Widgets once in 1,000 runs: the owners are computed, not assumed to be all three).
    assert owners <= reconcilers <= set(managers.states()), (owners, reconcilers)
    assert len(owners) >= 2

    # The write-level check over the API server's own audit log: no Widget or ConfigMap was written
    # by an instance after another instance had written it (no stale owner).
    assert managers.cluster.apiserver_audit_log.is_file()
    writes = managers.assert_no_stale_writes()
    assert writes >= N_WIDGETS  # every ConfigMap create at least
