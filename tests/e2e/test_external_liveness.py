"""A wedged external controller is killed and restarted by its manager's liveness probe (issue 38, item 1).

A real ``rangeshard controller-manager`` process runs
``tests/controller_manager/healthz_child.py`` (serves ``/healthz`` on
``$(RANGESHARD_PROBE_PORT)``, a port the manager picked: ``httpGet.port: 0``)
with ``livenessProbe: {httpGet: {path: /healthz, port: 0}, periodSeconds: 1,
failureThreshold: 2}``. The test SIGSTOPs the child: the probe times out
twice, the manager logs a WARNING with the probe's answer, SIGKILLs the child
and restarts it (a new pid), counts the restart in
``rangeshard_external_child_restarts_total`` (the probes in
``rangeshard_external_liveness_probes_total``), and the instance keeps its
place in the registry (the child was down for far less than
``leaseTTLSeconds``).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

from tests.e2e.conftest import Cluster
from tests.helpers import wait_until

HEALTHZ_CHILD = Path(__file__).resolve().parents[1] / "controller_manager" / "healthz_child.py"


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_wedged_external_controller_is_killed_and_restarted_by_its_probe(cluster: Cluster) -> None:
    pids = cluster.workdir / "child.pids"
    controllers = {
        "ext": {
            "external": {
                "command": [sys.executable, str(HEALTHZ_CHILD), str(pids), "$(RANGESHARD_PROBE_PORT)"],
                "shard": [{"resource": "configmaps", "by": "uid"}],
                "livenessProbe": {
                    "httpGet": {"path": "/healthz", "port": 0},
                    "initialDelaySeconds": 1,
                    "periodSeconds": 1,
                    "timeoutSeconds": 1,
                    "failureThreshold": 2,
                },
            }
        }
    }
    manager = cluster.start_manager(controllers)
    (first,) = wait_until(lambda: _pids(pids), 60, "the child to listen")
    wait_until(lambda: len(_pids(Path(f"{pids}.hits"))) >= 2, 30, "two passing probes")
    (member,) = wait_until(lambda: cluster.snapshot("ext"), 60, "the instance to register")
    instance = member.instance_id

    os.kill(first, signal.SIGSTOP)  # wedged: its port accepts connections, nothing answers
    try:
        wait_until(lambda: len(_pids(pids)) == 2, 30, "the child to be restarted")
    finally:
        if _alive(first):
            os.kill(first, signal.SIGCONT)
    second = _pids(pids)[1]
    assert second != first
    wait_until(lambda: not _alive(first), 10, "the wedged child to be gone")

    log = manager.log.read_text(errors="replace")
    found = re.search(
        r"WARNING .*ext: liveness probe failed 2 times \(GET http://127\.0\.0\.1:(\d+)/healthz: timed out after 1s\): "
        r"killing the controller \(SIGKILL\)",
        log,
    )
    assert found, log[-3000:]
    assert "ext: the controller exited with code -9; restarting in 1s" in log
    assert manager.metric("rangeshard_external_child_restarts_total", type="ext") == 1.0
    assert manager.metric("rangeshard_external_liveness_probes_total", type="ext", result="failed") >= 2
    # The new process is probed too, and passes: it stays.
    wait_until(lambda: _pids(Path(f"{pids}.hits")).count(second) >= 2, 30, "two passing probes of the new child")
    assert _pids(pids) == [first, second]
    assert [m.instance_id for m in cluster.snapshot("ext")] == [instance], "down < leaseTTLSeconds: it kept its range"
    assert "leaving the registry" not in manager.log.read_text(errors="replace")
    cluster.assert_no_tracebacks()
