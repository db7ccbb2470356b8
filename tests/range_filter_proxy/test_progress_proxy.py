"""Progress metrics of a real proxy process (``rangeshard proxy --etcd``) over a real local API server.

Instances are registered with the real registry transactions, naming
ReplicaSets as their main resource (no version: the proxy takes the preferred
one) and ``stuckAfterSeconds: 1``; no controller runs, the test answers
changes itself by writing ``status.observedGeneration``. The proxy caches
ReplicaSets only because the records name them.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hashing import ShardBy, hash_key
from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.etcd import EtcdClient
from rangeshard.core.etcdserver import EtcdServer
from registry import MainResource, Registry
from tests.helpers import wait_until

CTYPE = "rsc"
MAIN = MainResource(group="apps", resource="replicasets", by=ShardBy.UID)


@pytest.fixture
def servers(etcd_server: EtcdServer, key_prefix: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    api = LocalApiServerProcess(etcd_server.url, prefix=f"/objs-{uuid.uuid4().hex[:8]}", log_file=tmp_path / "a.log")
    api.start()
    proxy = ProxyProcess(
        api.url, log_file=tmp_path / "p.log", extra_args=["--etcd", etcd_server.url, "--registry-prefix", key_prefix]
    )
    try:
        proxy.start()
        yield api.url, proxy.url
    finally:
        proxy.stop()
        api.stop()


def progress(proxy_url: str) -> dict[tuple[str, str], float]:
    """``(metric, instance) -> value`` of the progress families for ``CTYPE``."""
    text = httpx.get(proxy_url + "/metrics", timeout=10).text
    return {
        (s.name, s.labels["instance"]): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith(("rangeshard_unreconciled_", "rangeshard_stuck_")) and s.labels.get("type") == CTYPE
    }


def _rs(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"a": name}},
            "template": {"metadata": {"labels": {"a": name}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }


def test_the_proxy_names_the_instance_whose_changes_wait(
    servers: tuple[str, str], etcd_client: EtcdClient, key_prefix: str
) -> None:
    api_url, proxy_url = servers
    reg = Registry(etcd_client, key_prefix)
    for iid in ("a", "b"):
        reg.join(CTYPE, iid, etcd_client.grant_lease(60), main_resource=MAIN, stuck_after_seconds=1.0)
    snap = reg.snapshot(CTYPE)

    # Every instance has a series from the start: not measurable (nothing answered yet), NaN, not stuck.
    def listed() -> dict[tuple[str, str], float]:
        got = progress(proxy_url)
        return got if ("rangeshard_unreconciled_measurable", "b") in got else {}

    got = wait_until(listed, 30, "progress series of both instances")
    assert got["rangeshard_unreconciled_measurable", "a"] == 0.0
    assert math.isnan(got["rangeshard_unreconciled_objects", "a"])
    assert got["rangeshard_stuck_after_seconds", "a"] == 1.0

    ns = f"p-{uuid.uuid4().hex[:6]}"
    path = f"/apis/apps/v1/namespaces/{ns}/replicasets"
    with httpx.Client(base_url=api_url, timeout=10) as http:
        assert http.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201
        uids: dict[str, str] = {}
        for i in range(8):
            made = http.post(path, json=_rs(f"r{i}"))
            assert made.status_code == 201, made.text
            uids[f"r{i}"] = made.json()["metadata"]["uid"]

        def answer(name: str) -> None:
            gen = http.get(f"{path}/{name}").json()["metadata"]["generation"]
            patch = {"status": {"observedGeneration": gen, "replicas": 0}}
            done = http.patch(
                f"{path}/{name}/status", json=patch, headers={"Content-Type": "application/merge-patch+json"}
            )
            assert done.status_code == 200, done.text

        # One answer shows the controller writes observedGeneration: every instance is measured now.
        answer("r0")
        owner = {name: snap.owner_of(hash_key(uid)) for name, uid in uids.items()}
        expected = {iid: sum(1 for n, m in owner.items() if n != "r0" and m and m.instance_id == iid) for iid in "ab"}

        def counted() -> bool:
            got = progress(proxy_url)
            return all(got.get(("rangeshard_unreconciled_objects", iid)) == expected[iid] for iid in "ab")

        wait_until(counted, 30, f"unanswered objects counted per instance: {expected}")
        stuck = {iid for iid, n in expected.items() if n}
        wait_until(
            lambda: (
                {iid for iid in "ab" if progress(proxy_url)[("rangeshard_unreconciled_stuck", iid)] == 1.0} == stuck
            ),
            30,
            f"{sorted(stuck)} stuck after 1 s",
        )
        got = progress(proxy_url)
        for iid in stuck:
            assert got["rangeshard_unreconciled_oldest_seconds", iid] > 1.0

        for name in uids:
            if name != "r0":
                answer(name)
        # A spec change is a new unanswered change (generation 2) until it is answered.
        scaled = http.patch(
            f"{path}/r0",
            json={"spec": {"replicas": 1}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert scaled.status_code == 200 and scaled.json()["metadata"]["generation"] == 2
        r0_owner = owner["r0"]
        assert r0_owner is not None

        def only_r0() -> bool:
            got = progress(proxy_url)
            return all(
                got.get(("rangeshard_unreconciled_objects", iid)) == (1 if iid == r0_owner.instance_id else 0)
                for iid in "ab"
            )

        wait_until(only_r0, 30, "only r0's new generation unanswered")
        answer("r0")
        wait_until(
            lambda: all(progress(proxy_url)[("rangeshard_unreconciled_objects", iid)] == 0 for iid in "ab"),
            30,
            "everything answered",
        )
        got = progress(proxy_url)
        assert all(got["rangeshard_unreconciled_stuck", iid] == 0 for iid in "ab")
        assert all(got["rangeshard_unreconciled_oldest_seconds", iid] == 0 for iid in "ab")
