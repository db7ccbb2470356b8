"""The fence judges a write by the rule its writer declares, reads protobuf bodies and forwards them unchanged.

A real proxy process with fencing on; behind it a recording relay (a real
HTTP hop that keeps every request body it forwards) in front of the real
local API server; instances registered with the real registry transactions.
Instance ``a`` owns the upper half of the space, ``b`` the lower half.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s

from controller_manager.fencing import FencedApiClient
from hashing import MAX_HASH, ShardBy, hash_key
from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.etcd import EtcdClient
from rangeshard.core.etcdserver import EtcdServer
from rangeshard.core.ownertoken import FENCED_HEADER, SHARD_BY_HEADER, SHARD_LABEL_HEADER, OwnerToken
from registry import Registry
from tests.helpers import wait_until

CTYPE = "rules"
FIXTURES = Path(__file__).parents[1] / "fixtures" / "protobuf"
PROTOBUF = "application/vnd.kubernetes.protobuf"
HALF = MAX_HASH // 2


class Relay:
    """Forwards every request to ``upstream`` and records the bodies of writes, byte for byte.

    :meth:`hold` holds the watch streams of one resource (what the upstream sends waits here), so a
    test can make the proxy's cache of that resource lag the upstream for as long as it needs.
    """

    def __init__(self, upstream: str) -> None:
        self.bodies: list[tuple[str, str, bytes]] = []
        #: ``(method, path, X-Rangeshard-Shard-By)`` of every write, in the order of ``bodies``.
        self.rules: list[tuple[str, str, str | None]] = []
        #: Resource name -> set while its watch streams flow (cleared: held by :meth:`hold`).
        self.flowing: dict[str, threading.Event] = {}
        #: Requests whose path and query contain one of these are answered 500 here (not forwarded).
        self.failing: set[str] = set()
        bodies, rules, flowing, failing = self.bodies, self.rules, self.flowing, self.failing
        client = httpx.Client(base_url=upstream, timeout=httpx.Timeout(30, read=None))

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if any(f in self.path for f in failing):
                    status = b'{"kind":"Status","apiVersion":"v1","status":"Failure","code":500,"message":"relay"}'
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(status)))
                    self.end_headers()
                    self.wfile.write(status)
                    return
                if self.command != "GET":
                    bodies.append((self.command, self.path, body))
                    rules.append((self.command, self.path.split("?")[0], self.headers.get(SHARD_BY_HEADER)))
                skip = {"host", "content-length", "connection", "transfer-encoding"}
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                request = client.build_request(self.command, self.path, headers=headers, content=body)
                resp = client.send(request, stream=True)  # watches stream: relay them chunk by chunk
                path, _, query = self.path.partition("?")
                watched = path.rstrip("/").rsplit("/", 1)[-1] if "watch=" in query else None
                try:
                    self.send_response(resp.status_code)
                    for k, v in resp.headers.items():
                        if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                            self.send_header(k, v)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in resp.iter_raw():
                        if watched is not None and watched in flowing:
                            flowing[watched].wait()
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError, httpx.HTTPError):
                    pass  # the proxy went away (its watch ended)
                finally:
                    resp.close()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.client = client
        self.thread = threading.Thread(target=self.server.serve_forever, name="test-relay", daemon=True)
        self.thread.start()

    @contextlib.contextmanager
    def hold(self, resource: str) -> Iterator[None]:
        """While the block runs, the upstream's watch events of ``resource`` wait here (then flow in order)."""
        gate = self.flowing.setdefault(resource, threading.Event())
        gate.clear()
        try:
            yield
        finally:
            gate.set()

    def close(self) -> None:
        for gate in self.flowing.values():
            gate.set()
        self.server.shutdown()
        self.server.server_close()
        self.client.close()


@dataclass
class Stack:
    proxy: str
    relay: Relay


@pytest.fixture
def stack(etcd_server: EtcdServer, key_prefix: str, tmp_path: Path) -> Iterator[Stack]:
    api = LocalApiServerProcess(etcd_server.url, prefix=f"/objs-{uuid.uuid4().hex[:8]}", log_file=tmp_path / "a.log")
    api.start()
    relay = Relay(api.url)
    proxy = ProxyProcess(
        relay.url,
        log_file=tmp_path / "p.log",
        resources=["replicasets.apps", "pods"],
        extra_args=["--etcd", etcd_server.url, "--registry-prefix", key_prefix],
    )
    try:
        proxy.start()
        yield Stack(proxy.url, relay)
    finally:
        proxy.stop()
        relay.close()
        api.stop()


