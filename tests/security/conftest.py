"""Fixtures of the security tests: a throw-away PKI, a token file, and a local API server + proxy with TLS and auth.

``secure_apiserver`` is a real local API server process serving HTTPS with a
``--token-file``; ``delegate_proxy`` is a real proxy process that serves HTTPS
too, reaches that server through a kubeconfig (server URL, inline
``certificate-authority-data``, its own bearer token) and runs
``--auth-mode delegate``. Both log at debug level so the secret-leak test
has the most to grep.
"""

from __future__ import annotations

import base64
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.etcdserver import EtcdServer
from tests.helpers import missing_prerequisite

try:
    import cryptography  # noqa: F401
except ImportError:
    missing_prerequisite("the cryptography package is not installed (pip install -e '.[dev]')", module_level=True)

from tests.security.certs import Pki, make_pki


@dataclass(frozen=True)
class Tokens:
    """One token per identity of the test token file."""

    admin: str  # system:masters
    proxy: str  # rangeshard:auth-delegators + rangeshard:readers (the proxy's own identity)
    reader: str  # rangeshard:readers
    nobody: str  # authenticated, no group: discovery only
    unknown: str  # not in the file

    def all(self) -> list[str]:
        return [self.admin, self.proxy, self.reader, self.nobody, self.unknown]


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def tokens() -> Tokens:
    return Tokens(*(f"tok-{name}-{secrets.token_hex(16)}" for name in ("admin", "proxy", "reader", "nobody", "unk")))


@pytest.fixture(scope="session")
def token_file(tmp_path_factory: pytest.TempPathFactory, tokens: Tokens) -> Path:
    path = tmp_path_factory.mktemp("tokens") / "tokens.csv"
    path.write_text(
        "# token,user,uid,groups\n"
        f'{tokens.admin},admin,uid-admin,"system:masters"\n'
        f'{tokens.proxy},system:serviceaccount:rangeshard:proxy,uid-proxy,"rangeshard:auth-delegators,rangeshard:readers"\n'
        f'{tokens.reader},reader,uid-reader,"rangeshard:readers"\n'
        f"{tokens.nobody},nobody,uid-nobody\n"
    )
    return path


@pytest.fixture(scope="session")
def secure_apiserver(
    etcd_server: EtcdServer, pki: Pki, token_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalApiServerProcess]:
    base = tmp_path_factory.mktemp("secure-las")
    server = LocalApiServerProcess(
        etcd_server.url,
        prefix=f"/security-{uuid.uuid4().hex[:8]}",
        log_file=base / "apiserver.log",
        bookmark_interval=0.3,
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        extra_args=["--token-file", str(token_file), "--log-level", "debug"],
    )
    server.start(timeout=30)
    yield server
    server.stop()


def write_kubeconfig(path: Path, server: str, ca_pem: bytes, token: str) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {"server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()},
            }
        ],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="session")
def delegate_proxy(
    secure_apiserver: LocalApiServerProcess, pki: Pki, tokens: Tokens, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    base = tmp_path_factory.mktemp("delegate-proxy")
    kubeconfig = write_kubeconfig(base / "kubeconfig", secure_apiserver.url, pki.ca_pem(), tokens.proxy)
    proc = ProxyProcess(
        None,
        kubeconfig=kubeconfig,
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        resources=["pods"],
        log_file=base / "proxy.log",
        extra_args=["--auth-mode", "delegate", "--auth-cache-ttl", "2", "--log-level", "debug"],
    )
    proc.start(timeout=30)
    yield proc
    proc.stop()
