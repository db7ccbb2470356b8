"""Bad input gets a 4xx Kubernetes Status with a message, never a 500 or a traceback."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.local_apiserver.conftest import deployment, metric

CM = "/api/v1/namespaces/default/configmaps"
JSON = {"content-type": "application/json"}


def _status(resp: httpx.Response, code: int) -> dict[str, Any]:
    assert resp.status_code == code, resp.text
    body: dict[str, Any] = resp.json()
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure"
    assert body["code"] == code and body["message"] and body["reason"]
    assert "Traceback" not in resp.text
    return body


@pytest.mark.parametrize(
    ("body", "code", "needle"),
    [
        (b"{not json", 400, "couldn't decode"),
        (b"", 400, "empty"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b'{"kind": "Pod", "metadata": {"name": "x"}}', 400, "does not match the kind"),
        (b'{"apiVersion": "apps/v1", "metadata": {"name": "x"}}', 400, "API version"),
        (b'{"metadata": {"name": "Not_A_Name"}}', 422, "RFC 1123 subdomain"),
        (b'{"metadata": {"name": "' + b"a" * 254 + b'"}}', 422, "at most 253"),
        (b'{"metadata": {}}', 422, "name or generateName is required"),
        (b'{"metadata": {"name": "x", "labels": {"bad key!": "v"}}}', 422, "metadata.labels"),
        (b'{"metadata": {"name": "x", "labels": {"k": 3}}}', 400, "map of strings"),
        (b'{"metadata": "x"}', 400, "metadata must be a JSON object"),
        (b'{"metadata": {"name": "x", "resourceVersion": "12"}}', 400, "should not be set"),
        (b'{"metadata": {"name": "x"}, "data": {"k": 1}}', 422, "map of strings"),
        (b'{"metadata": {"name": "x", "namespace": "other"}}', 400, "does not match the namespace"),
    ],
)
def test_bad_create_bodies(http: httpx.Client, body: bytes, code: int, needle: str) -> None:
    assert needle in _status(http.post(CM, content=body, headers=JSON), code)["message"]


def test_invalid_names_per_kind(http: httpx.Client) -> None:
    _status(http.post("/api/v1/namespaces", json={"metadata": {"name": "has.dot"}}), 422)  # a label, not a subdomain
    bad = deployment("d")
    bad["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    assert "selector" in _status(http.post("/apis/apps/v1/namespaces/default/deployments", json=bad), 422)["message"]
    bad = deployment("d", replicas=-1)
    _status(http.post("/apis/apps/v1/namespaces/default/deployments", json=bad), 422)
    pod = {"metadata": {"name": "p"}, "spec": {"containers": []}}
    _status(http.post("/api/v1/namespaces/default/pods", json=pod), 422)


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"labelSelector": "a in (b"}, "expected ')'"),
        ({"labelSelector": "a=b,"}, "trailing"),
        ({"labelSelector": "bad key!=x"}, "unable to parse"),
        ({"labelSelector": "a gt 1"}, "unable to parse"),
        ({"fieldSelector": "spec.foo=bar"}, "field label not supported"),
        ({"fieldSelector": "metadata.name"}, "invalid selector"),
        ({"resourceVersion": "abc"}, "resource version"),
        ({"resourceVersion": "-1"}, "resource version"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "1.5"}, "limit"),
        ({"limit": "-3"}, "limit"),
        ({"continue": "not-a-token"}, "continue"),
        ({"watch": "maybe"}, "watch"),
        ({"watch": "true", "timeoutSeconds": "soon"}, "timeoutSeconds"),
        ({"watch": "true", "timeoutSeconds": "1.5"}, "timeoutSeconds"),
        ({"watch": "yes"}, "watch"),
        ({"continue": "x", "resourceVersion": "5"}, "specifying resource version is not allowed when using continue"),
        ({"watch": "true", "resourceVersion": "x1"}, "resource version"),
        ({"shardSelector": "shardRange(object.metadata.uid, '0x0')"}, "invalid shard selector"),
        (
            {"shardSelector": "shardRange(object.metadata.uid, '0x0', '0x8000000000000002')"},
            'invalid shard selector: hexStart must be a 0x-prefixed 16-digit hex value, got "0x0" '
            '(did you mean "0x0000000000000000"?)',  # the real KEP-5866 server's words
        ),
        ({"dryRun": "All"}, "dryRun"),
    ],
)
def test_bad_list_and_watch_parameters(http: httpx.Client, params: dict[str, str], needle: str) -> None:
    assert needle in _status(http.get(CM, params=params), 400)["message"]


def test_unknown_paths_and_methods(http: httpx.Client) -> None:
    assert "no resource 'widgets'" in _status(http.get("/api/v1/widgets"), 404)["message"]
    _status(http.get("/apis/nope.example.com/v1/things"), 404)
    _status(http.get("/apis/apps/v2/deployments"), 404)
    _status(http.get("/openapi/v3/apis/nope.example.com/v1"), 404)
    assert (
        "no resource 'bindings' in core/v1" in _status(http.get("/api/v1/namespaces/default/bindings"), 404)["message"]
    )
    _status(
        http.get("/openapi/v2", headers={"accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"}), 406
    )
    _status(http.get("/api/v1/namespaces/default/configmaps/x/status"), 404)  # no status subresource
    _status(http.get("/api/v1/namespaces/default/pods/x/log"), 404)
    _status(http.get("/api/v1/namespaces/default/configmaps/missing"), 404)
    _status(http.delete("/api/v1/configmaps"), 405)  # deletecollection across namespaces
    _status(http.delete("/api/v1/namespaces"), 405)  # kube serves no deletecollection of namespaces
    _status(http.post(f"{CM}/x", json={}), 405)
    _status(http.put(CM, json={}), 405)
    _status(http.post("/api/v1/configmaps", json={"metadata": {"name": "x"}}), 405)
    _status(http.get("/api/v1/namespaces/default/configmaps/x/y/z"), 404)
    _status(http.post("/apis", json={}), 405)
    _status(http.delete("/healthz"), 404)


def test_unsupported_media_types(http: httpx.Client) -> None:
    # Protobuf of a kind the server does not decode: 415 naming it (tests/local_apiserver/test_protobuf_bodies.py).
    limits = b"k8s\x00\x0a\x10\x0a\x02v1\x12\x0aLimitRange\x12\x00"
    protobuf = {"content-type": "application/vnd.kubernetes.protobuf"}
    body = _status(http.post("/api/v1/namespaces/default/limitranges", content=limits, headers=protobuf), 415)
    assert "LimitRange (v1)" in body["message"] and "--dry-run=client -o yaml | kubectl apply -f -" in body["message"]
    _status(http.post(CM, content=b"x", headers={"content-type": "text/plain"}), 415)
    http.post(CM, json={"metadata": {"name": "media"}})
    smp = {"content-type": "application/strategic-merge-patch+json"}
    # Unknown strategic merge directives are refused, never stored as data.
    _status(http.patch(f"{CM}/media", content=b'{"$unknown":"x"}', headers=smp), 415)
    _status(http.patch(f"{CM}/media", content=b'{"data":{"$patch":"sideways"}}', headers=smp), 415)
    ok = http.patch(f"{CM}/media", content=b'{"data":{"k":"v"}}', headers=smp)
    assert ok.status_code == 200 and ok.json()["data"] == {"k": "v"}
    _status(http.patch(f"{CM}/media", content=b"{}", headers={"content-type": "application/apply-patch+yaml"}), 415)
    _status(http.get(CM, headers={"accept": "application/vnd.kubernetes.protobuf"}), 406)
    _status(http.get(CM, headers={"accept": "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"}), 406)
    assert http.get(CM, headers={"accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}).json()["kind"] == "Table"
    assert http.get(CM, headers={"accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}).is_success


def test_bad_updates_and_patches(http: httpx.Client) -> None:
    http.post(CM, json={"metadata": {"name": "u"}})
    _status(http.put(f"{CM}/u", json={"metadata": {"name": "other"}}), 400)
    _status(http.put(f"{CM}/u", json={"metadata": {"name": "u", "resourceVersion": "abc"}}), 400)
    _status(http.put(f"{CM}/u", json={"metadata": {"name": "u", "resourceVersion": "1"}}), 409)
    _status(http.put(f"{CM}/missing", json={"metadata": {"name": "missing"}}), 404)
    merge = {"content-type": "application/merge-patch+json"}
    jsonp = {"content-type": "application/json-patch+json"}
    _status(http.patch(f"{CM}/u", content=b"[1]", headers=merge), 400)
    _status(http.patch(f"{CM}/u", content=b'{"metadata":{"name":"v"}}', headers=merge), 422)
    _status(http.patch(f"{CM}/u", content=b'{"metadata":{"resourceVersion":"1"}}', headers=merge), 409)
    _status(http.patch(f"{CM}/u", content=b'{"op":"add"}', headers=jsonp), 400)
    _status(http.patch(f"{CM}/u", content=b'[{"op":"remove","path":"/data/nope"}]', headers=jsonp), 422)
    _status(http.patch(f"{CM}/u", content=b'[{"op":"test","path":"/metadata/name","value":"z"}]', headers=jsonp), 422)
    _status(http.patch(f"{CM}/u", content=b'[{"op":"fly","path":"/x"}]', headers=jsonp), 400)
    _status(http.request("DELETE", f"{CM}/u", content=b"{bad", headers=JSON), 400)
    # kube validates DeleteOptions (ValidateDeleteOptions): an unsupported policy is 422 Invalid.
    _status(http.request("DELETE", f"{CM}/u", json={"propagationPolicy": "Sometimes"}), 422)
    _status(http.request("DELETE", f"{CM}/u", json={"preconditions": {"uid": "nope"}}), 409)
    dep = deployment("sc")
    http.post("/apis/apps/v1/namespaces/default/deployments", json=dep)
    scale = "/apis/apps/v1/namespaces/default/deployments/sc/scale"
    _status(http.put(scale, json={"spec": {"replicas": -2}}), 422)
    _status(http.put(scale, json={"kind": "Deployment", "spec": {"replicas": 2}}), 400)
    _status(http.patch(scale, content=b'{"spec":{"replicas":"many"}}', headers=merge), 422)


def test_bad_input_never_reached_the_bug_handler(http: httpx.Client) -> None:
    # Runs last in this module: every request above was answered without a 500.
    assert metric(http, "local_apiserver_requests_total") > 50
    assert metric(http, "local_apiserver_requests_total", code="500") == 0
