"""Run the local API server as a child process (tests, benchmarks, ``rangeshard up``).

Purpose
    :class:`LocalApiServerProcess` spawns ``sys.executable -P -m local_apiserver``
    in its own session on a free loopback port, waits until ``/readyz``
    answers 200, and stops it (SIGTERM, then SIGKILL after a grace period).

Invariants
    * ``start`` returns only once ``/readyz`` answered 200, or raises
      :class:`rangeshard.core.errors.RangeshardError` with the tail of the log.
    * ``stop``/``kill`` are idempotent and only signal the process they spawned.

Concurrency model
    Owned by one thread; the process handle is not shared.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from rangeshard.core.errors import RangeshardError
from rangeshard.core.process import ManagedProcess, free_port, python_module_command

log = logging.getLogger(__name__)


class LocalApiServerError(RangeshardError):
    """The local API server process could not be started or stopped."""


class LocalApiServerProcess(ManagedProcess):
    """One local API server child process (see module docstring)."""

    error = LocalApiServerError

    def __init__(
        self,
        etcd_url: str,
        port: int | None = None,
        host: str = "127.0.0.1",
        prefix: str | None = None,
        log_file: str | Path | None = None,
        *,
        bookmark_interval: float | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        extra_args: list[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.etcd_url = etcd_url
        self.host = host
        self.port = port or free_port(host)
        self.prefix = prefix
        self.bookmark_interval = bookmark_interval
        if (tls_cert is None) != (tls_key is None):
            raise LocalApiServerError("tls_cert and tls_key go together")
        self.tls_cert = str(tls_cert) if tls_cert is not None else None
        self.tls_key = str(tls_key) if tls_key is not None else None
        self.extra_args = list(extra_args or [])
        # Extra environment of the child (e.g. RANGESHARD_ETCD_PASSWORD: secrets stay out of argv).
        self.env = dict(env or {})
        if log_file is None:
            fd, name = tempfile.mkstemp(prefix="local-apiserver-", suffix=".log")
            os.close(fd)
            log_file = name
        self.log_path = Path(log_file)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls_cert else "http"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"local API server on {self.url}"

    def command(self) -> list[str]:
        cmd = python_module_command("local_apiserver", "--etcd", self.etcd_url, "--port", str(self.port))
        cmd += ["--host", self.host]
        if self.prefix:
            cmd += ["--prefix", self.prefix]
        if self.bookmark_interval is not None:
            cmd += ["--bookmark-interval", str(self.bookmark_interval)]
        if self.tls_cert and self.tls_key:
            cmd += ["--tls-cert", self.tls_cert, "--tls-key", self.tls_key]
        return cmd + self.extra_args

    def start(self, timeout: float = 30.0, *, wait: bool = True) -> LocalApiServerProcess:
        """Spawn the server and (with ``wait``) wait until ``/readyz`` answers 200."""
        if self.running:
            return self
        proc = self._spawn(self.command(), LocalApiServerError, "the local API server", self.env)
        log.info("local API server starting on %s (pid %s)", self.url, proc.pid)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until ``/readyz`` answers 200 (:meth:`ManagedProcess.wait_http_ready`)."""
        self.wait_http_ready(f"{self.url}/readyz", timeout)

    def __enter__(self) -> LocalApiServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
