"""Fixtures of the proxy tests: a real local API server on the session etcd, and a proxy in front of it.

Both are module-scoped child processes; each test module that uses them gets
its own etcd key prefix, so modules never see each other's objects.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from range_filter_proxy.process import ProxyProcess
from rangeshard.core.etcdserver import EtcdServer


@pytest.fixture(scope="module")
def local_apiserver(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from local_apiserver.process import LocalApiServerProcess  # noqa: PLC0415

    base: Path = tmp_path_factory.mktemp("apiserver")
    server = LocalApiServerProcess(
        etcd_server.url,
        prefix=f"/proxy-test-{uuid.uuid4().hex[:8]}",
        log_file=base / "apiserver.log",
        bookmark_interval=0.2,
    )
    server.start(timeout=30)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def proxy(local_apiserver: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    base: Path = tmp_path_factory.mktemp("proxy")
    proc = ProxyProcess(
        local_apiserver.url,  # type: ignore[attr-defined]
        resources=["pods", "replicasets.apps"],
        log_file=base / "proxy.log",
        extra_args=["--bookmark-interval", "0.2", "--history-events", "50", "--history-seconds", "0"],
    )
    proc.start(timeout=30)
    yield proc
    proc.stop()
