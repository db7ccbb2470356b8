"""Informer through the real proxy and local API server: range-restricted list + watch, relist on a range change.

The shard selector is applied by the proxy, so the informer's store must hold
exactly the objects whose uid hash lies in the range it was given; a range
change (new epoch + ``reset``) must relist, report objects that left the range
as DELETED, and only then set ``synced_epoch`` to the new epoch.
"""

from __future__ import annotations

import threading
from typing import Any

from controller_manager.informer import Informer
from controller_manager.resources import REPLICASETS
from hashing import MAX_HASH, UID_PATH, HashRange, hash_key
from tests.e2e.conftest import Cluster
from tests.e2e.kube import create_namespace, create_replicaset, replicasets
from tests.helpers import wait_until

LOWER = HashRange(0, MAX_HASH // 2)
UPPER = HashRange(MAX_HASH // 2 + 1, MAX_HASH)


def names_in(cluster: Cluster, ns: str, rng: HashRange) -> set[str]:
    return {
        f"{ns}/{rs['metadata']['name']}"
        for rs in replicasets(cluster.api, ns)
        if rng.contains(hash_key(rs["metadata"]["uid"]))
    }


def test_informer_lists_watches_and_relists_its_range(cluster: Cluster) -> None:
    from kubernetes import client as k8s  # noqa: PLC0415

    ns = "informer"
    create_namespace(cluster.api, ns)
    for i in range(40):  # uids are random: go on until both halves hold some (almost always 12)
        create_replicaset(cluster.api, ns, f"rs{i}", 0)
        lower = names_in(cluster, ns, LOWER)
        upper = names_in(cluster, ns, UPPER)
        if i >= 11 and lower and upper:
            break
    assert lower and upper
    current: list[tuple[int, HashRange | None]] = [(1, LOWER)]
    events: list[tuple[str, str]] = []
    lock = threading.Lock()

    def on_event(kind: str, obj: dict[str, Any]) -> None:
        with lock:
            events.append((kind, f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"))

    proxy_api = k8s.ApiClient(k8s.Configuration(host=cluster.proxy.url))
    informer = Informer(
        proxy_api, REPLICASETS, path=UID_PATH, range_source=lambda: current[0], on_event=on_event, name="t-rs"
    )
    informer.page_size = 2  # lists in pages of 2 (limit/continue): several pages per list here
    informer.start()
    try:
        wait_until(lambda: informer.synced_epoch == 1, 20, "the first list")
        assert {f"{ns}/{o['metadata']['name']}" for o in informer.items()} == lower
        assert sorted(events) == sorted(("ADDED", k) for k in lower)
        # Watch: a new object shows up only if its hash is in range.
        create_replicaset(cluster.api, ns, "late", 0)
        late_in_lower = "informer/late" in names_in(cluster, ns, LOWER)
        if late_in_lower:
            wait_until(lambda: informer.get("informer/late") is not None, 20, "the watch to deliver the new object")
        k8s.AppsV1Api(cluster.api).delete_namespaced_replica_set(sorted(lower)[0].split("/")[1], ns)
        wait_until(lambda: ("DELETED", sorted(lower)[0]) in events, 20, "the deletion through the watch")
        if not late_in_lower:
            assert informer.get("informer/late") is None
        # Range change: a new epoch, relisted; what left the range is reported as deleted.
        with lock:
            events.clear()
        current[0] = (2, UPPER)
        informer.reset()
        wait_until(lambda: informer.synced_epoch == 2, 20, "the relist at the new epoch")
        now_upper = names_in(cluster, ns, UPPER)
        assert {f"{ns}/{o['metadata']['name']}" for o in informer.items()} == now_upper
        with lock:
            deleted = {k for kind, k in events if kind == "DELETED"}
            added = {k for kind, k in events if kind == "ADDED"}
        assert deleted == (lower - {sorted(lower)[0]}) | ({"informer/late"} if late_in_lower else set())
        assert added == now_upper
    finally:
        informer.stop()
