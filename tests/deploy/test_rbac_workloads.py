"""The shipped workloads run under their own ServiceAccounts on an RBAC-enforcing API server, with no 403.

A local API server with ``--authorization-mode RBAC`` (HTTPS, an admin token
in ``system:masters``, an audit log) takes the rendered base and both
components (``elsewhere``: namespace ``team-ops``) with the real ``kubectl``.
Then the workloads run as processes, each with a token of its own
ServiceAccount minted by ``TokenRequest`` (what a projected token volume
holds):

* the proxy with the args of its Deployment (``--auth-mode delegate``,
  write fencing on the registry), its upstream credentials the
  ``rangeshard-proxy`` account's;
* the built-in controllers' manager with its ConfigMap's ``manager.yaml``
  and the ``rangeshard-controller-manager`` account's token;
* the sidecar manager with ``gadget-manager-config`` and the
  ``gadget-operator`` account's token, the example kopf operator as its child
  (in the pod it is the other container; the endpoint is the same).

They reconcile a Deployment (ReplicaSets, Pods, both status writes) and a
Gadget (its ConfigMap and ``status.observedGeneration`` through
``gadgets/status``). The test fails on any 403 a product component got: in
the API server's audit log (writes passed through with the caller's token),
in the proxy's denials of cached reads (its log), in the managers' and the
operator's output. Without ``gadgets/status`` in deploy/external-sidecar/
rbac.yaml every status patch of the operator was a 403.
"""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from controller_manager.process import ManagerProcess
from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.etcdserver import EtcdServer
from tests.helpers import missing_prerequisite

try:
    from tests.security.certs import Pki, make_pki
    from tests.security.conftest import write_kubeconfig
except ImportError:  # pragma: no cover - the dev extra is installed in CI
    missing_prerequisite("the cryptography package is not installed (pip install -e '.[dev]')", module_level=True)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "kopf-gadgets"
NS = "team-ops"
ADMIN = "admin-" + uuid.uuid4().hex
GROUP, VERSION, PLURAL = "bars.example.org", "v1", "gadgets"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def rbac_apiserver(
    etcd_server: EtcdServer, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalApiServerProcess]:
    here = tmp_path_factory.mktemp("rbac-apiserver")
    (here / "tokens.csv").write_text(f'{ADMIN},admin,uid-admin,"system:masters"\n')
    server = LocalApiServerProcess(
        etcd_server.url,
        prefix=f"/test-rbac-deploy-{uuid.uuid4().hex[:8]}",
        log_file=here / "apiserver.log",
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        extra_args=[
            "--token-file",
            str(here / "tokens.csv"),
            "--authorization-mode",
            "RBAC",
            "--audit-log-path",
            str(here / "audit.log"),
        ],
    )
    server.start(timeout=30)
    server.audit_path = here / "audit.log"  # type: ignore[attr-defined]
    yield server
    server.stop()


def _kubectl(server: LocalApiServerProcess, pki: Pki, home: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    exe = shutil.which("kubectl")
    if exe is None:
        missing_prerequisite("kubectl is not installed")
    config = write_kubeconfig(home / "kubeconfig", server.url, pki.ca_pem(), ADMIN)

    def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [exe, "--kubeconfig", str(config), "--cache-dir", str(home / "cache"), *args]
        return subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=120, env={"HOME": str(home)})

    return run


def _one(docs: list[dict[str, Any]], kind: str, prefix: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(prefix)]
    assert len(found) == 1, (kind, prefix, [d["metadata"]["name"] for d in found])
    return found[0]


def _token(http: httpx.Client, account: str) -> str:
    r = http.post(f"/api/v1/namespaces/{NS}/serviceaccounts/{account}/token", json={"spec": {}})
    assert r.status_code == 201, r.text
    return str(r.json()["status"]["token"])


def _proxy_args(docs: list[dict[str, Any]], etcd_url: str, prefix: str) -> list[str]:
    """The proxy Deployment's args, for a process: no --in-cluster/--host/--port, the test's etcd and prefix."""
    container = _one(docs, "Deployment", "rangeshard-proxy")["spec"]["template"]["spec"]["containers"][0]
    args = list(container["args"])
    assert args[0] == "proxy" and "--in-cluster" in args and args[args.index("--auth-mode") + 1] == "delegate"
    args = [a for a in args[1:] if a != "--in-cluster"]
    out: list[str] = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a in ("--host", "--port"):
            skip = True
            continue
        out.append(a)
        if i > 0 and args[i - 1] == "--etcd":
            out[-1] = etcd_url
        if i > 0 and args[i - 1] == "--registry-prefix":
            out[-1] = prefix
    return out


def _manager_config(
    docs: list[dict[str, Any]], configmap: str, etcd_url: str, proxy_url: str, token_file: Path, prefix: str
) -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load(_one(docs, "ConfigMap", configmap)["data"]["manager.yaml"])
    assert cfg["proxy"]["tokenFile"], "the shipped config sends the pod's ServiceAccount token"
    cfg["etcd"]["endpoints"] = [etcd_url]
    cfg["proxy"] = {**cfg["proxy"], "url": proxy_url, "tokenFile": str(token_file)}
    cfg["registryPrefix"] = prefix
    cfg["metrics"] = {"host": "127.0.0.1", "port": 0}
    cfg["rejoinGraceSeconds"] = 0
    return cfg


