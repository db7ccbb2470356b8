"""The README's test command stops clean: one SIGINT or SIGTERM ends it within 10 s and leaves no process behind.

``scripts/test.sh`` runs (``RANGESHARD_TEST_PYTEST_ONLY=1``: no set-up, no
lint) two real end-to-end files on two pytest-xdist workers: the kopf
operator (etcd, the local API server, the proxy, managers and their kopf
children) and ``rangeshard up`` (its own etcd, API server, proxy and
managers, in sessions of their own). Once a kopf child and an ``up`` run,
the script gets one signal. Every process of the run carries a marker in its
environment (orphans are reparented, so descent cannot be followed):
afterwards none may remain, and the script's last-resort sweep must have
found nothing to kill (the parent-death signals and the process group did
the work).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rangeshard.core.process import popen
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "test.sh"
SUBSET = ["tests/e2e/test_external_kopf.py", "tests/e2e/test_up.py"]
MARK = "RANGESHARD_STOP_TEST_MARK"
STOP_WITHIN = 10.0

pytestmark = pytest.mark.slow


def marked(mark: str) -> dict[int, str]:
    """Live processes whose environment has ``MARK=mark``: pid -> command line (zombies have no environment)."""
    needle = f"{MARK}={mark}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _missing(running: dict[int, str]) -> list[str]:
    """What of the suite is not running yet: a kopf child of a manager, ``up`` and an etcd."""
    wanted = {"a kopf child": "-m kopf run", "rangeshard up": "rangeshard.cli.main up", "etcd": "etcdbin/etcd"}
    return [what for what, needle in wanted.items() if not any(needle in cmd for cmd in running.values())]


@pytest.fixture
def interruptible() -> Iterator[None]:
    """SIGINT not ignored in the script (a child inherits an ignored signal, and bash cannot trap it then)."""
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.usefixtures("interruptible")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_one_signal_stops_the_run_within_10s_and_leaves_no_process(sig: signal.Signals, tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RANGESHARD_TEST_"))}
    env |= {MARK: mark, "RANGESHARD_TEST_PYTEST_ONLY": "1", "RANGESHARD_TEST_WORKERS": "2"}
    out = tmp_path / "test-sh.out"
    args = ["-p", "no:cacheprovider", f"--basetemp={tmp_path / 'inner'}", *SUBSET]
    with out.open("wb") as log:
        script = popen(
            [str(SCRIPT), *args],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        wait_until(
            lambda: script.poll() is not None or not _missing(marked(mark)),
            90,
            "the run to start etcd, `up` and a manager's kopf child",
        )
        running = marked(mark)
        assert script.poll() is None, out.read_text(errors="replace")[-3000:]
        assert len(running) >= 10, running  # the script, pytest, 2 workers, etcd, API servers, managers, kopf, up
        signalled = time.monotonic()
        script.send_signal(sig)
        code = script.wait(STOP_WITHIN + 20)
        took = time.monotonic() - signalled
        output = out.read_text(errors="replace")
        left = marked(mark)
        assert took <= STOP_WITHIN, f"stopped after {took:.1f}s:\n{output[-3000:]}"
        assert code == -sig, output[-3000:]  # the script dies of the signal it got
        assert f"test.sh: SIG{sig.name[3:]}: stopping" in output, output[-3000:]
        assert left == {}, left
        assert "outlived the run" not in output, output[-3000:]
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            script.wait(10)
        for pid in marked(mark):  # whatever a failure left behind: never leak into the rest of the suite
            os.kill(pid, signal.SIGKILL)
