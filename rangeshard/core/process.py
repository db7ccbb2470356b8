"""Child processes of ours: how they are started, waited for, stopped, and how a command ends.

Purpose
    :func:`popen` starts every child process of ours (etcd, the local API server, the proxy, the managers,
    the external controller's child, the tests' helpers; Python ones as :func:`python_module_command`) with
    a parent-death signal (:func:`die_with_parent`, Linux ``PR_SET_PDEATHSIG``), so a child never outlives
    the process that started it, even one killed with SIGKILL; ``detached=True`` is the one exception
    (``rangeshard up --detach``). :func:`terminate` and :class:`ManagedProcess` (pid, running, stop, kill,
    log tail) stop them; :func:`wait_ready` is the one way to wait for children to become ready
    (:meth:`ManagedProcess.wait_until`/:meth:`~ManagedProcess.wait_http_ready` for one child; a group such
    as ``up``'s passes all of them). :func:`end_process` is how a command that stopped cleanly leaves (no
    interpreter finalization, where gRPC's C core may abort).

Invariants
    * :func:`wait_ready` fails at once when a watched child exits (its exit
      code and log tail), and after ``timeout`` with what the check saw last;
      a single child that did not become ready is stopped (nothing half-started
      stays behind).
    * A child started by :func:`popen` (unless ``detached``) gets SIGKILL from
      the kernel when its parent ends, also when the parent died between the
      fork and the request (the child then kills itself before its ``exec``).

Concurrency model
    Owned by one thread; the process handle is not shared. The parent-death
    signal belongs to the *thread* that forked the child (Linux sends it when
    that thread ends, even if the process lives on): a child must be started
    from a thread that outlives it — the main thread, or a thread that waits
    for the child, as the external controller's supervisor does. Every caller
    of :func:`popen` does so.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import httpx

from rangeshard.core.errors import RangeshardError

log = logging.getLogger(__name__)


def python_module_command(module: str, *args: str) -> list[str]:
    """``python -P -m MODULE ARGS`` with this interpreter.

    ``-P`` keeps the working directory off the child's ``sys.path``: started
    from the directory that holds a clone named ``rangeshard``, ``-m`` would
    otherwise import that directory as a namespace package instead of the
    installed one (``cannot import name '__version__' from 'rangeshard'``).
    """
    return [sys.executable, "-P", "-m", module, *args]


#: ``prctl(2)`` option: the signal this process gets when the thread that started it ends.
_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, resolved once in the parent (a forked child must not load libraries); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _load_prctl()


def die_with_parent(parent: int | None = None) -> None:
    """Have the kernel SIGKILL this process when its parent *thread* ends (Linux ``PR_SET_PDEATHSIG``; else nothing).

    :func:`popen`'s ``preexec_fn`` (runs in the forked child before ``exec``: no imports, no locks) and what
    a pytest-xdist worker calls for itself. ``parent``: the forking pid; if it is no longer the parent once
    the request is in place, it died in between and this process kills itself.
    """
    if _PRCTL is None:
        return
    _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def popen(args: Sequence[str], *, detached: bool = False, **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(args, **kwargs)`` for a child that dies with this process, unless ``detached``."""
    if detached:
        return subprocess.Popen(args, **kwargs)
    preexec = functools.partial(die_with_parent, os.getpid())
    return subprocess.Popen(args, preexec_fn=preexec, **kwargs)  # noqa: PLW1509 (prctl and getppid only)


def end_process(code: int) -> NoReturn:
    """Exit now with ``code``: flush the log handlers and stdio, then skip interpreter finalization.

    For a command whose work is stopped and flushed (the manager after a graceful stop): gRPC's C core
    aborts now and then during finalization (``Fatal Python error: Aborted``, seen for 2 of 3 managers of
    one e2e test at load 10), which turned a clean stop's exit code 0 into -6.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def terminate(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """Stop a child: SIGTERM, wait up to ``grace`` seconds, then SIGKILL (idempotent)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


#: A readiness check: ``(ready, what was seen)``; called until it says ready (it never raises for "not yet").
ReadyCheck = Callable[[], tuple[bool, str]]


