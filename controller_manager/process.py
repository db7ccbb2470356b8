"""Starting a ``rangeshard controller-manager`` child process: the one launcher.

Purpose
    ``rangeshard up``, the test kit (:mod:`rangeshard.testing`), the e2e
    tests and the benchmarks all start managers as child processes.
    :func:`manager_command` is the command line and :func:`spawn_manager`
    the start (output appended to a log file, stdin closed, optionally in its
    own session), so every launcher starts them the same way.

Invariants
    * The child runs ``python -P -m rangeshard.cli.main [--log-level L]
      controller-manager --config FILE [--instance-prefix P] [--audit-log F]``
      with this interpreter (:func:`rangeshard.core.process.python_module_command`).
    * A child that cannot be started raises :class:`ManagerProcessError`.
    * Readiness is the caller's (the registry state or ``/readyz`` of the
      metrics endpoint, depending on what the caller needs).

Concurrency model
    Plain functions; the returned ``Popen`` belongs to the caller.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from rangeshard.core.errors import RangeshardError
from rangeshard.core.process import python_module_command


class ManagerProcessError(RangeshardError):
    """A controller-manager child process could not be started."""


def manager_command(
    config: str | Path,
    *,
    instance_prefix: str | None = None,
    audit_log: str | Path | None = None,
    log_level: str | None = "info",
) -> list[str]:
    """The command line of a controller manager (``log_level=None``: the CLI's default, as a user runs it)."""
    cmd = python_module_command("rangeshard.cli.main", *(("--log-level", log_level) if log_level else ()))
    cmd += ["controller-manager", "--config", str(config)]
    if instance_prefix is not None:
        cmd += ["--instance-prefix", instance_prefix]
    if audit_log is not None:
        cmd += ["--audit-log", str(audit_log)]
    return cmd


def spawn_manager(
    config: str | Path,
    log_file: str | Path,
    *,
    instance_prefix: str | None = None,
    audit_log: str | Path | None = None,
    log_level: str | None = "info",
    new_session: bool = True,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a controller manager, output appended to ``log_file``; ``env`` replaces the environment if given."""
    cmd = manager_command(config, instance_prefix=instance_prefix, audit_log=audit_log, log_level=log_level)
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as logf:
        try:
            return subprocess.Popen(
                cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=new_session,
                env=dict(env) if env is not None else os.environ.copy(),
            )
        except OSError as e:
            raise ManagerProcessError(f"cannot start a controller manager ({config}): {e}") from e