def _wait(check: Callable[[], bool], timeout: float, what: str, logs: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; logs:\n{logs()}")
        time.sleep(0.2)


def _forbidden_in_audit(path: Path) -> list[str]:
    bad = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        user = event.get("user", {}).get("username", "")
        if user.startswith(f"system:serviceaccount:{NS}:") and event.get("responseStatus", {}).get("code") == 403:
            bad.append(f"{user} {event.get('verb')} {event.get('requestURI')}")
    return bad


def test_workloads_run_under_their_own_service_accounts(
    elsewhere: list[dict[str, Any]],
    rbac_apiserver: LocalApiServerProcess,
    etcd_server: EtcdServer,
    pki: Pki,
    tmp_path: Path,
) -> None:
    kubectl = _kubectl(rbac_apiserver, pki, tmp_path)
    applied = kubectl("apply", "-f", "-", input="---\n".join(yaml.safe_dump(d) for d in elsewhere))
    assert applied.returncode == 0, applied.stderr
    crd = kubectl("apply", "-f", str(EXAMPLE / "crd.yaml"))
    assert crd.returncode == 0, crd.stderr

    verify = ssl.create_default_context(cafile=str(pki.ca_cert))
    admin = httpx.Client(
        base_url=rbac_apiserver.url, verify=verify, timeout=10, headers={"Authorization": f"Bearer {ADMIN}"}
    )
    procs: list[Any] = []
    try:
        prefix = f"/rbac-{uuid.uuid4().hex[:8]}"
        proxy_kubeconfig = write_kubeconfig(
            tmp_path / "proxy.kubeconfig", rbac_apiserver.url, pki.ca_pem(), _token(admin, "rangeshard-proxy")
        )
        proxy = ProxyProcess(
            None,
            kubeconfig=proxy_kubeconfig,
            log_file=tmp_path / "proxy.log",
            extra_args=_proxy_args(elsewhere, etcd_server.url, prefix),
        )
        proxy.start(timeout=30)
        procs.append(proxy)

        managers = []
        for name, configmap, account, extra in (
            ("builtin", "rangeshard-manager-config", "rangeshard-controller-manager", None),
            ("gadget", "gadget-manager-config", "gadget-operator", "kopf"),
        ):
            token_file = tmp_path / f"{name}.token"
            token_file.write_text(_token(admin, account))
            cfg = _manager_config(elsewhere, configmap, etcd_server.url, proxy.url, token_file, prefix)
            if extra:  # in the pod the operator is the other container; here the manager runs it on the same endpoint
                external = cfg["controllers"]["gadget"]["external"]
                external["command"] = [
                    sys.executable,
                    *("-m", "kopf", "run", "--standalone", "--all-namespaces"),
                    str(EXAMPLE / "operator.py"),
                ]
                external["listen"] = "127.0.0.1:0"
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            m = ManagerProcess.of_config(name, path, tmp_path / f"{name}.log", instance_prefix=name)
            m.start()
            procs.append(m)
            managers.append(m)

        # A Deployment (the built-in controllers) and a Gadget (the operator), created by the admin.
        ns = kubectl("create", "namespace", "apps")
        assert ns.returncode == 0, ns.stderr
        deployment = {
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "x"}]},
                },
            },
        }
        assert admin.post("/apis/apps/v1/namespaces/apps/deployments", json=deployment).status_code == 201
        gadget = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Gadget", "metadata": {"name": "g1"}, "spec": {"size": 2}}
        assert admin.post(f"/apis/{GROUP}/{VERSION}/namespaces/apps/{PLURAL}", json=gadget).status_code == 201

        def deployment_done() -> bool:
            d = admin.get("/apis/apps/v1/namespaces/apps/deployments/web").json()
            pods = admin.get("/api/v1/namespaces/apps/pods").json()["items"]
            return d.get("status", {}).get("observedGeneration") == d["metadata"]["generation"] and len(pods) == 2

        def gadget_done() -> bool:
            g = admin.get(f"/apis/{GROUP}/{VERSION}/namespaces/apps/{PLURAL}/g1").json()
            cm = admin.get("/api/v1/namespaces/apps/configmaps/g1-gadget")
            return (
                cm.status_code == 200 and g.get("status", {}).get("observedGeneration") == g["metadata"]["generation"]
            )

        def progress() -> str:
            return "\n".join(f"--- {p.log_path.name}\n" + p.log_path.read_text()[-2000:] for p in procs)

        _wait(deployment_done, 90, "the Deployment's pods and status under the managers' RBAC", progress)
        _wait(gadget_done, 90, "the Gadget's ConfigMap and status.observedGeneration under its RBAC", progress)

        # Progress through the delegate-mode proxy: found in the records (proxyUrl), read with a token.
        admin_token = tmp_path / "admin.token"
        admin_token.write_text(ADMIN)
        listed = subprocess.run(
            [
                *(sys.executable, "-m", "rangeshard.cli.main", "registry", "list", "-o", "wide"),
                *("--etcd", etcd_server.url, "--prefix", prefix, "--state-dir", str(tmp_path / "none")),
                *("--token-file", str(admin_token)),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 0, listed.stderr
        assert "gadget-gadget" in listed.stdout and "progress: unknown" not in listed.stdout, listed.stdout
        assert "not measurable" not in listed.stdout, listed.stdout  # the operator writes observedGeneration

        # Writes forwarded with the callers' tokens: the API server's audit log has every answer.
        assert _forbidden_in_audit(rbac_apiserver.audit_path) == []  # type: ignore[attr-defined]
        for p in procs:
            text = p.log_path.read_text(errors="replace")
            found = re.search(r"(?i)forbidden|[\s\"]403[\s,]", text)
            assert found is None, (p.log_path, text[max(0, found.start() - 1500) : found.end() + 500])
    finally:
        for p in reversed(procs):
            p.stop()
        admin.close()
