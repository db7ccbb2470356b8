"""Liveness probes of external controllers, with the kubelet's semantics.

Purpose
    A controller the manager runs (``external.command``) can stop working
    without exiting: a deadlock, a wedged event loop, SIGSTOP. Its lease keeps
    renewing (the manager renews it), so its range stays owned and unhandled.
    ``external.livenessProbe`` (:class:`~controller_manager.config.LivenessProbeSection`,
    spelled as in a pod spec) asks the controller itself: :func:`http_get`
    (a status of 200..399 passes) or :func:`run_exec` (exit code 0 passes),
    each within ``timeoutSeconds``. :class:`Prober` runs the probe of one child
    on its own thread and calls the child's failure action once
    ``failureThreshold`` probes in a row failed (:class:`Child
    <controller_manager.external.Child>` then SIGKILLs the process and its
    restart loop starts it again).

Invariants
    * As the kubelet: the first probe runs ``initialDelaySeconds`` after the
      process started, then one every ``periodSeconds`` (a probe that took
      longer than the period is followed by the next at once, never by a
      burst); a success resets the count of failures; ``failureThreshold``
      failures in a row fire the failure action, exactly once per process.
    * A probe never outlives ``timeoutSeconds`` by much: an HTTP probe is
      bounded in connecting and in each read, and stops reading a body once
      the deadline is past; an exec probe is SIGKILLed with its process group.
    * An answer that arrives after its process ended (or after :meth:`Prober.unwatch`)
      is dropped: it never counts against the next process.
    * The answer of every probe (``HTTP 503: <body>``, ``timed out after 1s``,
      ``exit code 1: <output>``) is kept short (:data:`ANSWER_MAX` characters)
      so that it fits in one log line.

    Per process the states are::

        waiting ──(initialDelaySeconds elapsed)──► probing
        probing ──(success)──► probing (failures = 0)
        probing ──(failure, failures < failureThreshold)──► probing
        probing ──(failure, failures = failureThreshold)──► failed (the action fired; no more probes)
        any ──(unwatch: the process ended, or stop)──► idle

Concurrency model
    One named daemon thread per :class:`Prober` (``external-<name>-liveness``),
    started by :meth:`Prober.start`, stopped (and joined) by :meth:`Prober.stop`.
    :meth:`Prober.watch` and :meth:`Prober.unwatch` are called by the child's
    supervisor thread; they and the prober thread share the current run under
    a condition variable. Probes themselves run outside the lock, and the
    failure action runs on the prober thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

from controller_manager.config import ExecSection, HttpGetSection, LivenessProbeSection
from rangeshard import __version__
from rangeshard.core.loops import join_thread, start_thread

log = logging.getLogger(__name__)

#: The longest probe answer kept (a body or a command's output is cut there).
ANSWER_MAX = 200
#: How much of a failed HTTP probe's body is read.
_BODY_MAX = 1024
_USER_AGENT = f"rangeshard-probe/{__version__}"


@dataclass(frozen=True)
class ProbeResult:
    """One probe's verdict and what the controller answered (for the log)."""

    ok: bool
    answer: str


def _short(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= ANSWER_MAX else flat[: ANSWER_MAX - 3] + "..."


def probe_url(action: HttpGetSection, port: int | None = None) -> str:
    """The URL an ``httpGet`` requests (``port`` overrides the configured one, e.g. a port the manager picked)."""
    host = f"[{action.host}]" if ":" in action.host else action.host
    return f"{action.scheme.lower()}://{host}:{port or action.port}{action.path}"


def http_get(client: httpx.Client, url: str, headers: Mapping[str, str], timeout: float) -> ProbeResult:
    """GET ``url``: a status of 200..399 passes (the kubelet's rule); redirects are not followed."""
    deadline = time.monotonic() + timeout
    try:
        with client.stream("GET", url, headers=dict(headers), timeout=timeout) as response:
            code = response.status_code
            if 200 <= code < 400:
                return ProbeResult(True, f"HTTP {code}")
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) >= _BODY_MAX or time.monotonic() > deadline:
                    break
    except httpx.TimeoutException:
        return ProbeResult(False, f"GET {url}: timed out after {timeout:g}s")
    except httpx.HTTPError as e:
        return ProbeResult(False, _short(f"GET {url}: {type(e).__name__}: {e}"))
    text = bytes(body[:_BODY_MAX]).decode("utf-8", "replace")
    return ProbeResult(False, _short(f"HTTP {code}: {text}" if text.strip() else f"HTTP {code}"))


def run_exec(command: list[str], timeout: float, env: Mapping[str, str] | None = None) -> ProbeResult:
    """Run ``command`` (no shell): exit code 0 within ``timeout`` passes; on timeout its process group is killed."""
    try:
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            start_new_session=True,  # its own process group: a timeout kills whatever it started too
        )
    except OSError as e:
        return ProbeResult(False, _short(f"cannot run {command[0]}: {e.strerror or e}"))
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=5)
        if proc.poll() is None:  # pragma: no cover (a pipe held open by a process outside its group)
            proc.kill()
            proc.wait()
        return ProbeResult(False, f"{command[0]}: timed out after {timeout:g}s (killed)")
    text = out.decode("utf-8", "replace").strip()
    code = proc.returncode
    if code == 0:
        return ProbeResult(True, _short(f"exit code 0: {text}" if text else "exit code 0"))
    return ProbeResult(False, _short(f"exit code {code}: {text}" if text else f"exit code {code}"))


