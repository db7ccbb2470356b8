"""Write fencing through a real proxy process (``rangeshard proxy --etcd ... --registry-prefix ...``).

A real local API server behind the proxy; instances registered with the real
registry transactions; writes sent over HTTP with owner tokens in their
User-Agent.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from controller_manager.fencing import FencedApiClient, WriteFenced
from hashing import hash_key
from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.etcd import EtcdClient
from rangeshard.core.etcdserver import EtcdServer
from rangeshard.core.ownertoken import FENCED_HEADER, SHARD_HASH_HEADER, OwnerToken, format_shard_hash
from registry import Registry
from tests.helpers import wait_until

CTYPE = "replicaset"


@pytest.fixture
def proxy_url(etcd_server: EtcdServer, key_prefix: str, tmp_path: Path) -> Iterator[str]:
    api = LocalApiServerProcess(etcd_server.url, prefix=f"/objs-{uuid.uuid4().hex[:8]}", log_file=tmp_path / "a.log")
    api.start()
    proxy = ProxyProcess(
        api.url,
        log_file=tmp_path / "p.log",
        resources=["replicasets.apps"],
        extra_args=["--etcd", etcd_server.url, "--registry-prefix", key_prefix],
    )
    try:
        proxy.start()
        yield proxy.url
    finally:
        proxy.stop()
        api.stop()


def _rs(name: str, owner: tuple[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": owner[0], "uid": owner[1], "controller": True}
        ]
    return {
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"a": name}},
            "template": {"metadata": {"labels": {"a": name}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }


def _fenced(proxy_url: str) -> dict[str, float]:
    text = httpx.get(proxy_url + "/metrics", timeout=10).text
    return {
        s.labels["reason"]: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "range_filter_proxy_fenced_writes_total"
    }


def test_token_writes_are_fenced_unless_current_owner(proxy_url: str, etcd_client: EtcdClient, key_prefix: str) -> None:
    reg = Registry(etcd_client, key_prefix)
    lease_a = etcd_client.grant_lease(30)
    a = reg.join(CTYPE, "a", lease_a)
    lease_b = etcd_client.grant_lease(30)
    b = reg.join(CTYPE, "b", lease_b)  # lower half, locked (giver a)
    assert a.range is not None and b.range is not None and b.record.is_locked
    snap = reg.snapshot(CTYPE)
    a_now = snap.get("a")
    assert a_now is not None and a_now.range is not None
    token_a = OwnerToken(CTYPE, "a", lease_a, snap.revision)  # a view showing a's current period
    token_b = OwnerToken(CTYPE, "b", lease_b, b.mod_revision)
    ns = f"f-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=proxy_url, timeout=10) as http:
        assert http.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201  # no token
        path = f"/apis/apps/v1/namespaces/{ns}/replicasets"
        # Owners (real deployments, so garbage collection keeps their replicasets) in a's and in b's range.
        owners: dict[str, tuple[str, str]] = {}
        for i in range(64):
            if len(owners) == 2:
                break
            dep = http.post(f"/apis/apps/v1/namespaces/{ns}/deployments", json={**_rs(f"d{i}"), "kind": "Deployment"})
            assert dep.status_code == 201, dep.text
            uid = dep.json()["metadata"]["uid"]
            owners.setdefault("a" if a_now.range.contains(hash_key(uid)) else "b", (f"d{i}", uid))
        in_a, in_b = owners["a"], owners["b"]

        def post(body: dict[str, Any], token: OwnerToken, **headers: str) -> httpx.Response:
            return http.post(path, json=body, headers={"User-Agent": token.user_agent(), **headers})

        ok = post(_rs("mine", in_a), token_a)
        assert ok.status_code == 201, ok.text

        out = post(_rs("theirs", in_b), token_a)
        assert out.status_code == 409
        status = out.json()
        assert status["kind"] == "Status" and status["reason"] == "Conflict" and status["code"] == 409
        assert "fenced" in status["message"] and "outside the range" in status["message"]
        assert status["details"]["causes"][0]["reason"] == "OutOfRange" and out.headers[FENCED_HEADER] == "OutOfRange"
        assert http.get(f"{path}/theirs").status_code == 404  # never reached the API server

        assert post(_rs("locked", in_b), token_b).headers.get(FENCED_HEADER) == "Locked"
        wrong_lease = OwnerToken(CTYPE, "a", lease_a + 1, token_a.epoch)
        assert post(_rs("w", in_a), wrong_lease).headers.get(FENCED_HEADER) == "LeaseMismatch"
        old = OwnerToken(CTYPE, "a", lease_a, a.mod_revision)  # before b's join shrank a's range
        assert post(_rs("old", in_a), old).headers.get(FENCED_HEADER) == "StaleEpoch"
        lying = post(_rs("lie", in_a), token_a, **{SHARD_HASH_HEADER: format_shard_hash(hash_key(in_b[1]))})
        assert lying.headers.get(FENCED_HEADER) == "ShardHashMismatch"

        # Delete and patch without a body: the shard hash comes from the cached object.
        wait_until(lambda: http.get(path).json()["items"], 10, "the proxy's cache to hold the replicaset")
        etcd_client.revoke_lease(lease_a)
        gone = http.delete(f"{path}/mine", headers={"User-Agent": token_a.user_agent()})
        assert gone.status_code == 409 and gone.headers[FENCED_HEADER] == "NotRegistered"
        assert http.delete(f"{path}/mine").status_code == 200  # no token: passes as before

    counts = _fenced(proxy_url)
    assert counts.get("OutOfRange") == 1 and counts.get("Locked") == 1 and counts.get("NotRegistered") == 1
    assert sum(counts.values()) == 6


def test_fencing_options_are_checked(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "rangeshard.cli.main", "proxy", "--upstream", "http://127.0.0.1:1", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)

    no_etcd = cli("--etcd-user", "root", "--etcd-password", "x")
    assert no_etcd.returncode == 2 and "need --etcd" in no_etcd.stderr
    bad_prefix = cli("--etcd", "http://127.0.0.1:2379", "--registry-prefix", "relative")
    assert bad_prefix.returncode == 2 and "--registry-prefix" in bad_prefix.stderr
    bad_url = cli("--etcd", "ftp://nowhere")
    assert bad_url.returncode == 2 and "etcd" in bad_url.stderr
    missing_ca = cli("--etcd", "https://127.0.0.1:2379", "--etcd-cacert", str(tmp_path / "nope.pem"))
    assert missing_ca.returncode == 2 and "nope.pem" in missing_ca.stderr


def test_manager_client_tells_a_fenced_write_from_an_ordinary_conflict(proxy_url: str) -> None:
    cfg = k8s.Configuration()
    cfg.host = proxy_url
    client = FencedApiClient(cfg)
    try:
        core = k8s.CoreV1Api(client)
        ns = f"c-{uuid.uuid4().hex[:6]}"
        assert client.user_agent.startswith("rangeshard-controller-manager/")
        core.create_namespace({"metadata": {"name": ns}})  # no token yet: passes unfenced
        with pytest.raises(ApiException) as conflict:  # an ordinary 409 (AlreadyExists) stays an ApiException
            core.create_namespace({"metadata": {"name": ns}})
        assert conflict.value.status == 409 and not isinstance(conflict.value, WriteFenced)
        ghost = OwnerToken(CTYPE, "ghost", 0x1234, 1)
        client.set_token(ghost)
        assert client.user_agent == ghost.user_agent()
        with client.reconciling(hash_key("some-uid")), pytest.raises(WriteFenced) as fenced:
            core.create_namespaced_config_map(ns, {"metadata": {"name": "x"}})
        assert fenced.value.reason == "NotRegistered" and fenced.value.token == ghost
        assert "fenced" in str(fenced.value)
        core.read_namespace(ns)  # reads are never fenced
    finally:
        client.close()
