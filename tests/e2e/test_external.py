"""An unmodified controller sharded by its manager's endpoint: 2 -> 3 managers, a SIGKILL, spec changes.

The child is tests/e2e/external_child.py, a plain official-client script with
no rangeshard import. Each manager runs it with KUBECONFIG pointing at its
endpoint, which cuts the child's lists and watches to the instance's range,
tags its writes with the owner token, and resets its watches on a handover.
The API server's audit log is the proof that no stale owner wrote.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import httpx
from kubernetes import client as k8s

from tests.e2e.conftest import Cluster, Manager
from tests.e2e.kube import create_namespace
from tests.helpers import wait_until

CHILD = Path(__file__).with_name("external_child.py")
NS = "ext"
N = 16


def _controllers(drain: float = 1.0, down_file: Path | None = None) -> dict[str, object]:
    return {
        "ext": {
            "external": {
                "command": [sys.executable, str(CHILD), NS, *([str(down_file)] if down_file else [])],
                "shard": [{"resource": "configmaps", "by": "uid"}],
                "drainSeconds": drain,
            }
        }
    }


def _configmaps(api: object) -> list[k8s.V1ConfigMap]:
    return k8s.CoreV1Api(api).list_namespaced_config_map(NS, label_selector="app=ext").items


def _converged(api: object, want: int) -> bool:
    items = _configmaps(api)
    return len(items) == N and all((cm.data or {}).get("done") == str(want) for cm in items)


def _set_want(api: object, want: int) -> None:
    v1 = k8s.CoreV1Api(api)
    for cm in _configmaps(api):
        v1.patch_namespaced_config_map(cm.metadata.name, NS, {"data": {"want": str(want)}})


def _active(cluster: Cluster, n: int) -> bool:
    snap = cluster.snapshot("ext")
    return len(snap) == n and all(m.record.state.value == "active" and not m.record.is_locked for m in snap)


def _writers(api: object) -> set[str]:
    return {(cm.data or {}).get("by", "") for cm in _configmaps(api)}


def _written_by_owners(cluster: Cluster, api: object, controller_type: str = "ext") -> bool:
    """Each ConfigMap was last written by the instance whose range holds its uid now.

    The check of "every instance wrote" that does not depend on luck: with 16
    objects a quarter range holds none of them about once in a hundred runs, so
    the writers are compared with the owners, object by object.
    """
    items = _configmaps(api)
    owners = cluster.owners(controller_type, [cm.metadata.uid for cm in items])
    written = {cm.metadata.uid: (cm.data or {}).get("by") for cm in items}
    return len(owners) == len(items) and written == owners


def test_an_unmodified_controller_sharded_through_the_endpoint(fenced_cluster: Cluster) -> None:
    cluster = fenced_cluster
    api = cluster.api
    create_namespace(api, NS)
    v1 = k8s.CoreV1Api(api)
    managers: list[Manager] = [cluster.start_manager(_controllers()) for _ in range(2)]
    wait_until(lambda: _active(cluster, 2), 60, "two active instances")
    # Created once both are active: a first instance alone could otherwise handle every object.
    for i in range(N):
        v1.create_namespaced_config_map(
            NS, {"metadata": {"name": f"cm{i}", "labels": {"app": "ext"}}, "data": {"want": "1"}}
        )
    wait_until(lambda: _converged(api, 1), 60, "converged with two instances")
    wait_until(lambda: _written_by_owners(cluster, api), 30, "every object written by its owner")
    assert len(_writers(api)) == 2, _writers(api)  # each instance's child handled its half

    managers.append(cluster.start_manager(_controllers()))
    wait_until(lambda: _active(cluster, 3), 60, "three active instances")
    _set_want(api, 2)
    wait_until(lambda: _converged(api, 2), 60, "converged with three instances")
    assert _written_by_owners(cluster, api), _writers(api)  # every instance that owns an object wrote it

    # A manager SIGKILLed (its child dies with it): its range is taken over when its lease expires.
    victim = managers.pop(0)
    os.killpg(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait(10)
    _set_want(api, 3)
    wait_until(lambda: _active(cluster, 2), 60, "two instances after the kill")
    wait_until(lambda: _converged(api, 3), 60, "converged after the kill")
    assert _written_by_owners(cluster, api), _writers(api)
    assert victim.name not in {cluster.manager_of(w).name for w in _writers(api)}

    # The endpoint refuses a selector of the client's own.
    endpoint = _endpoint_url(managers[0])
    resp = httpx.get(f"{endpoint}/api/v1/namespaces/{NS}/configmaps", params={"shardSelector": "x"}, timeout=10)
    assert resp.status_code == 400 and resp.json()["kind"] == "Status"

    audit = cluster.workdir / "apiserver-audit.jsonl"
    # Every write of the child carries the owner token first, then the child's own User-Agent.
    child_writes = [
        e
        for e in _events(audit)
        if e.get("verb") == "patch" and "done" in ((e.get("requestObject") or {}).get("data") or {})
    ]
    assert child_writes
    for e in child_writes:
        agent = e["userAgent"]
        assert re.match(r"^rangeshard-controller-manager/\S+ \(ext/\S+-ext; lease [0-9a-f]+; epoch \d+\) \S", agent), (
            agent
        )
        assert "OpenAPI-Generator" in agent, agent  # the official client's own User-Agent follows
    cluster.assert_no_stale_owner_writes()
    cluster.assert_no_tracebacks()


def test_a_controller_down_longer_than_the_lease_ttl_gives_up_its_range_and_rejoins(fenced_cluster: Cluster) -> None:
    """Item 3: the instance leaves while its child stays down > leaseTTLSeconds, and joins again once it runs."""
    cluster = fenced_cluster
    api = cluster.api
    create_namespace(api, NS)
    v1 = k8s.CoreV1Api(api)
    for i in range(N):
        v1.create_namespaced_config_map(
            NS, {"metadata": {"name": f"cm{i}", "labels": {"app": "ext"}}, "data": {"want": "1"}}
        )
    down = cluster.workdir / "b.down"
    a = cluster.start_manager(_controllers())
    b = cluster.start_manager(_controllers(down_file=down))
    wait_until(lambda: _active(cluster, 2), 60, "two active instances")
    wait_until(lambda: _converged(api, 1), 60, "converged with two instances")
    ids = {cluster.manager_of(x.instance_id).name: x.instance_id for x in cluster.snapshot("ext")}
    a_id, b_id = ids[a.name], ids[b.name]

    down.touch()  # b's controller exits and keeps failing to start
    wait_until(lambda: [x.instance_id for x in cluster.snapshot("ext")] == [a_id], 60, "b left")
    assert b.proc.poll() is None, "the manager itself keeps running"
    _set_want(api, 2)
    wait_until(lambda: _converged(api, 2), 60, "a alone handles every object")
    assert _writers(api) == {a_id}
    assert "leaving the registry until it runs again" in b.log.read_text()

    down.unlink()  # b's controller starts again (after its restart backoff): b joins again
    wait_until(lambda: _active(cluster, 2), 90, "b joined again")
    assert b_id in {m.instance_id for m in cluster.snapshot("ext")}
    _set_want(api, 3)
    wait_until(lambda: _converged(api, 3), 60, "converged with both again")
    wait_until(lambda: _written_by_owners(cluster, api), 30, "each object written by its owner")
    cluster.assert_no_tracebacks()


def _events(path: Path) -> list[dict[str, object]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            continue
    return out


def _endpoint_url(m: Manager) -> str:
    for line in m.log.read_text().splitlines():
        if "endpoint for the external controller on " in line:
            return line.rsplit(" ", 1)[1]
    raise AssertionError(m.log.read_text()[-2000:])


def test_up_config_runs_an_external_controller(tmp_path: Path) -> None:
    """Item 1: ``rangeshard up --config FILE`` with an external entry runs the child under every manager."""
    from kubernetes import config as kubeconfig  # noqa: PLC0415

    from tests.e2e.test_up import run_cli_sync  # noqa: PLC0415

    cfg = tmp_path / "ext.yaml"
    cfg.write_text(
        json.dumps(
            {
                "etcd": {"endpoints": ["http://127.0.0.1:2379"]},
                "proxy": {"url": "http://127.0.0.1:8001"},
                "leaseTTLSeconds": 4,
                "metrics": {"host": "127.0.0.1", "port": 0},
                "controllers": _controllers(),
            }
        )
    )
    state = tmp_path / "state"
    up = run_cli_sync(
        [
            *("up", "--detach", "--managers", "2", "--state-dir", str(state), "--config", str(cfg)),
            *("--etcd-port", "0", "--apiserver-port", "0", "--proxy-port", "0"),
        ],
        timeout=150,
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        api = kubeconfig.new_client_from_config(str(state / "kubeconfig"))
        create_namespace(api, NS)
        v1 = k8s.CoreV1Api(api)
        for i in range(N):
            v1.create_namespaced_config_map(
                NS, {"metadata": {"name": f"cm{i}", "labels": {"app": "ext"}}, "data": {"want": "1"}}
            )
        wait_until(lambda: _converged(api, 1), 60, "converged under up")
        assert len(_writers(api)) == 2, _writers(api)  # each manager's child handled its half
    finally:
        down = run_cli_sync(["down", "--state-dir", str(state)], timeout=90)
    assert down.returncode == 0, down.stdout + down.stderr