def _token_of_upper_half(etcd_client: EtcdClient, key_prefix: str) -> OwnerToken:
    """Register ``a`` (then ``b``, which takes the lower half, locked): ``a``'s current token."""
    reg = Registry(etcd_client, key_prefix)
    lease_a = etcd_client.grant_lease(30)
    reg.join(CTYPE, "a", lease_a)
    reg.join(CTYPE, "b", etcd_client.grant_lease(30))
    snap = reg.snapshot(CTYPE)
    a = snap.get("a")
    assert a is not None and a.range is not None and a.range.lo == HALF + 1
    return OwnerToken(CTYPE, "a", lease_a, snap.revision)


def _in_a(uid: str) -> bool:
    return hash_key(uid) > HALF


def _rs(name: str, owner: tuple[str, str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": owner[0], "uid": owner[1], "controller": True}
            ],
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"a": name}},
            "template": {"metadata": {"labels": {"a": name}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }


def test_an_owned_object_written_by_uid_is_judged_by_its_own_uid(
    stack: Stack, etcd_client: EtcdClient, key_prefix: str
) -> None:
    """The kube-controller-manager case: a ReplicaSet of a Deployment in another range, its status written by uid."""
    token = _token_of_upper_half(etcd_client, key_prefix)
    ns = f"r-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=stack.proxy, timeout=10) as http:
        assert http.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201
        deps = f"/apis/apps/v1/namespaces/{ns}/deployments"
        owner = None
        for i in range(64):  # a Deployment in b's range (the lower half)
            dep = http.post(
                deps, json={**_rs(f"d{i}", ("x", "x")), "metadata": {"name": f"d{i}"}, "kind": "Deployment"}
            )
            assert dep.status_code == 201, dep.text
            if not _in_a(dep.json()["metadata"]["uid"]):
                owner = (f"d{i}", dep.json()["metadata"]["uid"])
                break
        assert owner is not None
        rss = f"/apis/apps/v1/namespaces/{ns}/replicasets"
        rs = None
        for i in range(64):  # one of its ReplicaSets whose own uid is in a's range (no token: not fenced)
            made = http.post(rss, json=_rs(f"rs{i}", owner))
            assert made.status_code == 201, made.text
            if _in_a(made.json()["metadata"]["uid"]):
                rs = made.json()
                break
        assert rs is not None
        wait_until(lambda: http.get(rss).json()["items"], 10, "the proxy's cache to hold the replicasets")
        status = f"{rss}/{rs['metadata']['name']}/status"

        def put(agent: str, **headers: str) -> httpx.Response:
            current = http.get(f"{rss}/{rs['metadata']['name']}").json()
            return http.put(status, json=current, headers={"User-Agent": agent, **headers})

        by_uid = put(token.user_agent(), **{SHARD_BY_HEADER: "uid"})
        assert by_uid.status_code == 200, by_uid.text
        in_agent = put(f"{token.user_agent()} client-go/v1.36 rangeshard-shard-by/uid")  # the audit log's spelling
        assert in_agent.status_code == 200, in_agent.text
        by_owner = put(token.user_agent(), **{SHARD_BY_HEADER: "owner"})
        assert by_owner.status_code == 409 and by_owner.headers[FENCED_HEADER] == "OutOfRange", by_owner.text
        undeclared = put(token.user_agent())  # no rule: the owner's hash, as before rules were declared
        assert undeclared.status_code == 409 and undeclared.headers[FENCED_HEADER] == "OutOfRange"
        bogus = put(token.user_agent(), **{SHARD_BY_HEADER: "name"})
        assert bogus.status_code == 400 and bogus.json()["kind"] == "Status", bogus.text
        assert SHARD_BY_HEADER in bogus.json()["message"] and "uid, owner, namespace" in bogus.json()["message"]
        keyless = put(token.user_agent(), **{SHARD_BY_HEADER: "label"})  # by: label names its key
        assert keyless.status_code == 400 and SHARD_LABEL_HEADER in keyless.json()["message"], keyless.text
        # A delete by uid: judged by the cached object's own uid.
        gone = http.delete(
            f"{rss}/{rs['metadata']['name']}", headers={"User-Agent": token.user_agent(), SHARD_BY_HEADER: "owner"}
        )
        assert gone.status_code == 409 and gone.headers[FENCED_HEADER] == "OutOfRange"
        gone = http.delete(
            f"{rss}/{rs['metadata']['name']}", headers={"User-Agent": token.user_agent(), SHARD_BY_HEADER: "uid"}
        )
        assert gone.status_code == 200, gone.text


def test_a_namespace_rule_takes_the_namespace_from_the_url(
    stack: Stack, etcd_client: EtcdClient, key_prefix: str
) -> None:
    token = _token_of_upper_half(etcd_client, key_prefix)
    names = [f"ns-{uuid.uuid4().hex[:8]}" for _ in range(40)]
    mine = next(n for n in names if _in_a(n))
    theirs = next(n for n in names if not _in_a(n))
    headers = {"User-Agent": token.user_agent(), SHARD_BY_HEADER: "namespace"}
    with httpx.Client(base_url=stack.proxy, timeout=10) as http:
        for ns in (mine, theirs):
            assert http.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201
        body = {"metadata": {"name": "out"}, "data": {"a": "b"}}  # no namespace in the body: the URL's
        ok = http.post(f"/api/v1/namespaces/{mine}/configmaps", json=body, headers=headers)
        assert ok.status_code == 201, ok.text
        out = http.post(f"/api/v1/namespaces/{theirs}/configmaps", json=body, headers=headers)
        assert out.status_code == 409 and out.headers[FENCED_HEADER] == "OutOfRange", out.text
        # Undeclared, the same create has no key (no uid yet, no owner): checked for lease and epoch only.
        legacy = http.post(
            f"/api/v1/namespaces/{theirs}/configmaps", json=body, headers={"User-Agent": token.user_agent()}
        )
        assert legacy.status_code == 201, legacy.text


def test_protobuf_bodies_are_fenced_by_their_owner_and_forwarded_unchanged(
    stack: Stack, etcd_client: EtcdClient, key_prefix: str
) -> None:
    token = _token_of_upper_half(etcd_client, key_prefix)
    pod = (FIXTURES / "pod-with-controller-owner.pb").read_bytes()  # owner in a's range
    job = (FIXTURES / "kubectl-create-job-from-cronjob.pb").read_bytes()  # owner (the cronjob) in b's range
    headers = {"User-Agent": token.user_agent(), "Content-Type": PROTOBUF, SHARD_BY_HEADER: "owner"}
    with httpx.Client(base_url=stack.proxy, timeout=10) as http:
        passed = http.post("/api/v1/namespaces/demo/pods", content=pod, headers=headers)
        assert FENCED_HEADER not in passed.headers and "write fencing" not in passed.text, passed.text
        forwarded = [
            b for m, p, b in stack.relay.bodies if m == "POST" and p.startswith("/api/v1/namespaces/demo/pods")
        ]
        assert forwarded == [pod], "forwarded byte for byte"

        fenced = http.post("/apis/batch/v1/namespaces/demo/jobs", content=job, headers=headers)
        assert fenced.status_code == 409 and fenced.headers[FENCED_HEADER] == "OutOfRange", fenced.text
        assert "/jobs" not in " ".join(p for _, p, _ in stack.relay.bodies), "a fenced write never goes upstream"

        garbage = b"k8s\x00\x0a\xff\x01"
        refused = http.post("/api/v1/namespaces/demo/pods", content=garbage, headers=headers)
        assert refused.status_code == 415, refused.text
        status = refused.json()
        assert status["kind"] == "Status" and status["reason"] == "UnsupportedMediaType"
        assert "protobuf" in status["message"] and "application/json" in status["message"]
        assert len([b for _, _, b in stack.relay.bodies if b == garbage]) == 0, "never forwarded unchecked"
        # Without an owner token nothing is read or refused: the body goes upstream as it came.
        plain = http.post("/api/v1/namespaces/demo/pods", content=garbage, headers={"Content-Type": PROTOBUF})
        assert FENCED_HEADER not in plain.headers
        assert [b for _, _, b in stack.relay.bodies if b == garbage] == [garbage]


def test_a_manager_declares_the_rule_of_each_resource_it_shards(stack: Stack) -> None:
    """The in-process managers' client: main resource by uid, dependents by owner, anything else undeclared."""
    cfg = k8s.Configuration()
    cfg.host = stack.relay.url
    api = FencedApiClient(cfg)
    api.set_rules({"replicasets.apps": ShardBy.UID, "pods": ShardBy.OWNER})
    api.set_token(OwnerToken(CTYPE, "a", 1, 1))
    ns = f"m-{uuid.uuid4().hex[:6]}"
    try:
        core, apps = k8s.CoreV1Api(api), k8s.AppsV1Api(api)
        core.create_namespace({"metadata": {"name": ns}})
        core.create_namespaced_pod(
            ns, {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
        )
        rs = _rs("r", ("d", "d-uid"))
        del rs["metadata"]["ownerReferences"]  # no owner: the local API server's GC would remove it
        apps.create_namespaced_replica_set(ns, rs)
        apps.patch_namespaced_replica_set_status("r", ns, {"status": {"replicas": 0}})
        core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}})
        core.delete_namespaced_pod("p", ns)
        core.read_namespace(ns)
    finally:
        api.close()
    assert stack.relay.rules == [
        ("POST", "/api/v1/namespaces", None),
        ("POST", f"/api/v1/namespaces/{ns}/pods", "owner"),
        ("POST", f"/apis/apps/v1/namespaces/{ns}/replicasets", "uid"),
        ("PATCH", f"/apis/apps/v1/namespaces/{ns}/replicasets/r/status", "uid"),
        ("POST", f"/api/v1/namespaces/{ns}/configmaps", None),
        ("DELETE", f"/api/v1/namespaces/{ns}/pods/p", "owner"),
    ]


