"""Authentication and authorization end to end: the local API server with a token file, the proxy in delegate mode.

Real processes over HTTPS: ``secure_apiserver`` (``--token-file``) and
``delegate_proxy`` (``--kubeconfig`` with the CA and its own token,
``--auth-mode delegate``). Clients: httpx and the official ``kubernetes``
client with a bearer token.
"""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kubernetes.client
import orjson
import pytest
from kubernetes.client.rest import ApiException

from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess
from tests.security.certs import Pki
from tests.security.conftest import Tokens


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_status(resp: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert resp.status_code == code, resp.text
    doc = resp.json()
    assert doc["kind"] == "Status" and doc["code"] == code and doc["reason"] == reason, doc
    return doc


@pytest.fixture
def api(secure_apiserver: LocalApiServerProcess, pki: Pki) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=secure_apiserver.url, verify=ssl.create_default_context(cafile=str(pki.ca_cert)), timeout=10.0
    ) as client:
        yield client


@pytest.fixture
def via_proxy(delegate_proxy: ProxyProcess, pki: Pki) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=delegate_proxy.url, verify=ssl.create_default_context(cafile=str(pki.ca_cert)), timeout=10.0
    ) as client:
        yield client


@pytest.fixture
def namespace(api: httpx.Client, tokens: Tokens) -> str:
    name = f"sec-{uuid.uuid4().hex[:8]}"
    resp = api.post("/api/v1/namespaces", json={"metadata": {"name": name}}, headers=bearer(tokens.admin))
    assert resp.status_code == 201, resp.text
    return name


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"app": "sec"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}


def kube_client(url: str, pki: Pki, token: str) -> kubernetes.client.ApiClient:
    cfg = kubernetes.client.Configuration()
    cfg.host = url
    cfg.ssl_ca_cert = str(pki.ca_cert)
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return kubernetes.client.ApiClient(cfg)


# ---- the local API server ------------------------------------------------------------------


def test_apiserver_authenticates_every_request(api: httpx.Client, tokens: Tokens) -> None:
    assert api.get("/readyz").status_code == 200  # probes stay public
    assert api.get("/healthz").status_code == 200
    for headers in (
        {},
        bearer(tokens.unknown),
        {"Authorization": "Basic YWRtaW46YWRtaW4="},
        {"Authorization": "Bearer"},
    ):
        assert_status(api.get("/api/v1/pods", headers=headers), 401, "Unauthorized")
        assert_status(api.get("/version", headers=headers), 401, "Unauthorized")
    assert api.get("/version", headers=bearer(tokens.nobody)).status_code == 200  # discovery for everybody
    assert api.get("/apis", headers=bearer(tokens.nobody)).status_code == 200


