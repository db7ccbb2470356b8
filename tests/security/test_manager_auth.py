"""A controller manager through a proxy in delegate mode: bearer token + HTTPS, end to end.

The local API server authenticates every request from its token file; the
proxy serves HTTPS, authenticates and authorizes cached list/watch with
TokenReview/SubjectAccessReview against it, and forwards writes with the
client's own token. The manager sends the token from ``proxy.tokenFile`` and
verifies the proxy with ``proxy.caCert``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.etcdserver import EtcdServer
from tests.helpers import run_cli, wait_until
from tests.security.certs import Pki
from tests.security.conftest import Tokens


def _api(server: LocalApiServerProcess, pki: Pki, token: str) -> Any:
    cfg = k8s.Configuration()
    cfg.host = server.url
    cfg.ssl_ca_cert = str(pki.ca_cert)
    cfg.api_key = {"BearerToken": token}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    return k8s.ApiClient(cfg)


def test_manager_reconciles_through_a_delegating_https_proxy(
    etcd_server: EtcdServer,
    secure_apiserver: LocalApiServerProcess,
    delegate_proxy: ProxyProcess,
    pki: Pki,
    tokens: Tokens,
    tmp_path: Path,
) -> None:
    api = _api(secure_apiserver, pki, tokens.admin)
    core: Any = k8s.CoreV1Api(api)
    apps: Any = k8s.AppsV1Api(api)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "authz"}})
    for i in range(3):
        apps.create_namespaced_replica_set(
            "authz",
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {"name": f"rs{i}", "namespace": "authz"},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": f"rs{i}"}},
                    "template": {
                        "metadata": {"labels": {"app": f"rs{i}"}},
                        "spec": {"containers": [{"name": "c", "image": "registry.local/pause:1"}]},
                    },
                },
            },
        )
    token_file = tmp_path / "token"
    token_file.write_text(tokens.admin + "\n")
    config = tmp_path / "manager.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "etcd": {"endpoints": [etcd_server.url]},
                "proxy": {"url": delegate_proxy.url, "tokenFile": "token", "caCert": str(pki.ca_cert)},
                "registryPrefix": f"/authz-{tmp_path.name[-8:]}",
                "leaseTTLSeconds": 4,
                "reconcileTimeoutSeconds": 1.0,
                "controllers": {"replicaset": {"workers": 2}},
            }
        )
    )
    log = tmp_path / "manager.log"
    proc = run_cli(
        ["--log-level", "debug", "controller-manager", "--config", str(config), "--instance-prefix", "authz"], log
    )
    try:

        def converged() -> bool:
            pods = core.list_namespaced_pod("authz").items
            return len([p for p in pods if not p.metadata.deletion_timestamp]) == 6

        wait_until(converged, 60, "six pods created through the delegating proxy")
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text(errors="replace")
    assert tokens.admin not in text, "the bearer token leaked into the manager's log"
    assert "Traceback" not in text


def test_manager_without_token_is_refused(
    etcd_server: EtcdServer, delegate_proxy: ProxyProcess, pki: Pki, tmp_path: Path
) -> None:
    config = tmp_path / "manager.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "etcd": {"endpoints": [etcd_server.url]},
                "proxy": {"url": delegate_proxy.url, "caCert": str(pki.ca_cert)},
                "registryPrefix": f"/noauth-{tmp_path.name[-8:]}",
                "leaseTTLSeconds": 4,
                "reconcileTimeoutSeconds": 1.0,
                "controllers": {"replicaset": {"workers": 1}},
            }
        )
    )
    log = tmp_path / "manager.log"
    proc = run_cli(
        ["--log-level", "info", "controller-manager", "--config", str(config), "--instance-prefix", "noauth"], log
    )
    try:
        wait_until(lambda: "API error 401" in log.read_text(errors="replace"), 30, "the informer's 401")
    finally:
        proc.terminate()
        proc.wait(30)
