"""The one readiness routine (``core.process.wait_ready``) and the one manager wrapper (``ManagerProcess``).

Real child processes (``python -c``), no fakes: a child that exits fails the
wait at once with its exit code and log tail, a timeout says what the check
saw last, tolerated exits pass, a stop event ends the wait; a manager
process keeps its handle after a stop so its exit code can be read.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from controller_manager.process import ManagerProcess, ManagerProcessError
from rangeshard.core.errors import RangeshardError
from rangeshard.core.process import python_module_command
from rangeshard.localcluster import LocalCluster, LocalClusterError
from tests.helpers import wait_until


def _child(tmp_path: Path, name: str, code: str) -> ManagerProcess:
    return ManagerProcess(name, [sys.executable, "-c", code], tmp_path / f"{name}.log", new_session=False).start()


def test_an_exiting_child_fails_the_wait_at_once_with_its_code_and_log_tail(tmp_path: Path) -> None:
    child = _child(tmp_path, "crash", "print('config is broken'); raise SystemExit(3)")
    child.wait(30)
    started = time.monotonic()
    with pytest.raises(ManagerProcessError, match=r"manager crash exited with code 3: config is broken"):
        child.wait_until(lambda: (False, "not yet"), timeout=60)
    assert time.monotonic() - started < 10  # not after the timeout


def test_a_timeout_says_what_the_check_saw_and_stops_the_child(tmp_path: Path) -> None:
    child = _child(tmp_path, "slow", "import time; print('starting', flush=True); time.sleep(60)")
    with pytest.raises(ManagerProcessError, match=r"manager slow not ready after 0\.3s \(503 warming up\)"):
        child.wait_until(lambda: (False, "503 warming up"), timeout=0.3)
    assert not child.alive  # nothing half-started stays behind


def test_ready_returns_and_tolerated_exits_pass(tmp_path: Path) -> None:
    from rangeshard.core.process import wait_ready  # noqa: PLC0415

    gone = _child(tmp_path, "gone", "pass")
    assert gone.wait(30) == 0
    calls: list[int] = []

    def check() -> tuple[bool, str]:
        calls.append(1)
        return len(calls) >= 3, f"{len(calls)} call(s)"

    wait_ready(check, 30, what="group", error=RangeshardError, children=[gone], tolerated_exits=(0,), interval=0.01)
    assert len(calls) == 3


def test_a_timeout_error_type_and_a_stop_event(tmp_path: Path) -> None:
    from rangeshard.core.process import wait_ready  # noqa: PLC0415

    with pytest.raises(AssertionError, match=r"group not ready after 0\.1s \(never\): see the logs"):
        wait_ready(
            lambda: (False, "never"),
            0.1,
            what="group",
            error=RangeshardError,
            hint=lambda: "see the logs",
            timeout_error=AssertionError,
            interval=0.01,
        )
    stop = threading.Event()
    stop.set()
    with pytest.raises(RangeshardError, match="interrupted while waiting for group"):
        wait_ready(lambda: (False, "never"), 30, what="group", error=RangeshardError, stop=stop)


def test_terminate_is_a_graceful_stop_and_the_handle_stays(tmp_path: Path) -> None:
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); print('up', flush=True); time.sleep(60)"
    m = _child(tmp_path, "leaver", code)
    wait_until(lambda: "up" in m.log_tail(), 30, "the child's SIGTERM handler")
    assert m.terminate(20) == 0
    assert m.proc is not None and m.proc.returncode == 0
    stubborn = _child(
        tmp_path,
        "stubborn",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)",
    )
    wait_until(lambda: "up" in stubborn.log_tail(), 30, "the child ignoring SIGTERM")
    assert stubborn.terminate(0.3) == -signal.SIGKILL
    m.stop()  # idempotent on a stopped child
    assert m.terminate() == 0


def test_a_manager_that_was_never_started_cannot_be_terminated(tmp_path: Path) -> None:
    m = ManagerProcess.of_config("m0", tmp_path / "c.yaml", tmp_path / "m0.log", instance_prefix="m0")
    cli = python_module_command("rangeshard.cli.main", "--log-level", "info", "controller-manager")
    assert m.command == [*cli, "--config", str(tmp_path / "c.yaml"), "--instance-prefix", "m0"]
    assert m.returncode is None and not m.alive and m.log_tail() == ""
    with pytest.raises(ManagerProcessError, match="manager m0 was not started"):
        m.terminate()
    m.stop()  # nothing to stop


def test_a_local_cluster_names_what_is_not_started(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    for part in ("etcd_url", "api_url", "proxy_url"):
        with pytest.raises(LocalClusterError, match="not started"):
            getattr(cluster, part)
    assert cluster.parts() == []
    cluster.stop()  # idempotent, nothing started
    assert LocalCluster(tmp_path, external_etcd="http://127.0.0.1:1").etcd_url == "http://127.0.0.1:1"


def test_a_part_that_exits_fails_start_at_once_and_nothing_stays_behind(tmp_path: Path) -> None:
    """An API server that exits (a bad flag) fails ``start`` with its log tail at once; the etcd started is stopped."""
    from local_apiserver.process import LocalApiServerError  # noqa: PLC0415

    cluster = LocalCluster(tmp_path, etcd_fast=True, apiserver_args=["--no-such-flag"])
    started = time.monotonic()
    with pytest.raises(
        LocalApiServerError, match=r"local API server on http://127\.0\.0\.1:\d+ exited with code 2: .*"
    ):
        cluster.start()
    assert time.monotonic() - started < 25  # not the 30 s readiness timeout
    assert cluster.etcd is not None and not cluster.etcd.running
    assert cluster.proxy is None


def test_a_proxy_that_exits_at_start_fails_at_once_with_its_log_tail(tmp_path: Path) -> None:
    from range_filter_proxy.process import ProxyProcess, ProxyProcessError  # noqa: PLC0415

    # An option the proxy's CLI refuses: it exits 2 before it serves anything.
    proxy = ProxyProcess("http://127.0.0.1:9", log_file=tmp_path / "proxy.log", extra_args=["--no-such-option"])
    started = time.monotonic()
    with pytest.raises(ProxyProcessError, match=r"proxy exited with code 2: .*no-such-option"):
        proxy.start(timeout=60)
    assert time.monotonic() - started < 30  # at once, not after the timeout
    assert not proxy.running


def test_a_proxy_that_never_gets_ready_is_stopped_and_says_what_it_saw(tmp_path: Path) -> None:
    from range_filter_proxy.process import ProxyProcess, ProxyProcessError  # noqa: PLC0415

    # Nothing listens upstream: the proxy runs but its caches never sync, so /readyz stays 503.
    proxy = ProxyProcess("http://127.0.0.1:9", resources=["configmaps"], log_file=tmp_path / "proxy.log")
    # (Under load the port may not even be open yet: what was seen is then the connection error.)
    with pytest.raises(ProxyProcessError, match=r"proxy not ready after 5s \(.+\)"):
        proxy.start(timeout=5)
    assert not proxy.running
