"""A foreground ``rangeshard up`` restarts a manager that exits, as a StatefulSet would (issue 38, item 3).

The managers here are real child processes that exit at once (``exit 1``, as
a manager whose watchdog gave up does); the supervisor is driven tick by tick
with the times it is given, so the backoff is checked without sleeping.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

from rich.console import Console

from controller_manager.process import ManagerProcess
from rangeshard.cli.statefile import Component, UpState, read_state, write_state
from rangeshard.cli.up import ManagerSupervisor
from rangeshard.core.process import process_start_time
from tests.helpers import wait_until


def _manager(tmp_path: Path, code: int) -> ManagerProcess:
    m = ManagerProcess("m0", [sys.executable, "-c", f"import sys; sys.exit({code})"], tmp_path / "m0.log")
    return m.start()


def test_an_exited_manager_is_restarted_with_backoff(tmp_path: Path) -> None:
    m = _manager(tmp_path, 1)
    first = m.pid
    assert first is not None
    me = os.getpid()
    component = Component(
        name="manager m0", kind="manager", pid=first, startTime=None, port=None, url=None, healthUrl=None
    )
    write_state(tmp_path, UpState(upPid=me, upStartTime=process_start_time(me), detached=False, components=[component]))
    out = io.StringIO()
    sup = ManagerSupervisor([m], tmp_path, Console(file=out, width=200))
    wait_until(lambda: m.returncode is not None, 10, "the manager to exit")

    now = 1000.0
    sup.check(m, now)  # noticed: restart due in 1 s
    assert "manager m0 exited with code 1" in out.getvalue() and "restarting it in 1s" in out.getvalue()
    sup.check(m, now + 0.5)
    assert m.pid == first and sup.restarts == {}
    sup.check(m, now + 1.0)
    assert sup.restarts == {"m0": 1} and m.pid != first
    state = read_state(tmp_path)
    assert state is not None and state.components[0].pid == m.pid
    assert "manager m0 restarted (pid " in out.getvalue()

    # It exits again within a minute: the backoff doubles.
    wait_until(lambda: m.returncode is not None, 10, "the restarted manager to exit")
    sup.check(m, now + 2.0)
    assert "restarting it in 2s" in out.getvalue()
    sup.check(m, now + 3.5)
    assert sup.restarts == {"m0": 1}
    sup.check(m, now + 4.0)
    assert sup.restarts == {"m0": 2}

    # Once stopping, nothing is restarted.
    wait_until(lambda: m.returncode is not None, 10, "the manager to exit again")
    sup.stop()
    sup.check(m, now + 100.0)
    sup.check(m, now + 200.0)
    assert sup.restarts == {"m0": 2}


def test_a_running_manager_is_left_alone(tmp_path: Path) -> None:
    m = ManagerProcess("m1", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "m1.log").start()
    try:
        sup = ManagerSupervisor([m], tmp_path, Console(file=io.StringIO()))
        sup.check(m, 0.0)
        sup.check(m, 100.0)
        assert sup.restarts == {} and m.running
    finally:
        m.kill()