def test_a_root_write_is_judged_by_the_top_of_the_owner_chain(
    stack: Stack, etcd_client: EtcdClient, key_prefix: str
) -> None:
    """A pod of a ReplicaSet (in b's range) of a Deployment (in a's): by root it is a's, by owner b's."""
    token = _token_of_upper_half(etcd_client, key_prefix)
    ns = f"t-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=stack.proxy, timeout=10) as http:
        assert http.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201
        deps = f"/apis/apps/v1/namespaces/{ns}/deployments"
        owners: dict[bool, tuple[str, str]] = {}
        for i in range(64):  # a Deployment on each side
            dep = http.post(
                deps, json={**_rs(f"d{i}", ("x", "x")), "metadata": {"name": f"d{i}"}, "kind": "Deployment"}
            )
            assert dep.status_code == 201, dep.text
            owners.setdefault(_in_a(dep.json()["metadata"]["uid"]), (f"d{i}", dep.json()["metadata"]["uid"]))
            if len(owners) == 2:
                break
        rss = f"/apis/apps/v1/namespaces/{ns}/replicasets"
        mine_rs = theirs_rs = None
        for i in range(64):  # a ReplicaSet in b's range under a's Deployment, and one under b's
            made = http.post(rss, json=_rs(f"rs{i}", owners[True] if mine_rs is None else owners[False]))
            assert made.status_code == 201, made.text
            if mine_rs is None and not _in_a(made.json()["metadata"]["uid"]):
                mine_rs = made.json()
            elif mine_rs is not None:
                theirs_rs = made.json()
                break
        assert mine_rs is not None and theirs_rs is not None
        pods = f"/api/v1/namespaces/{ns}/pods"

        def pod(name: str, rs: dict[str, Any]) -> dict[str, Any]:
            ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs["metadata"]["name"]}
            ref |= {"uid": rs["metadata"]["uid"], "controller": True}
            spec = {"containers": [{"name": "c", "image": "i"}]}
            return {"metadata": {"name": name, "ownerReferences": [ref]}, "spec": spec}

        # A reader by root makes the proxy resolve pods through replicasets.apps.
        path = "object.metadata.ownerReferences.root(replicasets.apps).uid"
        whole = f"shardRange({path}, '0x0000000000000000', '0x10000000000000000')"
        assert http.get(pods, params={"shardSelector": whole}).status_code == 200
        root = {"User-Agent": token.user_agent(), SHARD_BY_HEADER: "root"}
        made = http.post(pods, json=pod("p-mine", mine_rs), headers=root)
        assert made.status_code == 201, made.text  # a create: judged by the chain of its body's owner
        refused = http.post(pods, json=pod("p-theirs", theirs_rs), headers=root)
        assert refused.status_code == 409 and refused.headers[FENCED_HEADER] == "OutOfRange", refused.text
        wait_until(lambda: http.get(f"{pods}/p-mine").status_code == 200, 10, "the pod")
        patch = {"metadata": {"annotations": {"x": "y"}}}
        merge = {"Content-Type": "application/merge-patch+json"}
        wait_until(
            lambda: http.get(pods, params={"shardSelector": whole}).json()["items"], 10, "the proxy's cache of pods"
        )
        ok = http.patch(f"{pods}/p-mine", json=patch, headers={**root, **merge})
        assert ok.status_code == 200, ok.text
        by_owner = http.patch(
            f"{pods}/p-mine", json=patch, headers={**merge, "User-Agent": token.user_agent(), SHARD_BY_HEADER: "owner"}
        )
        assert by_owner.status_code == 409 and by_owner.headers[FENCED_HEADER] == "OutOfRange", by_owner.text


