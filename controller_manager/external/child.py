"""The external controller's process: started with its kubeconfig, restarted with backoff, probed, stopped.

Purpose
    With ``command`` the manager also runs the controller (:class:`Child`):
    ``KUBECONFIG`` names a kubeconfig for the endpoint (no credentials of
    the manager inside), ``RANGESHARD_INSTANCE_ID`` and
    ``RANGESHARD_CONTROLLER_TYPE`` are set, its output goes to the manager's
    log prefixed with ``[<name>]``, it is restarted with backoff when it
    exits and stopped (SIGTERM, then SIGKILL) on shutdown. ``$(NAME)`` in
    ``command`` is replaced by those variables (:func:`expand`, the kubelet's
    spelling). The directory of the manager's own interpreter (a venv's
    ``bin``) comes first on the child's ``PATH``, so a command installed in
    the manager's venv (``.venv/bin/pip install kopf``) is found without
    activating it. With ``livenessProbe`` a :class:`~controller_manager.probes.Prober`
    probes each run of it; ``failureThreshold`` failures in a row SIGKILL
    the process (WARNING with the probe's answer) and the restart loop starts
    it again with the same backoff.

    A controller that cannot start is said at once, in the registry record
    (``child.error``, read by ``up`` and ``status``) and the log: the command
    and why (``not found``, ``permission denied``, or its exit code and the
    last lines of its output). The record's ``state`` is read from
    ``/proc/<pid>/stat``: ``running``, ``stopped`` (SIGSTOP) or ``zombie``.

Invariants
    * The controller dies with the manager (``PR_SET_PDEATHSIG``): no orphans.
    * Its kubeconfig lives in ``$TMPDIR/rangeshard-external-<name>-<pid>-*``,
      removed when the child is stopped; what a killed manager (SIGKILL) left
      there is removed by the next manager that starts one (its pid is gone).
    * A run that lasted a minute or more resets the backoff (1 s, doubling to 30 s:
      a :class:`~rangeshard.core.backoff.Backoff` with ``reset_after=60``).

Concurrency model
    A supervisor thread (``external-<name>-child``) starts each run and
    copies its output; with a probe, the prober's thread
    (``external-<name>-liveness``), whose failure action only signals the
    run it was given.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from controller_manager.config import LivenessProbeSection
from controller_manager.probes import Prober, ProbeResult, pick_port
from rangeshard.core.backoff import Backoff
from rangeshard.core.kubeapi import kubeconfig
from rangeshard.core.loops import start_thread
from rangeshard.core.process import popen, process_start_time, process_state, terminate

log = logging.getLogger(__name__)

#: Lines of the controller's output kept for the error of a run that exits (``child.error``).
TAIL_LINES = 5
#: ``/proc/<pid>/stat`` states other than running, as the record says them.
_PROC_STATES = {"T": "stopped", "t": "stopped", "Z": "zombie", "X": "zombie"}
_DIR_PREFIX = "rangeshard-external-"


def sweep_leftovers(tmp: str | None = None) -> list[Path]:
    """Remove the kubeconfig directories of managers that are gone (SIGKILL); the removed paths."""
    removed = []
    for path in Path(tmp or tempfile.gettempdir()).glob(f"{_DIR_PREFIX}*"):
        found = re.search(r"-(\d+)-[^-]+$", path.name)
        if found is None or not path.is_dir():
            continue
        if process_start_time(int(found.group(1))) is None:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def child_path(path: str) -> str:
    """``PATH`` for the child: the manager's interpreter's directory first (once), then ``path``."""
    own = os.path.dirname(sys.executable)
    parts = [p for p in path.split(os.pathsep) if p and p != own]
    return os.pathsep.join([own, *parts])


def start_error(command: str, error: OSError) -> str:
    """``cannot start 'kopf': not found (is it installed and on PATH?)`` and the like."""
    if isinstance(error, FileNotFoundError):
        why = "not found (is it installed and on PATH? a venv's binaries are in .venv/bin)"
    elif isinstance(error, PermissionError):
        why = "permission denied (is it executable?)"
    else:
        why = error.strerror or str(error)
    return f"cannot start {command!r}: {why}"


class Child:
    """The external controller's process, restarted with backoff (see module docstring)."""

    def __init__(
        self,
        name: str,
        command: list[str],
        endpoint_url: str,
        *,
        controller_type: str,
        instance_id: str,
        liveness_probe: LivenessProbeSection | None = None,
        on_restart: Callable[[], None] | None = None,
        on_probe: Callable[[ProbeResult], None] | None = None,
    ) -> None:
        self.name = name
        self.command = command
        self.controller_type = controller_type
        self.instance_id = instance_id
        sweep_leftovers()
        self._dir = Path(tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{name}-{os.getpid()}-"))
        self.kubeconfig = self._dir / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump(kubeconfig(endpoint_url, skip_tls_verify=True), sort_keys=False))
        #: The variables the manager sets for the controller (also ``$(NAME)`` in ``command``, see :func:`expand`).
        self.variables = {
            "KUBECONFIG": str(self.kubeconfig),
            "RANGESHARD_INSTANCE_ID": instance_id,
            "RANGESHARD_CONTROLLER_TYPE": controller_type,
        }
        self._path = child_path(os.environ.get("PATH", ""))
        self.prober: Prober | None = None
        if liveness_probe is not None:
            action = liveness_probe.http_get
            port = (action.port or pick_port(action.host)) if action is not None else None
            if port is not None:
                self.variables["RANGESHARD_PROBE_PORT"] = str(port)
            env = {**os.environ, **self.variables}
            self.prober = Prober(name, liveness_probe, port=port, env=env, on_result=on_probe)
        self._on_restart = on_restart
        self.proc: subprocess.Popen[bytes] | None = None
        #: Monotonic time since when the controller has not been running (``None`` while it runs).
        self._down_since: float | None = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Restarts so far and the last exit code (``None``: none yet), for the registry record and metrics.
        self.restarts = 0
        self.last_exit: int | None = None
        #: Why the controller is not running: it could not start, or its last run exited (command, reason, output).
        self.error: str | None = None
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def down_for(self) -> float | None:
        """Seconds the controller has not been running (``None``: it runs)."""
        if self.running:
            return None
        since = self._down_since
        return time.monotonic() - since if since is not None else 0.0

    def info(self) -> dict[str, Any]:
        """What the registry record says of the child: pid, running or restarting, restarts, last exit."""
        proc = self.proc
        running = proc is not None and proc.poll() is None
        state = "restarting"
        if running and proc is not None:
            state = _PROC_STATES.get(process_state(proc.pid) or "", "running")
        return {
            "name": self.name,
            "pid": proc.pid if running and proc is not None else None,
            "state": state,
            "restarts": self.restarts,
            "lastExit": self.last_exit,
            "error": None if running else self.error,
        }

    def start(self) -> None:
        if self.prober is not None:
            self.prober.start()
        self._thread = start_thread(f"external-{self.name}-child", self._run, what=f"external {self.name}: child")

    def _run(self) -> None:
        backoff = Backoff(1.0, 30.0, reset_after=60.0)
        command = [expand(arg, self.variables) for arg in self.command]
        while not self._stop.is_set():
            env = {**os.environ, "PATH": self._path, **self.variables}
            try:
                # Dies with the manager (PR_SET_PDEATHSIG); this thread waits for it, so it outlives the child.
                self.proc = popen(
                    command,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                )
            except OSError as e:
                self.error = start_error(command[0], e)
                log.error("%s: %s", self.name, self.error)
                delay = backoff.next_delay()
            else:
                backoff.succeeded()
                self._down_since = None
                proc = self.proc
                started = time.monotonic()
                self._tail.clear()
                log.info("%s: started %s (pid %s)", self.name, " ".join(command), proc.pid)
                if self.prober is not None:
                    self.prober.watch(functools.partial(self._liveness_failed, proc))
                self._copy_output(proc)
                code = proc.wait()
                if self.prober is not None:
                    self.prober.unwatch()
                self._down_since = time.monotonic()
                self.last_exit = code
                if self._stop.is_set():
                    return
                tail = " | ".join(self._tail) or "no output"
                lasted = time.monotonic() - started
                self.error = f"{command[0]!r} exited with code {code} after {lasted:.0f}s: {tail}"
                self.restarts += 1
                delay = backoff.next_delay()
                log.warning("%s: the controller exited with code %s; restarting in %.0fs", self.name, code, delay)
                if self._on_restart is not None:
                    self._on_restart()
            self._stop.wait(delay)

    def _copy_output(self, proc: subprocess.Popen[bytes]) -> None:
        out = proc.stdout
        if out is None:
            return
        with out:  # closed at the child's end: each restart opens a new pipe
            for raw in out:
                line = raw.decode("utf-8", "replace").rstrip()
                if line:
                    self._tail.append(line[:300])
                log.info("[%s] %s", self.name, line)

    def _liveness_failed(self, proc: subprocess.Popen[bytes], result: ProbeResult, failures: int) -> None:
        """The prober's failure action (its thread): SIGKILL this run's process; :meth:`_run` restarts it."""
        log.warning(
            "%s: liveness probe failed %d times (%s): killing the controller (SIGKILL)",
            self.name,
            failures,
            result.answer,
        )
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)  # a no-op once the run ended and was reaped

    def stop(self, grace: float = 10.0) -> None:
        self._stop.set()
        if self.prober is not None:
            self.prober.stop()
        if self.proc is not None:
            terminate(self.proc, grace)
        if self._thread is not None:
            self._thread.join(5)
        shutil.rmtree(self._dir, ignore_errors=True)  # nothing left outside the manager's own state


_VARIABLE_RE = re.compile(r"(\$?)\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(arg: str, variables: Mapping[str, str]) -> str:
    """``$(NAME)`` in a command argument replaced by the manager's variable ``NAME``, as the kubelet spells it.

    Only the variables the manager sets for the controller are expanded
    (``KUBECONFIG``, ``RANGESHARD_*``); any other ``$(...)`` stays as written,
    and ``$$(NAME)`` is the escape for a literal ``$(NAME)``. No shell is involved.
    """

    def one(found: re.Match[str]) -> str:
        escaped, name = found.group(1), found.group(2)
        if escaped:
            return found.group(0)[1:]
        return variables.get(name, found.group(0))

    return _VARIABLE_RE.sub(one, arg)
