"""Children started by :func:`rangeshard.core.process.popen` die with the process (the thread) that started them.

A parent process starts ``sleep`` in a session of its own (as etcd, the API
server and the managers are started) and is then SIGKILLed: the kernel's
parent-death signal takes the child along, unless it was started ``detached``
(``up --detach``). The signal follows the thread that forked the child, which
is why every caller starts its children from a thread that outlives them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rangeshard.core.process import popen
from tests.helpers import wait_until

PARENT = """
import sys
from rangeshard.core.process import popen
child = popen(["sleep", "300"], start_new_session=True, detached=sys.argv[1] == "detached")
print(child.pid, flush=True)
sys.stdin.read()  # until the test kills us
"""


def _state(pid: int) -> str:
    """``R``, ``S``, ... from /proc (``Z`` a zombie, ``gone`` once reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return "gone"


def _sigkill_pending(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    pending = [int(line.split()[1], 16) for line in status.splitlines() if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask & (1 << (signal.SIGKILL - 1)) for mask in pending)


def _orphan_of_killed_parent(mode: str) -> int:
    """Start the parent, SIGKILL it once it started its child, reap it; the child's pid."""
    parent = popen([sys.executable, "-c", PARENT, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait(10)
        if parent.stdin is not None:
            parent.stdin.close()
        if parent.stdout is not None:
            parent.stdout.close()
    return child


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_dies_with_its_killed_parent() -> None:
    child = _orphan_of_killed_parent("attached")
    wait_until(lambda: _state(child) in ("Z", "gone"), 10, f"child {child} to die with its parent")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_detached_child_outlives_its_killed_parent() -> None:
    child = _orphan_of_killed_parent("detached")
    try:
        # The parent-death signal is sent while the parent exits, before we reaped it: none is pending.
        assert _state(child) in ("S", "R"), _state(child)
        assert not _sigkill_pending(child)
    finally:
        os.kill(child, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_signal_follows_the_starting_thread() -> None:
    """The documented caveat: a child started from a thread that ends dies with that thread."""
    started: list[subprocess.Popen[bytes]] = []
    spawner = threading.Thread(target=lambda: started.append(popen(["sleep", "300"])), name="short-lived-spawner")
    spawner.start()
    spawner.join(10)
    assert started[0].wait(10) == -signal.SIGKILL
