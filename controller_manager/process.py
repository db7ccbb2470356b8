"""A ``rangeshard controller-manager`` child process: the one launcher and wrapper.

Purpose
    ``rangeshard up``, the test kit (:mod:`rangeshard.testing`), the e2e
    tests and the benchmarks all start managers as child processes.
    :class:`ManagerProcess` is the process (output appended to a log file,
    stdin closed, optionally in its own session), started, waited for,
    stopped and read the same way by every launcher;
    :meth:`ManagerProcess.of_config` builds the command line. A benchmark's
    own manager program (``python -m bench.scaleout_manager``) is a
    :class:`ManagerProcess` with another command.

Invariants
    * The child runs ``python -P -m rangeshard.cli.main [--log-level L]
      controller-manager --config FILE [--instance-prefix P] [--audit-log F]``
      with this interpreter (:func:`rangeshard.core.process.python_module_command`).
    * A child that cannot be started raises :class:`ManagerProcessError`.
    * :meth:`ManagerProcess.terminate` is a graceful leave (SIGTERM), then
      SIGKILL after ``timeout``; the handle stays (``proc.returncode`` is read
      after the stop). Readiness is waited for with
      :func:`rangeshard.core.process.wait_ready` (the registry state or
      ``/readyz`` of the metrics endpoint, whichever the caller needs).

Concurrency model
    Owned by the thread that started it; the process handle is not shared.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from rangeshard.core.errors import RangeshardError
from rangeshard.core.process import ManagedProcess, python_module_command


class ManagerProcessError(RangeshardError):
    """A controller-manager child process could not be started or did not become ready."""


class ManagerProcess(ManagedProcess):
    """One controller-manager child process: ``name``, ``config``, ``audit``, ``log`` and the ``proc`` handle.

    :meth:`of_config` builds the usual ``rangeshard controller-manager``;
    ``command`` is any other manager program. ``env`` entries are added to
    this process's environment. ``signal_group``: stop signals go to the
    child's whole process group (it runs an external controller of its own).
    """

    error = ManagerProcessError
    tail_lines = 40

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        log: str | Path,
        *,
        config: str | Path | None = None,
        audit: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        new_session: bool = True,
        signal_group: bool = False,
    ) -> None:
        self.name = name
        self.what = f"manager {name}"
        self.command = list(command)
        self.log = self.log_path = Path(log)
        self.config = Path(config) if config is not None else None
        self.audit = Path(audit) if audit is not None else None
        self.env = dict(env or {})
        self.new_session = new_session
        self.signal_group = signal_group and new_session
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def of_config(
        cls,
        name: str,
        config: str | Path,
        log: str | Path,
        *,
        instance_prefix: str | None = None,
        audit: str | Path | None = None,
        log_level: str | None = "info",
        **options: Any,
    ) -> Self:
        """``rangeshard [--log-level L] controller-manager --config CONFIG ...``, not started yet.

        ``log_level=None``: the CLI's default, as a user runs it.
        """
        cmd = python_module_command("rangeshard.cli.main", *(("--log-level", log_level) if log_level else ()))
        cmd += ["controller-manager", "--config", str(config)]
        cmd += ["--instance-prefix", instance_prefix] if instance_prefix is not None else []
        cmd += ["--audit-log", str(audit)] if audit is not None else []
        return cls(name, cmd, log, config=config, audit=audit, **options)

    @property
    def alive(self) -> bool:
        return self.running

    def start(self) -> Self:
        """Start the child (output appended to ``log``); :class:`ManagerProcessError` if it cannot start."""
        self._spawn(self.command, ManagerProcessError, self.what, self.env, new_session=self.new_session)
        return self

    def send(self, sig: int) -> None:
        """Send ``sig`` to the running child (to its process group with ``signal_group``)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.signal_group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if the child still runs after ``timeout`` seconds."""
        try:
            return self._started().wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, timeout: float = 20.0) -> int:
        """Graceful leave (SIGTERM); SIGKILL if it does not exit within ``timeout``; the exit code."""
        self.send(signal.SIGTERM)
        code = self.wait(timeout)
        if code is None:
            self.kill()
        return self._started().wait(10)

    def kill(self) -> None:
        """SIGKILL (fault injection); the handle stays for ``proc.returncode``."""
        proc = self._started()
        self.send(signal.SIGKILL)
        proc.wait(10)

    def stop(self, grace: float = 20.0) -> None:
        """:meth:`terminate` (nothing if never started)."""
        if self.proc is not None:
            self.terminate(grace)

    def log_tail(self, lines: int | None = None) -> str:
        """The last lines of the manager's log, one per line ("" before it wrote any)."""
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-(lines or self.tail_lines) :])

    def _started(self) -> subprocess.Popen[bytes]:
        if self.proc is None:
            raise ManagerProcessError(f"manager {self.name} was not started")
        return self.proc
