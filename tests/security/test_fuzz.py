"""Bad input, property-based: nothing a client sends makes the proxy or the local API server answer 500.

Hypothesis generates list/watch query parameters (label, field and shard
selectors, resourceVersion and its match, limit, continue, timeoutSeconds,
the boolean flags) from grammar fragments mixed with arbitrary text, and
request bodies (arbitrary JSON, valid objects with one field replaced by
arbitrary JSON, arbitrary bytes) for create, update and every patch type.
Every request goes to a real local API server and, through a real proxy in
front of it, to the proxy's cache or pass-through. Each answer must be a
success or a 4xx (504 "Too large resource version" is a legitimate answer
of the proxy) carrying a Kubernetes ``Status``; at the end the server's own
500 counter must still be zero.

Why not schemathesis: both apps route every Kubernetes path through one
catch-all handler and publish no OpenAPI document (``openapi_url=None``), so
a schema-driven fuzzer has nothing to derive requests from; the strategies
below encode the grammar instead. Example counts are small so the whole
file runs in well under 30 s.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.etcdserver import EtcdServer

FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")),
    deadline=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
NAMESPACE = "fuzz"

# ---- servers -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    base: Path = tmp_path_factory.mktemp("fuzz")
    with LocalApiServerProcess(
        etcd_server.url, prefix=f"/fuzz-{uuid.uuid4().hex[:8]}", log_file=base / "las.log", bookmark_interval=0.5
    ) as api:
        with httpx.Client(base_url=api.url) as client:
            assert client.post("/api/v1/namespaces", json={"metadata": {"name": NAMESPACE}}).status_code == 201
        with ProxyProcess(api.url, resources=["pods"], log_file=base / "proxy.log") as proxy:
            yield api.url, proxy.url


@pytest.fixture(scope="module")
def clients(servers: tuple[str, str]) -> Iterator[list[httpx.Client]]:
    api_url, proxy_url = servers
    with httpx.Client(base_url=api_url, timeout=10.0) as api, httpx.Client(base_url=proxy_url, timeout=10.0) as proxy:
        yield [api, proxy]
        server_errors = sum(
            s.value
            for f in text_string_to_metric_families(api.get("/metrics").text)
            for s in f.samples
            if s.name == "local_apiserver_requests_total" and s.labels.get("code") == "500"
        )
        assert server_errors == 0


def check(resp: httpx.Response, what: str) -> None:
    """A success, or a 4xx/504 whose body is a Kubernetes Status; never a 500."""
    code = resp.status_code
    assert code < 500 or code == 504, f"{what}: HTTP {code}: {resp.read()[:500]!r}"
    if code >= 400:
        doc = orjson.loads(resp.read())
        assert doc.get("kind") == "Status" and doc.get("code") == code, f"{what}: {doc}"
        assert "Traceback" not in str(doc.get("message"))


# ---- strategies ----------------------------------------------------------------------------------

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
keys = st.sampled_from(["app", "a.b/c", "x", "", "-", "tier", "k" * 70, "é", "a/b/c"])
values = st.sampled_from(["v", "", "1", "-1", "a,b", "(", ")", "x" * 70, "9" * 30])
label_ops = st.sampled_from(["=", "==", "!=", " in ", " notin ", ">", "<", "", "!"])
label_selector = st.one_of(
    text,
    st.lists(
        st.builds(
            lambda k, op, v, paren: (
                f"{'!' if op == '!' else ''}{k}{'' if op in ('!', '') else op}"
                + ("" if op in ("!", "") else (f"({v})" if paren else v))
            ),
            keys,
            label_ops,
            values,
            st.booleans(),
        ),
        max_size=4,
    ).map(",".join),
)
field_paths = st.sampled_from(
    ["metadata.name", "metadata.namespace", "status.phase", "spec.nodeName", "a..b", "", "metadata", "x\\,y"]
)
field_selector = st.one_of(
    text,
    st.lists(
        st.builds(lambda p, op, v: f"{p}{op}{v}", field_paths, st.sampled_from(["=", "==", "!=", "~", ""]), values),
        max_size=3,
    ).map(",".join),
)
hex_numbers = st.one_of(
    st.integers(min_value=0, max_value=2**64).map(lambda n: f"0x{n:x}"),
    st.sampled_from(["0x", "0xg", "1", "-0x1", "0x" + "f" * 20, "0X10"]),
)
shard_paths = st.sampled_from(
    [
        "object.metadata.uid",
        "object.metadata.namespace",
        "object.metadata.ownerReferences.controller.uid",
        "object.spec",
        "",
    ]
)
shard_selector = st.one_of(
    text,
    st.lists(
        st.builds(
            lambda p, a, b, q: f"shardRange({p}, {q}{a}{q}, {q}{b}{q})",
            shard_paths,
            hex_numbers,
            hex_numbers,
            st.sampled_from(["'", '"', ""]),
        ),
        max_size=3,
    ).map("||".join),
)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["", "0", "1", "00", "+1", "1e3", " 1", "1.5", "9" * 40, "NaN"]),
    text,
)
booleans = st.sampled_from(["true", "false", "1", "0", "True", "yes", "", "t", "FALSE"])
query = st.fixed_dictionaries(
    {},
    optional={
        "labelSelector": label_selector,
        "fieldSelector": field_selector,
        "shardSelector": shard_selector,
        "resourceVersion": numbers,
        "resourceVersionMatch": st.sampled_from(["NotOlderThan", "Exact", "", "exact", "Other"]),
        "limit": numbers,
        "continue": st.one_of(text, st.binary(max_size=30).map(lambda b: b.hex()), st.just("eyJydiI6MX0")),
        "timeoutSeconds": numbers,
        "watch": booleans,
        "allowWatchBookmarks": booleans,
        "sendInitialEvents": booleans,
    },
)
collections = st.sampled_from(
    [
        "/api/v1/pods",
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        "/apis/apps/v1/replicasets",
        f"/api/v1/namespaces/{NAMESPACE}/configmaps",
        "/api/v1/namespaces",
    ]
)


def json_values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        text,
    )
    return st.recursive(
        scalars,
        lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(text, children, max_size=4)),
        max_leaves=12,
    )


def deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels, "ownerReferences": []},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
        },
    }


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [{"name": "c"}]}}


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


TEMPLATES = {
    "deployments": ("/apis/apps/v1/namespaces/fuzz/deployments", deployment),
    "pods": ("/api/v1/namespaces/fuzz/pods", pod),
    "configmaps": ("/api/v1/namespaces/fuzz/configmaps", configmap),
}


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> Any:
    """``base`` with the value at a random path replaced by arbitrary JSON."""
    doc = orjson.loads(orjson.dumps(base))
    node: Any = doc
    for _ in range(draw(st.integers(min_value=0, max_value=5))):
        if isinstance(node, dict) and node:
            key = draw(st.sampled_from(sorted(node)))
            if not isinstance(node[key], dict | list) or draw(st.booleans()):
                node[key] = draw(json_values())
                return doc
            node = node[key]
        elif isinstance(node, list) and node:
            node[draw(st.integers(0, len(node) - 1))] = draw(json_values())
            return doc
        else:
            break
    if isinstance(node, dict):
        node[draw(text)] = draw(json_values())
    return doc


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, str, bytes, str]:
    """(method, path, body, content type)."""
    resource = draw(st.sampled_from(sorted(TEMPLATES)))
    path, make = TEMPLATES[resource]
    name = f"f{draw(st.integers(0, 5))}"
    kind = draw(st.sampled_from(["json", "mutated", "bytes"]))
    if kind == "json":
        body = json.dumps(draw(json_values())).encode()
    elif kind == "mutated":
        body = json.dumps(draw(mutated(make(name)))).encode()
    else:
        body = draw(st.binary(max_size=60))
    method = draw(st.sampled_from(["POST", "PUT", "PATCH"]))
    if method == "POST":
        ctype = draw(st.sampled_from(["application/json", "application/yaml", "text/plain"]))
        return method, path, body, ctype
    ctype = (
        draw(
            st.sampled_from(
                [
                    "application/merge-patch+json",
                    "application/json-patch+json",
                    "application/strategic-merge-patch+json",
                    "application/apply-patch+yaml",
                ]
            )
        )
        if method == "PATCH"
        else "application/json"
    )
    sub = draw(st.sampled_from(["", "", "/status", "/scale"])) if resource == "deployments" else ""
    return method, f"{path}/{name}{sub}", body, ctype


# ---- properties ----------------------------------------------------------------------------------


@FUZZ
@given(path=collections, params=query, target=st.integers(0, 1))
def test_list_and_watch_parameters(clients: list[httpx.Client], path: str, params: dict[str, str], target: int) -> None:
    client = clients[target]
    with client.stream("GET", path, params=params) as resp:
        if resp.status_code == 200:
            return  # a list, or a watch stream: closed here
        check(resp, f"GET {path} {params}")


@FUZZ
@given(request=bodies(), target=st.integers(0, 1))
def test_request_bodies(clients: list[httpx.Client], request: tuple[str, str, bytes, str], target: int) -> None:
    method, path, body, ctype = request
    resp = clients[target].request(method, path, content=body, headers={"Content-Type": ctype})
    check(resp, f"{method} {path} {body[:200]!r}")


@FUZZ
@given(
    segments=st.lists(
        st.sampled_from(
            [
                "api",
                "apis",
                "v1",
                "apps",
                "namespaces",
                "fuzz",
                "pods",
                "watch",
                "status",
                "scale",
                "",
                ".",
                "..",
                "%2F",
                "x",
            ]
        ),
        max_size=7,
    ),
    method=st.sampled_from(["GET", "DELETE", "POST", "PUT", "PATCH", "HEAD", "OPTIONS"]),
    target=st.integers(0, 1),
)
def test_paths_and_methods(clients: list[httpx.Client], segments: list[str], method: str, target: int) -> None:
    path = "/" + "/".join(segments).lstrip("/")
    with clients[target].stream(method, path, params={"timeoutSeconds": "1"}) as resp:
        if resp.status_code < 400:
            return
        if method == "HEAD":
            assert resp.status_code < 500
            return
        check(resp, f"{method} {path}")
