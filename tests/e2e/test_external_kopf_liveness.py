"""The kopf example's liveness probe, as its config spells it (issue 38, item 1).

``examples/kopf-gadgets/rangeshard.yaml`` turns on kopf's own liveness
endpoint (``--liveness=http://127.0.0.1:$(RANGESHARD_PROBE_PORT)/healthz``,
answered by kopf's event loop) and probes it (``httpGet.port: 0``: the
manager picks the port). A real manager runs that entry (only the ``kopf``
executable and ``operator.py`` are spelled as paths, and the probe's period
is shortened for the test): kopf answers the probe; SIGSTOPped, it is
SIGKILLed and restarted, and the restarted kopf handles a new Gadget.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client as k8s

from tests.e2e.conftest import Cluster
from tests.e2e.test_external_kopf import install_gadgets
from tests.helpers import wait_until

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kopf-gadgets"
NS = "kl"
GROUP, VERSION, PLURAL = "bars.example.org", "v1", "gadgets"


def _example_entry() -> dict[str, Any]:
    """The example's ``gadget`` entry, runnable from here (kopf of this interpreter, operator.py by path)."""
    entry: dict[str, Any] = yaml.safe_load((EXAMPLE / "rangeshard.yaml").read_text())["controllers"]["gadget"]
    external = entry["external"]
    command: list[str] = []
    for arg in external["command"]:
        if arg == "kopf":
            command += [sys.executable, "-m", "kopf"]
        else:
            command.append(str(EXAMPLE / arg) if arg == "operator.py" else arg)
    external["command"] = command
    return entry


def _started(log: str) -> list[tuple[str, int]]:
    """``(kopf's liveness URL, pid)`` of every start of the child, from the manager's log."""
    found = re.findall(r"gadget: started .* --liveness=(\S+) .* \(pid (\d+)\)", log)
    return [(url, int(pid)) for url, pid in found]


def test_the_kopf_examples_probe_restarts_a_wedged_kopf(cluster: Cluster) -> None:
    api = cluster.api
    custom = install_gadgets(api, NS)

    entry = _example_entry()
    probe = entry["external"]["livenessProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": 0}
    probe.update({"periodSeconds": 1, "failureThreshold": 2})  # faster than the example's 3 x 10 s
    manager = cluster.start_manager({"gadget": entry})

    def log() -> str:
        return manager.log.read_text(errors="replace")

    ((url, first),) = wait_until(lambda: _started(log()), 60, "kopf to start")
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/healthz", url), url

    def answers() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(answers, 60, "kopf's liveness endpoint")

    def probes(result: str) -> float:
        return manager.metric("rangeshard_external_liveness_probes_total", type="gadget", result=result)

    # Past the initial delay, the manager's probes pass: nothing is killed.
    wait_until(lambda: probes("successful") >= 2, 30, "two passing probes")
    assert len(_started(log())) == 1

    os.kill(first, signal.SIGSTOP)  # a wedged operator: its event loop answers nothing
    try:
        wait_until(lambda: len(_started(log())) == 2, 60, "kopf to be restarted")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(first, signal.SIGCONT)
    text = log()
    assert re.search(
        rf"WARNING .*gadget: liveness probe failed 2 times \(GET {re.escape(url)}: timed out after 2s\): "
        r"killing the controller \(SIGKILL\)",
        text,
    ), text[-3000:]
    (_, second) = _started(text)[1]
    assert second != first
    passed = probes("successful")
    wait_until(answers, 60, "the restarted kopf's liveness endpoint")

    # The restarted kopf does its work.
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Gadget", "metadata": {"name": "after"}, "spec": {"size": 7}}
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)

    def handled() -> bool:
        try:
            cm = k8s.CoreV1Api(api).read_namespaced_config_map("after-gadget", NS)
        except k8s.ApiException:
            return False
        return (cm.data or {}).get("size") == "7"

    wait_until(handled, 90, "the restarted kopf to handle a new Gadget")
    assert manager.metric("rangeshard_external_child_restarts_total", type="gadget") == 1.0
    assert probes("failed") >= 2
    wait_until(lambda: probes("successful") >= passed + 2, 30, "two passing probes of the restarted kopf")
    assert len(_started(log())) == 2, "the restarted kopf passes its probes"
    cluster.assert_no_tracebacks()