def wait_ready(
    check: ReadyCheck,
    timeout: float,
    *,
    what: str,
    error: type[RangeshardError],
    children: Iterable[ManagedProcess] = (),
    tolerated_exits: Collection[int] = (),
    hint: Callable[[], str] | None = None,
    interval: float = 0.05,
    stop: threading.Event | None = None,
    timeout_error: Callable[[str], Exception] | None = None,
) -> None:
    """Poll ``check`` until it says ready (the module docstring's invariant).

    Each of ``children`` must still run before every check (exit codes in ``tolerated_exits`` allowed).
    The timeout's message ends with ``hint()`` (a log tail); ``timeout_error`` makes that error instead of
    ``error``. ``stop`` (set by a signal) ends the wait with ``error`` too.
    """
    deadline = time.monotonic() + timeout
    watched = list(children)
    while True:
        for child in watched:
            code = child.returncode
            if code is not None and code not in tolerated_exits:
                raise error(f"{child.what} exited with code {code}: {child.log_tail()}")
        ready, seen = check()
        if ready:
            return
        if time.monotonic() > deadline:
            message = f"{what} not ready after {timeout:g}s ({seen})" + (f": {hint()}" if hint else "")
            raise (timeout_error or error)(message)
        if stop is None:
            time.sleep(interval)  # the polling interval of a readiness probe
        elif stop.wait(interval):
            raise error(f"interrupted while waiting for {what}")


class ManagedProcess:
    """A child process we started (subclasses set ``proc`` and ``log_path``); stop and kill are idempotent and
    never leave a zombie."""

    proc: subprocess.Popen[bytes] | None
    log_path: Path
    #: Lines of the log quoted in error messages.
    tail_lines = 20
    #: What error messages call the child; the error they raise.
    what = "child process"
    error: type[RangeshardError] = RangeshardError
    #: The child may outlive this process (``up --detach``); otherwise it dies with it (:func:`popen`).
    detached = False

    @property
    def returncode(self) -> int | None:
        """The exit code once the child ended, else None (also None before it was started)."""
        return self.proc.poll() if self.proc is not None else None

    def wait_until(self, check: ReadyCheck, timeout: float) -> None:
        """:func:`wait_ready` for this child; a child that did not become ready is stopped before the error."""
        try:
            wait_ready(check, timeout, what=self.what, error=self.error, children=[self], hint=self.log_tail)
        except RangeshardError:
            self.stop(5.0)
            raise

    def wait_http_ready(self, url: str, timeout: float) -> None:
        """Until ``GET url`` answers 200 (a ``/readyz``); see :meth:`wait_until`."""
        # Our own child on loopback, no data sent: a (possibly self-signed) certificate is not verified.
        with httpx.Client(timeout=1.0, verify=False) as client:  # noqa: S501

            def check() -> tuple[bool, str]:
                try:
                    resp = client.get(url)
                except httpx.HTTPError as e:
                    return False, str(e) or type(e).__name__
                return resp.status_code == 200, f"{resp.status_code} {resp.text}"

            self.wait_until(check, timeout)

    def _spawn(
        self,
        command: list[str],
        error: type[RangeshardError],
        what: str,
        env: Mapping[str, str] | None = None,
        *,
        new_session: bool = True,
    ) -> subprocess.Popen[bytes]:
        """Start ``command`` (own session by default, ``env`` added, output appended to ``log_path``); return it.

        A failure to start raises ``error("cannot start WHAT: ...")``.
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")  # noqa: SIM115 (the child keeps its own descriptor)
        try:
            self.proc = popen(
                command,
                detached=self.detached,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=new_session,
                env={**os.environ, **env} if env else None,
            )
        except OSError as e:
            raise error(f"cannot start {what}: {e}") from e
        finally:
            logf.close()
        return self.proc

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL."""
        if self.proc is None:
            return
        terminate(self.proc, grace)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL without grace (fault injection)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def log_tail(self, lines: int | None = None) -> str:
        """The last lines of the process's log, on one line (for error messages)."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-(lines or self.tail_lines) :])


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` from the 3rd on (``[]`` when the process is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return []


def process_state(pid: int) -> str | None:
    """Field 3 of ``/proc/PID/stat`` (``R``, ``S``, ``D``, ``T`` stopped, ``t`` traced, ``Z`` zombie, ...), or None."""
    return next(iter(_stat(pid)), None)


def process_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (clock ticks since boot), or None when the process is gone."""
    fields = _stat(pid)
    if not fields or fields[0] == "Z":  # a zombie has exited already
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None