def pick_port(host: str) -> int:
    """A TCP port free on ``host`` now (``httpGet.port: 0``): bound with port 0, read back and released."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class LivenessCount:
    """The kubelet's bookkeeping of one process's liveness probes (pure: the caller says what time it is).

    ``next_due`` is when the next probe is due; :meth:`observe` records a
    probe that finished at ``now`` and says whether it fired the failure action.
    """

    def __init__(self, probe: LivenessProbeSection, started_at: float) -> None:
        self.period = float(probe.period_seconds)
        self.threshold = probe.failure_threshold
        self.next_due = started_at + probe.initial_delay_seconds
        self.failures = 0
        self.fired = False

    def observe(self, ok: bool, now: float) -> bool:
        """Record one probe's verdict; ``True`` when it is the ``failureThreshold``-th failure in a row."""
        if self.fired:
            return False
        self.next_due = max(self.next_due + self.period, now)
        if ok:
            self.failures = 0
            return False
        self.failures += 1
        if self.failures >= self.threshold:
            self.fired = True
        return self.fired


#: Called once when a process failed ``failureThreshold`` probes in a row: (the last answer, the failures).
FailureAction = Callable[[ProbeResult, int], None]


@dataclass
class _Run:
    """The probes of one process: its count and its failure action."""

    count: LivenessCount
    on_failure: FailureAction


class Prober:
    """Probes one child's liveness on a thread of its own (see module docstring)."""

    def __init__(
        self,
        name: str,
        probe: LivenessProbeSection,
        *,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        on_result: Callable[[ProbeResult], None] | None = None,
    ) -> None:
        self.name = name
        self.probe = probe
        self.env = env
        #: Called with every probe's result that counted (e.g. a metric), on the prober thread.
        self.on_result = on_result
        self._url = probe_url(probe.http_get, port) if probe.http_get is not None else None
        headers = {"User-Agent": _USER_AGENT, "Accept": "*/*", "Connection": "close"}
        if probe.http_get is not None:
            headers.update({h.name: h.value for h in probe.http_get.http_headers})
        self._headers = headers
        self._client: httpx.Client | None = None
        self._cond = threading.Condition()
        self._run: _Run | None = None
        self._stopped = False
        self._thread: threading.Thread | None = None

    def describe(self) -> str:
        """``GET http://127.0.0.1:8080/healthz`` or ``exec cat /tmp/healthy``."""
        if self._url is not None:
            return f"GET {self._url}"
        action: ExecSection | None = self.probe.exec_
        return "exec " + " ".join(action.command if action is not None else [])

    # -- lifecycle (the child's supervisor thread) ------------------------------------
    def start(self) -> None:
        if self._url is not None:
            # No keep-alive (a fresh connection per probe, as the kubelet); HTTPS unverified, as the kubelet.
            self._client = httpx.Client(
                verify=False,  # noqa: S501 (the kubelet does not verify a probe's certificate either)
                follow_redirects=False,
                limits=httpx.Limits(max_keepalive_connections=0),
            )
        self._thread = start_thread(f"external-{self.name}-liveness", self._loop, what=f"{self.name}: liveness probe")

    def watch(self, on_failure: FailureAction) -> None:
        """A process started now: probe it (after ``initialDelaySeconds``); ``on_failure`` fires at the threshold."""
        with self._cond:
            self._run = _Run(LivenessCount(self.probe, time.monotonic()), on_failure)
            self._cond.notify_all()

    def unwatch(self) -> None:
        """The process ended: no more probes until the next :meth:`watch`; an answer on the way is dropped."""
        with self._cond:
            self._run = None
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._run = None
            self._cond.notify_all()
        join_thread(self._thread, self.probe.timeout_seconds + 5)
        if self._client is not None:
            self._client.close()

    # -- the prober thread -----------------------------------------------------------
    def check(self) -> ProbeResult:
        """Run the probe once."""
        timeout = float(self.probe.timeout_seconds)
        if self._url is not None and self._client is not None:
            return http_get(self._client, self._url, self._headers, timeout)
        action = self.probe.exec_
        if action is None:  # pragma: no cover (the config allows exactly one of httpGet and exec)
            return ProbeResult(False, "no probe configured")
        return run_exec(action.command, timeout, self.env)

    def _next(self) -> _Run | None:
        """Wait until a probe is due (the run it is for) or the prober stops (``None``)."""
        with self._cond:
            while not self._stopped:
                run = self._run
                if run is None or run.count.fired:
                    self._cond.wait()
                    continue
                delay = run.count.next_due - time.monotonic()
                if delay <= 0:
                    return run
                self._cond.wait(delay)
            return None

    def _loop(self) -> None:
        while (run := self._next()) is not None:
            result = self.check()
            with self._cond:
                if self._run is not run:
                    log.debug("%s: liveness probe answer of an ended process dropped: %s", self.name, result.answer)
                    continue
                was = run.count.failures
                fired = run.count.observe(result.ok, time.monotonic())
                failures = run.count.failures
            if self.on_result is not None:
                self.on_result(result)
            if fired:
                run.on_failure(result, failures)
            elif not result.ok:
                log.info(
                    "%s: liveness probe failed (%d/%d): %s", self.name, failures, run.count.threshold, result.answer
                )
            elif was:
                log.info("%s: liveness probe passes again after %d failure(s): %s", self.name, was, result.answer)
