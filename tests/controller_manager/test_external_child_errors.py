"""A child that cannot run says why at once, shows its /proc state, and leaves no file behind (issue 48, 4-6).

* A command that is not found, not executable, or exits at once: ``child.error``
  (the record's, read by ``up`` and ``status``) names the command and why (not
  found / permission denied / exit code and the last lines of its output) on
  the first attempt, not after a timeout.
* A SIGSTOPped child is ``stopped``, not ``running`` (``/proc/<pid>/stat``).
* Its kubeconfig directory is removed on stop; one left by a SIGKILLed
  manager (its pid is gone) is removed by the next child that starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from controller_manager.external import Child
from controller_manager.external.child import sweep_leftovers
from registry.models import ChildInfo
from tests.helpers import wait_until

ENDPOINT = "http://127.0.0.1:40123"


def _child(command: list[str]) -> Child:
    return Child("gadget", command, ENDPOINT, controller_type="gadget", instance_id="m-7")


def _error_soon(child: Child) -> str:
    child.start()
    try:
        return str(wait_until(lambda: child.info()["error"], 10, "the child's error"))
    finally:
        child.stop(grace=1)


def test_not_found_is_said_at_once() -> None:
    error = _error_soon(_child(["kopf-not-installed-here", "run"]))
    assert error.startswith("cannot start 'kopf-not-installed-here': not found"), error
    info = ChildInfo.model_validate({"state": "restarting", "error": error})
    assert "cannot start 'kopf-not-installed-here': not found" in info.describe()


def test_permission_denied_is_said(tmp_path: Path) -> None:
    script = tmp_path / "op.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    error = _error_soon(_child([str(script)]))
    assert error == f"cannot start {str(script)!r}: permission denied (is it executable?)", error


def test_an_exit_names_the_code_and_the_last_lines() -> None:
    code = "import sys; [print(f'line {i}', flush=True) for i in range(9)]; sys.exit(3)"
    error = _error_soon(_child([sys.executable, "-c", code]))
    assert "exited with code 3" in error and "line 4 | line 5 | line 6 | line 7 | line 8" in error, error
    assert "line 3" not in error, "the last lines only"


def test_a_stopped_child_is_not_running(tmp_path: Path) -> None:
    child = _child([sys.executable, "-c", "import time; time.sleep(60)"])
    child.start()
    try:
        proc = wait_until(lambda: child.proc, 10, "the child")
        assert wait_until(lambda: child.info()["state"] == "running", 10, "running")
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until(lambda: child.info()["state"] == "stopped", 10, "stopped in /proc")
        assert ChildInfo.model_validate(child.info()).describe().startswith(f"stopped pid {proc.pid}")
        os.kill(proc.pid, signal.SIGCONT)
        wait_until(lambda: child.info()["state"] == "running", 10, "running again")
    finally:
        child.stop(grace=1)


def test_no_kubeconfig_left_after_a_stop_or_a_sigkill(tmp_path: Path) -> None:
    child = _child([sys.executable, "-c", "import time; time.sleep(60)"])
    kept = child.kubeconfig.parent
    assert kept.name.startswith(f"rangeshard-external-gadget-{os.getpid()}-")
    child.start()
    child.stop(grace=1)
    assert not kept.exists(), "removed on a clean stop"

    # A manager killed with SIGKILL: its directory (named with its pid) stays until the next start.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    left = Path(tempfile.mkdtemp(prefix=f"rangeshard-external-gadget-{pid}-"))
    (left / "kubeconfig").write_text("x")
    live = Path(tempfile.mkdtemp(prefix=f"rangeshard-external-gadget-{os.getpid()}-"))
    try:
        assert left in sweep_leftovers()
        assert not left.exists() and live.exists(), "only a gone process's directory is removed"
        again = _child(["true"])
        again.stop(grace=1)
    finally:
        live.rmdir()


def test_the_managers_venv_comes_first_on_the_childs_path(tmp_path: Path) -> None:
    """`.venv/bin/pip install kopf` then `.venv/bin/rangeshard up`: `kopf` is found without activating the venv."""
    out = tmp_path / "path"
    code = f"import os; open({str(out)!r}, 'w').write(os.environ['PATH'])"
    child = _child(["python", "-c", code])  # by name: found through the child's PATH
    child.start()
    try:
        wait_until(out.exists, 10, "the child to report its PATH")
    finally:
        child.stop(grace=1)
    first = out.read_text().split(os.pathsep)[0]
    assert first == os.path.dirname(sys.executable)
