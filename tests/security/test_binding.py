"""The proxy and the local API server listen on 127.0.0.1 unless told otherwise.

Both are started exactly as a user would (``python -m ...`` without
``--host``); the listening socket is then looked up in ``/proc/net/tcp`` by
port, which shows the bound address whatever interfaces the machine has.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from local_apiserver.cli import local_apiserver_command
from local_apiserver.process import free_port
from range_filter_proxy.cli import proxy_command
from rangeshard.core.etcdserver import EtcdServer
from rangeshard.core.process import popen

TCP_LISTEN = "0A"


def listening_addresses(port: int) -> set[str]:
    """Local IPv4/IPv6 addresses (hex, as /proc shows them) with a socket listening on ``port``."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, _, hexport = fields[1].partition(":")
            if int(hexport, 16) == port and fields[3] == TCP_LISTEN:
                found.add(address)
    return found


def wait_listening(proc: subprocess.Popen[bytes], port: int, timeout: float = 20.0) -> set[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode}")
        addresses = listening_addresses(port)
        if addresses:
            return addresses
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port} after {timeout}s")


def test_defaults_are_loopback() -> None:
    for command in (proxy_command, local_apiserver_command):
        default = inspect.signature(command).parameters["host"].default
        assert getattr(default, "default", default) == "127.0.0.1"


@pytest.mark.parametrize("component", ["local_apiserver", "range_filter_proxy"])
def test_binds_loopback_without_host_option(component: str, etcd_server: EtcdServer, tmp_path: Path) -> None:
    port = free_port()
    if component == "local_apiserver":
        args = ["--etcd", etcd_server.url, "--port", str(port), "--prefix", "/binding-test"]
    else:  # the upstream need not exist: the proxy listens before it syncs
        args = ["--upstream", f"http://127.0.0.1:{free_port()}", "--port", str(port)]
    with open(tmp_path / "log", "wb") as log:
        proc = popen([sys.executable, "-m", component, *args], stdout=log, stderr=subprocess.STDOUT)
    try:
        addresses = wait_listening(proc, port)
        assert addresses == {"0100007F"}, addresses  # 127.0.0.1, little-endian hex; no 0.0.0.0 / :: socket
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    finally:
        proc.terminate()
        proc.wait(10)
