"""An external controller's liveness probe as its :class:`Child` runs it (issue 38, item 1), without a cluster.

* A child that stops answering (SIGSTOP: its port still accepts, nothing
  answers) fails its ``httpGet`` probe ``failureThreshold`` times, is
  SIGKILLed with a WARNING carrying the probe's answer, and the restart loop
  starts a new process (a new pid), which is probed again and left alone.
* An ``exec`` probe does the same; every restart and every probe are reported (``on_restart``,
  ``on_probe``: the metrics).
* ``httpGet.port: 0``: the manager picks the port and gives it to the child as
  ``RANGESHARD_PROBE_PORT`` and as ``$(RANGESHARD_PROBE_PORT)`` in its command.
* Stopping the child stops its prober thread.

The child is ``tests/controller_manager/healthz_child.py``; every wait polls with a deadline.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from controller_manager.config import LivenessProbeSection
from controller_manager.external import Child, expand
from tests.helpers import wait_until

HEALTHZ_CHILD = Path(__file__).with_name("healthz_child.py")


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _messages(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def test_a_wedged_child_is_killed_and_restarted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pids = tmp_path / "pids"
    probe = LivenessProbeSection.model_validate(
        {
            "httpGet": {"path": "/healthz", "port": 0},
            "initialDelaySeconds": 1,
            "periodSeconds": 1,
            "timeoutSeconds": 1,
            "failureThreshold": 2,
        }
    )
    command = [sys.executable, str(HEALTHZ_CHILD), str(pids), "$(RANGESHARD_PROBE_PORT)"]
    child = Child(
        "gadget", command, "http://127.0.0.1:1", controller_type="gadget", instance_id="m-1", liveness_probe=probe
    )
    port = child.variables["RANGESHARD_PROBE_PORT"]
    with caplog.at_level(logging.INFO, logger="controller_manager"):
        child.start()
        try:
            (first,) = wait_until(lambda: _pids(pids), 30, "the child to listen")
            wait_until(lambda: _hits(pids, first) >= 1, 30, "a passing probe")
            proc = child.proc
            assert proc is not None and proc.pid == first
            os.kill(first, signal.SIGSTOP)  # wedged: the port accepts, nothing answers
            wait_until(lambda: len(_pids(pids)) == 2, 60, "a new process")
            assert proc.returncode == -signal.SIGKILL, proc.returncode
            second = _pids(pids)[1]
            assert second != first and child.proc is not None and child.proc.pid == second
            warnings = [m for m in _messages(caplog, logging.WARNING) if "liveness probe failed" in m]
            assert warnings == [
                f"gadget: liveness probe failed 2 times (GET http://127.0.0.1:{port}/healthz: timed out after 1s): "
                "killing the controller (SIGKILL)"
            ]
            assert "gadget: the controller exited with code -9; restarting in 1s" in _messages(caplog, logging.WARNING)
            # The new process is probed again (after its own initial delay) and passes: it is left alone.
            wait_until(lambda: _hits(pids, second) >= 2, 60, "two passing probes of the new process")
            assert len(_pids(pids)) == 2 and child.running
        finally:
            child.stop(grace=2)
    assert not [t for t in threading.enumerate() if t.name == "external-gadget-liveness"]


def _hits(pids: Path, pid: int) -> int:
    """``/healthz`` requests process ``pid`` answered."""
    return _pids(Path(f"{pids}.hits")).count(pid)


def test_an_exec_probe_restarts_its_child_and_every_restart_is_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pids, healthy = tmp_path / "pids", tmp_path / "healthy"
    healthy.touch()
    code = "import os, sys, time; open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); time.sleep(600)"
    probe = LivenessProbeSection.model_validate(
        {"exec": {"command": ["cat", str(healthy)]}, "periodSeconds": 1, "failureThreshold": 1}
    )
    restarts: list[int] = []
    results: list[bool] = []
    child = Child(
        "gadget",
        [sys.executable, "-c", code, str(pids)],
        "http://127.0.0.1:1",
        controller_type="gadget",
        instance_id="m-1",
        liveness_probe=probe,
        on_restart=lambda: restarts.append(1),
        on_probe=lambda result: results.append(result.ok),
    )
    assert "RANGESHARD_PROBE_PORT" not in child.variables
    with caplog.at_level(logging.INFO, logger="controller_manager"):
        child.start()
        try:
            wait_until(lambda: _pids(pids), 10, "the child to start")
            wait_until(lambda: results, 10, "a probe")
            healthy.unlink()
            wait_until(lambda: restarts, 10, "the child to be killed")
            healthy.touch()
            wait_until(lambda: len(_pids(pids)) == 2, 10, "a new process")
        finally:
            child.stop(grace=2)
    assert restarts == [1]
    assert results[0] is True and False in results  # every probe that counted is reported (a metric)
    (warning,) = [m for m in _messages(caplog, logging.WARNING) if "liveness probe failed" in m]
    assert warning.startswith("gadget: liveness probe failed 1 times (exit code 1: cat: "), warning
    assert warning.endswith("No such file or directory): killing the controller (SIGKILL)"), warning


def test_the_probe_port_reaches_the_child_through_its_environment(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    probe = LivenessProbeSection.model_validate({"httpGet": {"path": "/healthz", "port": 0}, "periodSeconds": 1})
    child = Child(
        "gadget",
        [sys.executable, str(HEALTHZ_CHILD), str(pids)],  # the port from $RANGESHARD_PROBE_PORT
        "http://127.0.0.1:1",
        controller_type="gadget",
        instance_id="m-1",
        liveness_probe=probe,
    )
    port = int(child.variables["RANGESHARD_PROBE_PORT"])
    assert 0 < port < 65536
    child.start()
    try:
        wait_until(lambda: _pids(pids), 10, "the child to listen")
        assert child.prober is not None
        assert child.prober.describe() == f"GET http://127.0.0.1:{port}/healthz"
        wait_until(lambda: child.prober is not None and child.prober.check().ok, 10, "the probe to pass")
    finally:
        child.stop(grace=2)


def test_a_fixed_probe_port_is_given_as_is() -> None:
    probe = LivenessProbeSection.model_validate({"httpGet": {"port": 8081}})
    child = Child("g", ["true"], "http://127.0.0.1:1", controller_type="g", instance_id="i", liveness_probe=probe)
    assert child.variables["RANGESHARD_PROBE_PORT"] == "8081"


def test_expand_replaces_the_managers_variables_as_the_kubelet_spells_them() -> None:
    variables = {"RANGESHARD_PROBE_PORT": "8081", "RANGESHARD_INSTANCE_ID": "m-1"}
    assert expand("--liveness=http://0.0.0.0:$(RANGESHARD_PROBE_PORT)/healthz", variables) == (
        "--liveness=http://0.0.0.0:8081/healthz"
    )
    assert expand("$(RANGESHARD_INSTANCE_ID)-$(RANGESHARD_PROBE_PORT)", variables) == "m-1-8081"
    assert expand("$(HOME) $(UNSET) $HOME ${HOME} $$ $(", variables) == "$(HOME) $(UNSET) $HOME ${HOME} $$ $("
    assert expand("$$(RANGESHARD_PROBE_PORT)", variables) == "$(RANGESHARD_PROBE_PORT)"
