"""Run the range filter proxy as a child process (tests, ``rangeshard up``, benchmarks).

Purpose
    :class:`ProxyProcess` starts ``python -m range_filter_proxy`` on a loopback
    port, waits until ``/readyz`` answers 200 (every configured cache synced),
    and stops it (SIGTERM, then SIGKILL after a grace period) or kills it.

Invariants
    * ``start`` returns only once ``/readyz`` said 200, or raises
      :class:`ProxyProcessError` with the tail of the proxy's log.
    * ``stop`` and ``kill`` are idempotent and never leave a zombie.

Concurrency model
    Owned by one thread; the process handle is not shared.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from range_filter_proxy.errors import ProxyError
from rangeshard.core.process import ManagedProcess, free_port, python_module_command


class ProxyProcessError(ProxyError):
    """The proxy process could not be started or did not become ready."""


class ProxyProcess(ManagedProcess):
    """A proxy child process in front of ``upstream_url`` (``pid``, ``stop``, ``kill``: :class:`ManagedProcess`)."""

    tail_lines = 30
    what = "proxy"
    error = ProxyProcessError

    def __init__(
        self,
        upstream_url: str | None,
        port: int | None = None,
        resources: Sequence[str] | None = None,
        log_file: str | Path | None = None,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        *,
        kubeconfig: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if (upstream_url is None) == (kubeconfig is None):
            raise ProxyProcessError("give exactly one of upstream_url and kubeconfig")
        if (tls_cert is None) != (tls_key is None):
            raise ProxyProcessError("tls_cert and tls_key go together")
        self.upstream_url = upstream_url
        self.kubeconfig = str(kubeconfig) if kubeconfig is not None else None
        self.tls_cert = str(tls_cert) if tls_cert is not None else None
        self.tls_key = str(tls_key) if tls_key is not None else None
        self.env = dict(env or {})
        self.host = host
        self.port = port or free_port(host)
        self.resources = list(resources or [])
        self.log_file = Path(log_file) if log_file is not None else None
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None
        # Without log_file, start() picks a fresh temporary file.
        self.log_path = self.log_file or Path(tempfile.gettempdir()) / "range-filter-proxy.log"

    @property
    def url(self) -> str:
        """Base URL clients point at."""
        return f"{'https' if self.tls_cert else 'http'}://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        """Start the process and wait until ``/readyz`` answers 200."""
        if self.running:
            return
        if self.log_file is None:
            fd, name = tempfile.mkstemp(prefix="range-filter-proxy-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        cmd = python_module_command("range_filter_proxy")
        if self.kubeconfig is not None:
            cmd += ["--kubeconfig", self.kubeconfig]
        else:
            cmd += ["--upstream", str(self.upstream_url)]
        if self.tls_cert is not None and self.tls_key is not None:
            cmd += ["--tls-cert", self.tls_cert, "--tls-key", self.tls_key]
        cmd += ["--port", str(self.port), "--host", self.host]
        if self.resources:
            cmd += ["--resources", ",".join(self.resources)]
        cmd += self.extra_args
        self._spawn(cmd, ProxyProcessError, "the proxy", self.env, new_session=False)
        self.wait_http_ready(self.url + "/readyz", timeout)

    def __enter__(self) -> ProxyProcess:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()
