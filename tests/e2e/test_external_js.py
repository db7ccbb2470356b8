"""The official JavaScript client's informer, unmodified, sharded by its managers: 2 -> 3 managers, a SIGKILL.

``tests/e2e/js/informer.mjs`` uses ``@kubernetes/client-node``'s
``makeInformer`` (installed by ``scripts/test.sh`` with ``npm ci --prefix
tests/e2e/js``) and knows nothing of rangeshard. A handover reaches it as a
watch ending with ``ERROR 410``; the informer relists by itself. Every object
converges after every step, every instance wrote, and the API server's audit
log shows no stale-owner write.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from kubernetes import client as k8s

from tests.e2e.conftest import Cluster, Manager
from tests.e2e.kube import create_namespace
from tests.e2e.test_external import NS, N, _active, _converged, _set_want, _writers, _written_by_owners
from tests.helpers import wait_until

JS = Path(__file__).with_name("js")


def _controllers() -> dict[str, object]:
    node = shutil.which("node")
    assert node, "node (Node.js) is not on PATH"
    assert (JS / "node_modules" / "@kubernetes" / "client-node").is_dir(), (
        "@kubernetes/client-node is not installed: npm ci --prefix tests/e2e/js (.ci/run does it)"
    )
    return {
        "ext": {
            "external": {
                "command": [node, str(JS / "informer.mjs"), NS],
                "shard": [{"resource": "configmaps", "by": "uid"}],
                "drainSeconds": 1,
            }
        }
    }


def test_the_javascript_informer_sharded_unmodified(fenced_cluster: Cluster) -> None:
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
    assert len(_writers(api)) == 2, _writers(api)

    managers.append(cluster.start_manager(_controllers()))
    wait_until(lambda: _active(cluster, 3), 60, "three active instances")
    _set_want(api, 2)
    wait_until(lambda: _converged(api, 2), 60, "converged with three instances")
    wait_until(lambda: _written_by_owners(cluster, api), 30, "every object written by its owner")

    victim = managers.pop(0)
    os.killpg(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait(10)
    _set_want(api, 3)
    wait_until(lambda: _active(cluster, 2), 60, "two instances after the kill")
    wait_until(lambda: _converged(api, 3), 60, "converged after the kill")
    wait_until(lambda: _written_by_owners(cluster, api), 30, "every object written by its owner after the kill")
    assert victim.name not in {cluster.manager_of(w).name for w in _writers(api)}

    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "controller_manager.audit",
            "--apiserver-audit",
            str(cluster.workdir / "apiserver-audit.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert " 0 stale-owner write(s)" in check.stdout, check.stdout
    for m in managers:
        assert "informer started" in m.log.read_text()
    cluster.assert_no_tracebacks()
