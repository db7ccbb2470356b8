"""Fixtures shared by the registry tests: a Registry under the test's key prefix, leases revoked afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from rangeshard.core.etcd import EtcdClient
from registry import Registry


@pytest.fixture
def registry(etcd_client: EtcdClient, key_prefix: str) -> Registry:
    return Registry(etcd_client, key_prefix)


@pytest.fixture
def leases(etcd_client: EtcdClient) -> Iterator[Callable[..., int]]:
    """Grant leases (default TTL 30 s); all are revoked when the test ends."""
    granted: list[int] = []

    def grant(ttl: int = 30) -> int:
        lease = etcd_client.grant_lease(ttl)
        granted.append(lease)
        return lease

    yield grant
    for lease in granted:
        with contextlib.suppress(Exception):
            etcd_client.revoke_lease(lease)