def test_a_root_write_is_judged_by_the_chain_the_upstream_has_while_the_proxys_cache_lags(
    stack: Stack, etcd_client: EtcdClient, key_prefix: str
) -> None:
    """A ReplicaSet re-parented between two writes of its pod: the second is judged by the new root.

    The relay holds the proxy's watch of ReplicaSets, so its cache (what placed the pod for the readers)
    still shows the old parent: a's write, decided by that chain, would pass as the old root's owner's
    (the stale-owner write of tests/e2e/test_owner_chains.py). The fence reads the chain as the upstream
    has it when the write arrives: refused; and a's write after a re-parent back to a's Deployment passes
    although the cache still shows b's. An owner the proxy cannot read is a 503, the write not forwarded.
    """
    token = _token_of_upper_half(etcd_client, key_prefix)
    ns = f"c-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=stack.proxy, timeout=10) as http:
        assert http.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201
        deps = f"/apis/apps/v1/namespaces/{ns}/deployments"
        owners: dict[bool, tuple[str, str]] = {}
        for i in range(64):  # a Deployment on each side
            dep = http.post(
                deps, json={**_rs(f"d{i}", ("x", "x")), "metadata": {"name": f"d{i}"}, "kind": "Deployment"}
            )
            assert dep.status_code == 201, dep.text
            owners.setdefault(_in_a(dep.json()["metadata"]["uid"]), (f"d{i}", dep.json()["metadata"]["uid"]))
            if len(owners) == 2:
                break
        rss = f"/apis/apps/v1/namespaces/{ns}/replicasets"
        made = http.post(rss, json=_rs("r", owners[True]))
        assert made.status_code == 201, made.text
        ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": made.json()["metadata"]["uid"]}
        pod = {
            "metadata": {"name": "p", "ownerReferences": [{**ref, "controller": True}]},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }
        pods = f"/api/v1/namespaces/{ns}/pods"
        assert http.post(pods, json=pod).status_code == 201
        path = "object.metadata.ownerReferences.root(replicasets.apps).uid"
        whole = {"shardSelector": f"shardRange({path}, '0x0000000000000000', '0x10000000000000000')"}
        wait_until(lambda: http.get(pods, params={**whole, "resourceVersion": "0"}).json()["items"], 10, "pods")

        def cached_parent() -> str:
            (rs,) = http.get(rss, params={"resourceVersion": "0"}).json()["items"]
            return str(rs["metadata"]["ownerReferences"][0]["uid"])

        def reparent(to: tuple[str, str]) -> None:
            owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": to[0], "uid": to[1], "controller": True}
            doc = [{"op": "replace", "path": "/metadata/ownerReferences", "value": [owner]}]
            moved = http.patch(f"{rss}/r", json=doc, headers={"Content-Type": "application/json-patch+json"})
            assert moved.status_code == 200, moved.text

        headers = {"User-Agent": token.user_agent(), SHARD_BY_HEADER: "root"}
        merge = {"Content-Type": "application/merge-patch+json"}

        def annotate(value: str) -> httpx.Response:
            doc = {"metadata": {"annotations": {"n": value}}}
            return http.patch(f"{pods}/p", json=doc, headers={**headers, **merge})

        assert annotate("1").status_code == 200  # under a's Deployment: a's
        with stack.relay.hold("replicasets"):
            reparent(owners[False])
            assert cached_parent() == owners[True][1], "the proxy's cache lags the re-parenting"
            stale = annotate("2")
            assert stale.status_code == 409 and stale.headers[FENCED_HEADER] == "OutOfRange", stale.text
        wait_until(lambda: cached_parent() == owners[False][1], 10, "the cache to see the re-parenting")
        again = annotate("3")
        assert again.status_code == 409 and again.headers[FENCED_HEADER] == "OutOfRange", again.text
        with stack.relay.hold("replicasets"):
            reparent(owners[True])  # back under a's Deployment; the cache still says b's
            assert cached_parent() == owners[False][1]
            back = annotate("4")
            assert back.status_code == 200, back.text
        assert http.get(f"{pods}/p").json()["metadata"]["annotations"] == {"n": "4"}
        stack.relay.failing.add("replicasets?fieldSelector")  # the owner cannot be read: no guess
        unread = annotate("5")
        assert unread.status_code == 503 and unread.json()["reason"] == "ServiceUnavailable", unread.text
        assert "write fencing: cannot read the owner" in unread.json()["message"]
        assert http.get(f"{pods}/p").json()["metadata"]["annotations"] == {"n": "4"}, "not forwarded"


