"""A client whose etcd auth token stops being valid authenticates again instead of failing forever.

etcd drops simple tokens after ``--auth-token-ttl`` of inactivity and JWTs
after their lifetime; pyetcd keeps sending the dead token. Here the tokens are
invalidated deterministically (``etcdctl auth disable`` + ``auth enable``
clears etcd's token store) on a real etcd of our own, with authentication on.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rangeshard.core.errors import RegistryError
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.etcdserver import EtcdServer


def _etcdctl(etcd: EtcdServer, password: str, *args: str) -> None:
    result = subprocess.run(
        [*etcd.etcdctl_args(), "--user", f"root:{password}", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def _invalidate_tokens(etcd: EtcdServer, password: str) -> None:
    _etcdctl(etcd, password, "auth", "disable")
    _etcdctl(etcd, password, "auth", "enable")


@pytest.fixture
def etcd_with_auth(tmp_path: Path) -> Iterator[tuple[EtcdServer, str]]:
    password = f"pw-{secrets.token_hex(8)}"
    etcd = EtcdServer(tmp_path / "etcd", fast=True, log_file=tmp_path / "etcd.log")
    etcd.start()
    try:
        etcd.enable_auth(password)
        yield etcd, password
    finally:
        etcd.stop()


def test_rejected_token_is_renewed_and_the_call_retried(etcd_with_auth: tuple[EtcdServer, str]) -> None:
    etcd, password = etcd_with_auth
    config = EtcdConfig.from_urls(etcd.url, username="root", password=password, timeout=5)
    with EtcdClient(config) as client:
        client.put("/auth-test/k", "v1")
        lease = client.grant_lease(30)
        _invalidate_tokens(etcd, password)
        # A write, a keepalive and a read after the invalidation: each works.
        client.put("/auth-test/k", "v2")
        assert client.reauthentications == 1
        assert client.keepalive_once(lease) > 0
        _, kv = client.get("/auth-test/k")
        assert kv is not None and kv.value == b"v2"
        _invalidate_tokens(etcd, password)
        assert client.revision() > 0
        assert client.reauthentications == 2


def test_a_client_whose_password_no_longer_works_fails_cleanly(etcd_with_auth: tuple[EtcdServer, str]) -> None:
    etcd, password = etcd_with_auth
    config = EtcdConfig.from_urls(etcd.url, username="root", password=password, timeout=5)
    with EtcdClient(config) as client:
        client.put("/auth-test/k", "v1")
        new_password = f"pw-{secrets.token_hex(8)}"
        result = subprocess.run(
            [*etcd.etcdctl_args(), "--user", f"root:{password}", "user", "passwd", "root", "--interactive=false"],
            input=f"{new_password}\n",
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        with pytest.raises(RegistryError) as info:
            client.put("/auth-test/k", "v2")
        message = str(info.value)
        assert "authenticat" in message and password not in message and new_password not in message
