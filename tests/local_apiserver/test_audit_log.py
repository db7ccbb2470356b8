"""The local API server's audit log (--audit-log-path, --audit-level): one audit.k8s.io/v1 Event per request."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from local_apiserver.process import LocalApiServerProcess
from rangeshard.core.etcdserver import EtcdServer
from tests import protobuf_wire as pw


def _events(path: Path, want: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        if len(lines) >= want or time.monotonic() > deadline:
            return [json.loads(line) for line in lines]
        time.sleep(0.05)


@pytest.fixture(scope="module", params=["Metadata", "RequestResponse"])
def audited(
    request: pytest.FixtureRequest, etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path, str]]:
    level = str(request.param)
    tmp = tmp_path_factory.mktemp("audit")
    audit = tmp / "audit.jsonl"
    proc = LocalApiServerProcess(
        etcd_server.url,
        prefix=f"/test-audit-{uuid.uuid4().hex[:8]}",
        log_file=tmp / "apiserver.log",
        extra_args=["--audit-log-path", str(audit), "--audit-level", level],
    )
    proc.start()
    yield proc.url, audit, level
    proc.stop()


def test_one_event_per_request_with_object_ref(audited: tuple[str, Path, str]) -> None:
    url, audit, level = audited
    ns = f"a-{uuid.uuid4().hex[:6]}"
    agent = "rangeshard-controller-manager/0.1 (replicaset/m1-replicaset; lease 1a2b; epoch 7)"
    with httpx.Client(base_url=url, headers={"User-Agent": agent}, timeout=10) as http:
        before = len(_events(audit, 0, 0))
        assert http.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201
        rs = {
            "metadata": {"generateName": "web-"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
            },
        }
        created = http.post(f"/apis/apps/v1/namespaces/{ns}/replicasets", json=rs)
        assert created.status_code == 201, created.text
        name, uid = created.json()["metadata"]["name"], created.json()["metadata"]["uid"]
        scaled = http.patch(
            f"/apis/apps/v1/namespaces/{ns}/replicasets/{name}/scale",
            content=b'{"spec":{"replicas":3}}',
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert scaled.status_code == 200, scaled.text
        missing = http.delete(f"/apis/apps/v1/namespaces/{ns}/replicasets/nope")
        assert missing.status_code == 404
    events = _events(audit, before + 4)[before:]
    assert len(events) == 4
    for ev in events:
        assert ev["kind"] == "Event" and ev["apiVersion"] == "audit.k8s.io/v1"
        assert ev["stage"] == "ResponseComplete" and ev["level"] == level
        assert ev["userAgent"] == agent
        assert uuid.UUID(ev["auditID"])
        assert ev["requestReceivedTimestamp"] <= ev["stageTimestamp"]
        assert ev["requestReceivedTimestamp"].endswith("Z")
    create_ns, create_rs, scale, delete = events
    assert create_ns["verb"] == "create" and create_ns["objectRef"]["resource"] == "namespaces"
    ref = create_rs["objectRef"]
    assert create_rs["verb"] == "create" and create_rs["responseStatus"]["code"] == 201
    assert ref["resource"] == "replicasets" and ref["apiGroup"] == "apps" and ref["namespace"] == ns
    assert ref["name"] == name and ref["uid"] == uid
    assert scale["verb"] == "patch" and scale["objectRef"]["subresource"] == "scale"
    assert scale["objectRef"]["name"] == name
    assert delete["verb"] == "delete" and delete["responseStatus"]["code"] == 404
    if level == "Metadata":
        assert all("requestObject" not in ev and "responseObject" not in ev for ev in events)
    else:
        assert create_rs["requestObject"]["metadata"]["generateName"] == "web-"
        assert create_rs["responseObject"]["metadata"]["uid"] == uid
        assert scale["requestObject"] == {"spec": {"replicas": 3}}


def test_protobuf_request_objects_are_recorded_as_json(audited: tuple[str, Path, str]) -> None:
    """As kube-apiserver: a protobuf body's requestObject is the decoded object (DeleteOptions too)."""
    url, audit, level = audited
    ns = f"p-{uuid.uuid4().hex[:6]}"
    headers = {"content-type": pw.PROTOBUF}
    with httpx.Client(base_url=url, timeout=10) as http:
        assert http.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).status_code == 201
        before = len(_events(audit, 0, 0))
        configmap = pw.body("v1", "ConfigMap", pw.meta("cm") + pw.field(2, pw.field(1, b"k") + pw.field(2, b"v")))
        assert http.post(f"/api/v1/namespaces/{ns}/configmaps", content=configmap, headers=headers).status_code == 201
        options = pw.body("v1", "DeleteOptions", pw.field(4, b"Orphan"))
        deleted = http.request("DELETE", f"/api/v1/namespaces/{ns}/configmaps/cm", content=options, headers=headers)
        assert deleted.status_code == 200
        unknown = pw.body("v1", "ConfigMap", pw.meta("x") + pw.field(99, 1))
        assert http.post(f"/api/v1/namespaces/{ns}/configmaps", content=unknown, headers=headers).status_code == 415
    create, delete, refused = _events(audit, before + 3)[before:]
    assert "requestObject" not in refused and refused["responseStatus"]["code"] == 415
    if level == "Metadata":
        assert "requestObject" not in create and "requestObject" not in delete
        return
    assert create["requestObject"] == {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"name": "cm", "creationTimestamp": None},
        "data": {"k": "v"},
    }
    assert delete["requestObject"] == {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Orphan"}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "rangeshard.cli.main", "local-apiserver", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def test_bad_audit_options_exit_2(tmp_path: Path) -> None:
    bad_level = _cli("--audit-log-path", str(tmp_path / "a"), "--audit-level", "Everything")
    assert bad_level.returncode == 2 and "--audit-level" in bad_level.stderr
    bad_dir = _cli("--audit-log-path", str(tmp_path / "no" / "such" / "a.log"))
    assert bad_dir.returncode == 2 and "--audit-log-path" in bad_dir.stderr