def _values(in_a: bool, count: int) -> list[str]:
    """Fixed label values whose hash lies in ``a``'s half (``in_a``) or in ``b``'s."""
    return [v for v in (f"tenant-{i}" for i in range(200)) if _in_a(v) == in_a][:count]


def test_by_label_the_fence_judges_the_label_value_from_body_and_cache(
    stack: Stack, etcd_client: EtcdClient, key_prefix: str
) -> None:
    """``by: label``: a write is judged by its label's value (its uid without one); moving it out is refused."""
    token = _token_of_upper_half(etcd_client, key_prefix)
    (mine,), (theirs,) = _values(True, 1), _values(False, 1)
    ns = f"l-{uuid.uuid4().hex[:6]}"
    agent = f"{token.user_agent()} rangeshard-shard-by/label rangeshard-shard-label/example.com%2Ftenant"
    with httpx.Client(base_url=stack.proxy, timeout=10) as http:
        assert http.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201
        rss = f"/apis/apps/v1/namespaces/{ns}/replicasets"
        body = _rs("mine", ("x", "x"))
        body["metadata"] = {"name": "mine", "labels": {"example.com/tenant": mine}}
        assert http.post(rss, json=body).status_code == 201  # created by a client without a token
        other = {**body, "metadata": {"name": "theirs", "labels": {"example.com/tenant": theirs}}}
        assert http.post(rss, json=other).status_code == 201
        wait_until(lambda: len(http.get(rss, params={"resourceVersion": "0"}).json()["items"]) == 2, timeout=10)
        merge = {"Content-Type": "application/merge-patch+json", "User-Agent": agent}

        def patch(name: str, doc: dict[str, Any], **extra: str) -> httpx.Response:
            return http.patch(f"{rss}/{name}", json=doc, headers={**merge, **extra})

        note = {"metadata": {"annotations": {"n": "1"}}}
        assert patch("mine", note).status_code == 200  # the value is in a's range (from the cache)
        fenced = patch("theirs", note)
        assert fenced.status_code == 409 and fenced.headers[FENCED_HEADER] == "OutOfRange", fenced.text
        moved_out = patch("mine", {"metadata": {"labels": {"example.com/tenant": theirs}}})
        assert moved_out.status_code == 409 and moved_out.headers[FENCED_HEADER] == "OutOfRange", moved_out.text
        moved_in = patch("theirs", {"metadata": {"labels": {"example.com/tenant": mine}}})  # the cache says b's
        assert moved_in.status_code == 409 and moved_in.headers[FENCED_HEADER] == "OutOfRange", moved_in.text
        assert http.get(f"{rss}/mine").json()["metadata"]["labels"] == {"example.com/tenant": mine}
        # The header spelling of the declaration works as the agent's does.
        headers = {SHARD_BY_HEADER: "label", SHARD_LABEL_HEADER: "example.com/tenant", "User-Agent": token.user_agent()}
        assert patch("mine", {"metadata": {"annotations": {"n": "2"}}}, **headers).status_code == 200
        bad = patch("mine", note, **{SHARD_BY_HEADER: "label", SHARD_LABEL_HEADER: "not a key"})
        assert bad.status_code == 400 and "is not a label key" in bad.json()["message"]
