"""RBAC in the local API server (``--authorization-mode RBAC``) and its ServiceAccount tokens.

Unit tests of the rule and subject matching as kube evaluates it (subresources,
``*/status``, resourceNames, nonResourceURLs, ServiceAccount subjects without
a namespace in a RoleBinding), then a real server process with a token file
(an admin in ``system:masters``) and RBAC: tokens minted with the real
``kubectl create token``, Roles and bindings applied with ``kubectl``, the
ServiceAccount's requests answered 200 or 403 as a kube-apiserver would; the
bootstrap ClusterRoles exist; TokenReview and SubjectAccessReview agree.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from local_apiserver.cli import LocalApiServerFlags
from local_apiserver.process import LocalApiServerProcess
from local_apiserver.rbac import RbacPolicy, rule_allows, subject_applies
from local_apiserver.serviceaccounts import ServiceAccountTokens
from rangeshard.core.etcdserver import EtcdServer
from rangeshard.core.kubeapi import Attributes, UserInfo
from tests.helpers import missing_prerequisite
from tests.security.certs import Pki
from tests.security.conftest import write_kubeconfig

ADMIN = "admin-token-0123456789"


def res(verb: str, resource: str, sub: str = "", name: str = "", ns: str = "demo", group: str = "") -> Attributes:
    return Attributes(verb=verb, resource=resource, group=group, namespace=ns, name=name, subresource=sub)


def test_rule_matches_subresources_as_kube() -> None:
    gadgets = {"apiGroups": ["bars.example.org"], "resources": ["gadgets"], "verbs": ["get", "patch"]}
    status = res("patch", "gadgets", "status", "g", group="bars.example.org")
    assert rule_allows(gadgets, res("patch", "gadgets", "", "g", group="bars.example.org"))
    assert not rule_allows(gadgets, status), "gadgets does not grant gadgets/status"
    assert rule_allows({**gadgets, "resources": ["gadgets", "gadgets/status"]}, status)
    assert rule_allows({**gadgets, "resources": ["*/status"]}, status)
    assert rule_allows({**gadgets, "resources": ["*"]}, status)
    assert not rule_allows({**gadgets, "apiGroups": [""]}, status)
    assert rule_allows({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, status)


def test_rule_resource_names_and_non_resource_urls() -> None:
    named = {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["a"], "verbs": ["get", "list"]}
    assert rule_allows(named, res("get", "configmaps", name="a"))
    assert not rule_allows(named, res("get", "configmaps", name="b"))
    assert not rule_allows(named, res("list", "configmaps")), "a list names no object"
    urls = {"nonResourceURLs": ["/metrics", "/apis/*"], "verbs": ["get"]}
    assert rule_allows(urls, Attributes(verb="get", path="/metrics"))
    assert rule_allows(urls, Attributes(verb="get", path="/apis/apps/v1"))
    assert not rule_allows(urls, Attributes(verb="get", path="/metricsx"))
    assert not rule_allows(urls, Attributes(verb="post", path="/metrics"))
    assert not rule_allows(urls, res("get", "metrics")), "nonResourceURLs never match a resource"


def test_subjects_as_kube() -> None:
    sa = UserInfo("system:serviceaccount:demo:op", "u", ("system:serviceaccounts", "system:authenticated"))
    assert subject_applies({"kind": "ServiceAccount", "name": "op", "namespace": "demo"}, sa, "")
    assert subject_applies({"kind": "ServiceAccount", "name": "op"}, sa, "demo"), "RoleBinding's namespace"
    assert not subject_applies({"kind": "ServiceAccount", "name": "op"}, sa, ""), "a cluster binding needs one"
    assert subject_applies({"kind": "Group", "name": "system:serviceaccounts"}, sa, "")
    assert not subject_applies({"kind": "User", "name": "op"}, sa, "")


def test_policy_role_binding_is_namespaced() -> None:
    user = UserInfo("alice", "", ("system:authenticated",))
    role = {
        "metadata": {"name": "r", "namespace": "demo"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
    }
    view = {
        "metadata": {"name": "v"},
        "rules": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list"]}],
    }
    rb = {
        "metadata": {"name": "b", "namespace": "demo"},
        "roleRef": {"kind": "Role", "name": "r"},
        "subjects": [{"kind": "User", "name": "alice"}],
    }
    rb2 = {**rb, "metadata": {"name": "b2", "namespace": "demo"}, "roleRef": {"kind": "ClusterRole", "name": "v"}}
    policy = RbacPolicy.from_objects([role], [view], [rb, rb2], [])
    assert policy.authorize(user, res("get", "pods", name="p"))[0]
    assert not policy.authorize(user, res("get", "pods", name="p", ns="other"))[0]
    assert policy.authorize(user, res("list", "deployments", group="apps"))[0]
    assert not policy.authorize(user, res("list", "deployments", group="apps", ns=""))[0], "cluster-wide list"
    assert policy.authorize(UserInfo("root", "", ("system:masters",)), res("delete", "nodes", ns=""))[0]


def test_service_account_tokens_verify_and_expire() -> None:
    tokens = ServiceAccountTokens()
    token, _ = tokens.issue("demo", "op", "uid-1", ["aud"], 600)
    assert tokens.claims(token) == ("demo", "op", "uid-1", ["aud"])
    assert tokens.claims(token, now=time.time() + 601) is None
    assert ServiceAccountTokens().claims(token) is None, "another server's key"
    assert tokens.claims(token[:-2] + "xx") is None
    assert tokens.claims("not-a-jwt") is None


def test_authorization_mode_option(tmp_path: Path) -> None:
    """``--authorization-mode`` as kube spells it: one of the modes this server implements, with a token file."""
    tokens = tmp_path / "t.csv"
    tokens.write_text("t,admin,1\n")
    assert LocalApiServerFlags.model_validate({}).authorization_mode is None
    assert (
        LocalApiServerFlags.model_validate({"authorization_mode": "RBAC", "token_file": str(tokens)}).authorization_mode
        == "RBAC"
    )
    for bad, word in (("Node,RBAC", "'Node' is not supported"), ("RBAC", "needs --token-file"), ("ABAC", "ABAC")):
        with pytest.raises(ValidationError, match=word):
            LocalApiServerFlags.model_validate(
                {"authorization_mode": bad, **({} if word == "needs --token-file" else {"token_file": str(tokens)})}
            )


# ---- a real server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rbac_server(
    etcd_server: EtcdServer, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalApiServerProcess]:
    """HTTPS: client-go (kubectl) sends no bearer token over plain HTTP."""
    here = tmp_path_factory.mktemp("rbac")
    (here / "tokens.csv").write_text(f'{ADMIN},admin,1,"system:masters"\n')
    proc = LocalApiServerProcess(
        etcd_server.url,
        prefix=f"/test-rbac-{uuid.uuid4().hex[:8]}",
        log_file=here / "apiserver.log",
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        extra_args=["--token-file", str(here / "tokens.csv"), "--authorization-mode", "RBAC"],
    )
    proc.start()
    yield proc
    proc.stop()


Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def kubectl(rbac_server: LocalApiServerProcess, pki: Pki, tmp_path: Path) -> Kubectl:
    exe = shutil.which("kubectl")
    if exe is None:
        missing_prerequisite("kubectl is not installed")
    home = tmp_path / "home"
    home.mkdir()
    config = write_kubeconfig(tmp_path / "kubeconfig", rbac_server.url, pki.ca_pem(), ADMIN)

    def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [exe, "--kubeconfig", str(config), "--cache-dir", str(tmp_path / "cache"), *args]
        return subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=60, env={"HOME": str(home)})

    return run


@pytest.fixture
def client(pki: Pki) -> Iterator[Callable[[str, str], httpx.Client]]:
    made: list[httpx.Client] = []

    def make(url: str, token: str) -> httpx.Client:
        verify = ssl.create_default_context(cafile=str(pki.ca_cert))
        made.append(httpx.Client(base_url=url, timeout=10, headers=bearer(token), verify=verify))
        return made[-1]

    yield make
    for c in made:
        c.close()


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, r.stderr
    return r.stdout


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_service_account_under_rbac(
    kubectl: Kubectl, rbac_server: LocalApiServerProcess, client: Callable[[str, str], httpx.Client]
) -> None:
    ns = f"rbac-{uuid.uuid4().hex[:6]}"
    ok(kubectl("create", "namespace", ns))
    ok(kubectl("create", "serviceaccount", "op", "-n", ns))
    token = ok(kubectl("create", "token", "op", "-n", ns)).strip()
    http = client(rbac_server.url, token)
    cms = f"/api/v1/namespaces/{ns}/configmaps"
    assert http.get("/apis").status_code == 200, "system:discovery for every authenticated user"
    denied = http.get(cms)
    assert denied.status_code == 403, denied.text
    assert f'User "system:serviceaccount:{ns}:op" cannot list resource "configmaps"' in denied.json()["message"]

    ok(kubectl("create", "role", "cm", "-n", ns, "--verb=get,list,create", "--resource=configmaps"))
    ok(kubectl("create", "rolebinding", "cm", "-n", ns, "--role=cm", f"--serviceaccount={ns}:op"))
    assert_eventually(lambda: http.get(cms).status_code == 200)
    assert http.post(cms, json={"metadata": {"name": "a"}}).status_code == 201
    assert http.delete(f"{cms}/a").status_code == 403, "delete was not granted"
    assert http.get("/api/v1/namespaces/default/configmaps").status_code == 403, "a RoleBinding is namespaced"
    # The group of the namespace's service accounts, by a ClusterRoleBinding to a bootstrap-style ClusterRole.
    ok(kubectl("create", "clusterrole", f"{ns}-pods", "--verb=list", "--resource=pods"))
    ok(
        kubectl(
            "create",
            "clusterrolebinding",
            f"{ns}-pods",
            f"--clusterrole={ns}-pods",
            f"--group=system:serviceaccounts:{ns}",
        )
    )
    assert_eventually(lambda: http.get("/api/v1/pods").status_code == 200)

    # TokenReview and SubjectAccessReview as a delegating proxy asks them (the admin may create them).
    admin = client(rbac_server.url, ADMIN)
    review = admin.post(
        "/apis/authentication.k8s.io/v1/tokenreviews", json={"kind": "TokenReview", "spec": {"token": token}}
    ).json()
    user = review["status"]["user"]
    assert review["status"]["authenticated"] and user["username"] == f"system:serviceaccount:{ns}:op"
    assert {"system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"} <= set(user["groups"])

    def sar(resource: str, verb: str, namespace: str) -> Any:
        spec = {"user": user["username"], "groups": user["groups"]}
        spec["resourceAttributes"] = {"verb": verb, "resource": resource, "namespace": namespace}
        return admin.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json={"spec": spec}).json()["status"]

    assert sar("configmaps", "list", ns)["allowed"]
    assert not sar("configmaps", "list", "default")["allowed"]

    # Deleting the account voids its tokens.
    ok(kubectl("delete", "serviceaccount", "op", "-n", ns))
    assert http.get(cms).status_code == 401


def test_bootstrap_roles_and_unauthenticated(
    kubectl: Kubectl, rbac_server: LocalApiServerProcess, client: Callable[[str, str], httpx.Client]
) -> None:
    out = ok(kubectl("get", "clusterroles", "-o", "name"))
    for name in ("cluster-admin", "system:auth-delegator", "system:discovery"):
        assert f"clusterrole.rbac.authorization.k8s.io/{name}" in out
    assert client(rbac_server.url, "unknown").get("/api/v1/pods").status_code == 401
    bad = kubectl("create", "token", "nobody", "-n", "default")
    assert bad.returncode != 0 and "not found" in bad.stderr
    short = kubectl("create", "token", "default", "-n", "default", "--duration=1m")
    assert short.returncode != 0 and "10 minutes" in short.stderr


def test_non_resource_paths_follow_rbac_as_kube(
    kubectl: Kubectl, rbac_server: LocalApiServerProcess, client: Callable[[str, str], httpx.Client]
) -> None:
    """Under RBAC a non-resource path is decided by ``nonResourceURLs`` rules, not by the static policy."""
    ns = f"nonres-{uuid.uuid4().hex[:6]}"
    ok(kubectl("create", "namespace", ns))
    ok(kubectl("create", "serviceaccount", "watcher", "-n", ns))
    http = client(rbac_server.url, ok(kubectl("create", "token", "watcher", "-n", ns)).strip())
    # Discovery and version: kube's bootstrap system:discovery / system:public-info-viewer for every user.
    for path in ("/api", "/apis", "/version", "/openapi/v2"):
        assert http.get(path).status_code == 200, path
    # /metrics is not discovery: kube answers 403 until a nonResourceURLs rule grants it.
    denied = http.get("/metrics")
    assert denied.status_code == 403, denied.text
    assert denied.json()["message"].startswith(f'forbidden: User "system:serviceaccount:{ns}:watcher" cannot get path')
    role = f"{ns}-metrics"
    ok(kubectl("create", "clusterrole", role, "--verb=get", "--non-resource-url=/metrics"))
    ok(kubectl("create", "clusterrolebinding", role, f"--clusterrole={role}", f"--serviceaccount={ns}:watcher"))
    assert_eventually(lambda: http.get("/metrics").status_code == 200)
    # A granted path is granted for that verb only, and other paths stay closed.
    assert http.post("/metrics").status_code in (403, 405)
    assert http.get("/logs/").status_code == 403
    assert client(rbac_server.url, ADMIN).get("/metrics").status_code == 200, "system:masters: cluster-admin"


def assert_eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)