def test_apiserver_policy(api: httpx.Client, tokens: Tokens, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    doc = assert_status(api.post(path, json=pod("p"), headers=bearer(tokens.reader)), 403, "Forbidden")
    assert doc["message"] == (
        f'pods is forbidden: User "reader" cannot create resource "pods" in API group "" in the namespace "{namespace}"'
    )
    assert_status(api.get(path, headers=bearer(tokens.nobody)), 403, "Forbidden")
    assert api.post(path, json=pod("p"), headers=bearer(tokens.admin)).status_code == 201
    assert [p["metadata"]["name"] for p in api.get(path, headers=bearer(tokens.reader)).json()["items"]] == ["p"]
    assert_status(api.delete(f"{path}/p", headers=bearer(tokens.reader)), 403, "Forbidden")


def test_token_and_access_reviews_with_the_kubernetes_client(
    secure_apiserver: LocalApiServerProcess, pki: Pki, tokens: Tokens
) -> None:
    with kube_client(secure_apiserver.url, pki, tokens.proxy) as client:
        authn = kubernetes.client.AuthenticationV1Api(client)
        review = authn.create_token_review(
            kubernetes.client.V1TokenReview(spec=kubernetes.client.V1TokenReviewSpec(token=tokens.reader))
        )
        assert review.status.authenticated is True
        assert review.status.user.username == "reader"
        assert set(review.status.user.groups) == {"rangeshard:readers", "system:authenticated"}
        bad = authn.create_token_review(
            kubernetes.client.V1TokenReview(spec=kubernetes.client.V1TokenReviewSpec(token=tokens.unknown))
        )
        assert bad.status.authenticated is False
        authz = kubernetes.client.AuthorizationV1Api(client)

        def allowed(user: str, groups: list[str], verb: str) -> bool:
            sar = kubernetes.client.V1SubjectAccessReview(
                spec=kubernetes.client.V1SubjectAccessReviewSpec(
                    user=user,
                    groups=groups,
                    resource_attributes=kubernetes.client.V1ResourceAttributes(
                        verb=verb, resource="pods", namespace="default"
                    ),
                )
            )
            return bool(authz.create_subject_access_review(sar).status.allowed)

        assert allowed("reader", ["rangeshard:readers"], "list")
        assert not allowed("reader", ["rangeshard:readers"], "create")
        assert allowed("admin", ["system:masters"], "create")
        assert not allowed("nobody", ["system:authenticated"], "watch")
    # Reviews are themselves authorized: a plain reader may not probe tokens.
    with kube_client(secure_apiserver.url, pki, tokens.reader) as client:
        with pytest.raises(ApiException) as err:
            kubernetes.client.AuthenticationV1Api(client).create_token_review(
                kubernetes.client.V1TokenReview(spec=kubernetes.client.V1TokenReviewSpec(token=tokens.admin))
            )
        assert err.value.status == 403


def test_review_bad_input_is_a_status(api: httpx.Client, tokens: Tokens) -> None:
    h = bearer(tokens.admin)
    path = "/apis/authentication.k8s.io/v1/tokenreviews"
    assert_status(api.post(path, json={"spec": {}}, headers=h), 400, "BadRequest")
    assert_status(api.post(path, json=[1], headers=h), 400, "BadRequest")
    assert_status(api.get(path, headers=h), 405, "MethodNotAllowed")
    sar = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    assert_status(api.post(sar, json={"spec": {"user": "x"}}, headers=h), 422, "Invalid")
    assert_status(api.post(sar, json={"spec": {"resourceAttributes": {}}}, headers=h), 422, "Invalid")
    assert api.get("/apis/authentication.k8s.io/v1", headers=h).json()["resources"][0]["name"] == "tokenreviews"


# ---- the proxy in delegate mode ---------------------------------------------------------------


def test_proxy_delegates_list_and_watch(
    via_proxy: httpx.Client, api: httpx.Client, tokens: Tokens, namespace: str
) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    assert api.post(path, json=pod("a"), headers=bearer(tokens.admin)).status_code == 201
    assert via_proxy.get("/readyz").status_code == 200
    assert_status(via_proxy.get(path), 401, "Unauthorized")
    assert_status(via_proxy.get(path, headers=bearer(tokens.unknown)), 401, "Unauthorized")
    doc = assert_status(via_proxy.get(path, headers=bearer(tokens.nobody)), 403, "Forbidden")
    assert 'User "nobody" cannot list resource "pods"' in doc["message"]
    assert_status(via_proxy.get(path, params={"watch": "true"}, headers=bearer(tokens.nobody)), 403, "Forbidden")
    listed = via_proxy.get(path, headers=bearer(tokens.reader))
    assert listed.status_code == 200, listed.text
    assert [p["metadata"]["name"] for p in listed.json()["items"]] == ["a"]
    with via_proxy.stream(
        "GET", path, params={"watch": "true", "timeoutSeconds": "5"}, headers=bearer(tokens.reader)
    ) as resp:
        assert resp.status_code == 200
        first = next(line for line in resp.iter_lines() if line.strip())
        assert orjson.loads(first)["object"]["metadata"]["name"] == "a"
    assert_status(via_proxy.get("/metrics", headers=bearer(tokens.unknown)), 401, "Unauthorized")
    assert via_proxy.get("/metrics", headers=bearer(tokens.nobody)).status_code == 200


def test_proxy_passthrough_forwards_the_client_token_only(
    via_proxy: httpx.Client, tokens: Tokens, namespace: str
) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    # Writes are passed through with the client's token: the upstream decides.
    assert via_proxy.post(path, json=pod("w"), headers=bearer(tokens.admin)).status_code == 201
    assert_status(via_proxy.post(path, json=pod("x"), headers=bearer(tokens.reader)), 403, "Forbidden")
    # Without a token the proxy must not lend its own credentials.
    assert_status(via_proxy.get(f"{path}/w"), 401, "Unauthorized")
    assert_status(via_proxy.delete(f"{path}/w"), 401, "Unauthorized")
    assert via_proxy.get(f"{path}/w", headers=bearer(tokens.reader)).status_code == 200


def test_proxy_with_the_kubernetes_client(
    delegate_proxy: ProxyProcess, pki: Pki, tokens: Tokens, api: httpx.Client, namespace: str
) -> None:
    assert api.post(f"/api/v1/namespaces/{namespace}/pods", json=pod("k"), headers=bearer(tokens.admin)).is_success
    with kube_client(delegate_proxy.url, pki, tokens.reader) as client:
        names = [p.metadata.name for p in kubernetes.client.CoreV1Api(client).list_namespaced_pod(namespace).items]
        assert names == ["k"]
    for token, code in ((tokens.unknown, 401), (tokens.nobody, 403)):
        with kube_client(delegate_proxy.url, pki, token) as client:
            with pytest.raises(ApiException) as err:
                kubernetes.client.CoreV1Api(client).list_namespaced_pod(namespace)
            assert err.value.status == code
            assert orjson.loads(err.value.body)["kind"] == "Status"


def test_proxy_static_mode(
    secure_apiserver: LocalApiServerProcess, pki: Pki, tokens: Tokens, token_file: Path, tmp_path: Path, namespace: str
) -> None:
    """--auth-mode static: tokens from the file; pass-through uses the proxy's own (upstream-https) credentials."""
    from tests.security.conftest import write_kubeconfig  # noqa: PLC0415

    kubeconfig = write_kubeconfig(tmp_path / "kc", secure_apiserver.url, pki.ca_pem(), tokens.admin)
    with (
        ProxyProcess(
            None,
            kubeconfig=kubeconfig,
            log_file=tmp_path / "proxy.log",
            extra_args=["--auth-mode", "static", "--token-file", str(token_file)],
        ) as proxy,
        httpx.Client(base_url=proxy.url, timeout=10.0) as client,
    ):
        path = f"/api/v1/namespaces/{namespace}/pods"
        assert_status(client.get(path), 401, "Unauthorized")
        assert_status(client.get(path, headers=bearer(tokens.nobody)), 403, "Forbidden")
        assert client.get(path, headers=bearer(tokens.reader)).status_code == 200
        assert client.get("/api/v1", headers=bearer(tokens.nobody)).status_code == 200  # discovery
        assert_status(client.post(path, json=pod("s"), headers=bearer(tokens.reader)), 403, "Forbidden")
        assert client.post(path, json=pod("s"), headers=bearer(tokens.admin)).status_code == 201
        # One wording of a 403 in both servers (issue 40): the object's name and subresource are named.
        status = f"{path}/s/status"
        by_proxy = assert_status(client.put(status, json=pod("s"), headers=bearer(tokens.reader)), 403, "Forbidden")
        expected = (
            f'pods "s" is forbidden: User "reader" cannot update resource "pods/status" in API group "" '
            f'in the namespace "{namespace}"'
        )
        assert by_proxy["message"] == expected, by_proxy
        assert by_proxy["details"] == {"kind": "pods", "name": "s"}
