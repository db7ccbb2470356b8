"""The one request classifier: kube's RequestInfo verbs, and the one boolean for ``watch``.

* A GET of a collection is ``list`` (``watch`` with ``watch=true``), a GET
  of an object ``get``; the proxy's pass-through authorization used to call
  a collection GET ``get``.
* ``watch=tRuE`` is refused the same way by every server (Go's
  ``strconv.ParseBool`` set, :func:`rangeshard.core.listoptions.parse_bool`);
  the external endpoint's own parser used to accept it. The endpoint's side
  is tested with the endpoint (tests/controller_manager/test_external_endpoint.py).
"""

from __future__ import annotations

import httpx
import pytest

from range_filter_proxy import create_app
from range_filter_proxy.auth import AuthMode, AuthSettings
from rangeshard.core.kubeapi import ApiError, parse_token_file
from rangeshard.core.listoptions import ListQuery
from rangeshard.core.requestinfo import classify, is_write, verb
from tests.range_filter_proxy.fakes import FakeUpstream
from tests.range_filter_proxy.helpers import async_test, eventually

PODS = "/api/v1/namespaces/a/pods"


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", PODS, {}, "list"),
        ("GET", "/api/v1/pods", {"watch": "true"}, "watch"),
        ("GET", PODS, {"watch": "1"}, "watch"),
        ("GET", PODS, {"watch": "false"}, "list"),
        ("GET", f"{PODS}/p", {}, "get"),
        ("HEAD", f"{PODS}/p", {}, "get"),
        ("HEAD", PODS, {}, "list"),
        ("GET", "/api/v1/watch/namespaces/a/pods", {}, "watch"),
        ("GET", "/api/v1/watch/namespaces/a/pods/p", {}, "watch"),
        ("POST", PODS, {}, "create"),
        ("PUT", f"{PODS}/p", {}, "update"),
        ("PUT", f"{PODS}/p/status", {}, "update"),
        ("PATCH", f"{PODS}/p", {}, "patch"),
        ("DELETE", f"{PODS}/p", {}, "delete"),
        ("DELETE", PODS, {}, "deletecollection"),
        ("OPTIONS", PODS, {}, "options"),
        ("GET", "/api/v1/namespaces/a", {}, "get"),
        ("GET", "/api/v1/namespaces", {}, "list"),
        ("GET", "/apis/apps/v1/namespaces/a/replicasets/r/scale", {}, "get"),
        # Non-resource requests: the method in lower case.
        ("GET", "/version", {}, "get"),
        ("GET", "/apis/apps/v1", {}, "get"),
        ("POST", "/apis", {}, "post"),
        ("HEAD", "/healthz", {}, "head"),
    ],
)
def test_the_verb_is_kubes(method: str, path: str, query: dict[str, str], expected: str) -> None:
    assert classify(method, path, query).verb == expected


def test_what_a_request_names() -> None:
    info = classify("put", "/apis/apps/v1/namespaces/a/replicasets/r/status", {})
    assert info.method == "PUT" and info.is_write and not info.is_watch and not info.collection
    assert info.resource is not None and info.resource.label == "replicasets.apps"
    assert info.subresource == "status"
    watch = classify("GET", PODS, {"watch": "true"})
    assert watch.is_watch and watch.collection and not watch.is_write and watch.invalid is None
    other = classify("GET", "/version", {})
    assert other.path is None and other.resource is None and other.subresource == "" and not other.collection
    assert [m for m in ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE") if is_write(m)] == [
        "POST",
        "PUT",
        "PATCH",
        "DELETE",
    ]
    assert verb("GET", named=False, watch=False) == "list"


@pytest.mark.parametrize("value", ["tRuE", "yes", "on", "TRUE ", "2"])
def test_an_unparsable_watch_is_no_watch_and_the_same_400_as_every_list(value: str) -> None:
    info = classify("GET", PODS, {"watch": value})
    assert info.verb == "list" and not info.is_watch
    assert info.invalid is not None and info.invalid.code == 400
    with pytest.raises(ApiError) as listed:
        ListQuery.parse({"watch": value})  # what the local API server and the proxy's cache answer
    assert listed.value.message == info.invalid.message


@pytest.mark.parametrize("value", ["1", "t", "T", "TRUE", "true", "True"])
def test_gos_true_spellings_are_watches(value: str) -> None:
    info = classify("GET", PODS, {"watch": value})
    assert info.is_watch and info.invalid is None


@async_test(timeout=60)
async def test_the_proxy_refuses_watch_true_in_odd_case_with_the_list_options_400() -> None:
    app = create_app(FakeUpstream(), resources=["pods"])
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client,
    ):
        await eventually(lambda: app.state.proxy.manager.ready()[0], what="pods cached")
        resp = await client.get(PODS, params={"watch": "tRuE"})
    expected = classify("GET", PODS, {"watch": "tRuE"}).invalid
    assert expected is not None
    assert resp.status_code == 400 and resp.json()["message"] == expected.message


@async_test(timeout=60)
async def test_the_proxys_pass_through_authorizes_a_collection_get_as_list() -> None:
    """Static auth of a pass-through request: the verb is the classifier's (it used to be ``get`` for a list)."""
    users = parse_token_file("tok,bob,1\n")
    app = create_app(FakeUpstream(), auth=AuthSettings(AuthMode.STATIC, users))
    bearer = {"Authorization": "Bearer tok"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client,
    ):
        listed = await client.get("/api/v1/namespaces/a/configmaps", headers=bearer)  # not cached: passed through
        got = await client.get("/api/v1/namespaces/a/configmaps/c", headers=bearer)
        watched = await client.get("/api/v1/namespaces/a/configmaps", params={"watch": "1"}, headers=bearer)
    # Worded as kube-apiserver words it (resource attributes, the object's name when there is one).
    where = 'in API group "" in the namespace "a"'
    assert listed.status_code == 403
    assert listed.json()["message"] == f'configmaps is forbidden: User "bob" cannot list resource "configmaps" {where}'
    assert got.status_code == 403
    assert got.json()["message"] == f'configmaps "c" is forbidden: User "bob" cannot get resource "configmaps" {where}'
    assert watched.status_code == 403 and 'cannot watch resource "configmaps"' in watched.json()["message"]
