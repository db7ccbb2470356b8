"""Pure parts: label/field selectors, merge and JSON patches, continue tokens."""

from __future__ import annotations

from typing import Any

import pytest

from local_apiserver.codec import decode_continue, encode_continue
from local_apiserver.errors import ApiError
from local_apiserver.patch import json_patch, merge_patch
from local_apiserver.strategic import strategic_merge
from rangeshard.core.selectors import parse_field_selector, parse_label_selector


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("", {}, True),
        ("a=b", {"a": "b"}, True),
        ("a==b", {"a": "c"}, False),
        ("a!=b", {}, True),
        ("a in (b, c)", {"a": "c"}, True),
        ("a notin (b,c)", {"a": "c"}, False),
        ("a notin (b,c)", {}, True),
        ("a", {"a": ""}, True),
        ("!a", {"a": ""}, False),
        ("a,b=c", {"a": "x", "b": "c"}, True),
        ("n>3", {"n": "4"}, True),
        ("n<3", {"n": "4"}, False),
        ("app.kubernetes.io/name=web", {"app.kubernetes.io/name": "web"}, True),
        ("a=", {"a": ""}, True),
    ],
)
def test_label_selector(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_label_selector(selector).matches(labels) is expected


@pytest.mark.parametrize("selector", ["a in b", "a in ()", "=b", "a=b c", "a,", "in (x)x", "-a=b", "a=b=c"])
def test_label_selector_errors(selector: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_label_selector(selector)
    assert info.value.code == 400


def test_field_selector() -> None:
    sel = parse_field_selector("metadata.name=a,metadata.namespace!=b", ("metadata.name", "metadata.namespace"), "Pod")
    assert sel.matches({"metadata": {"name": "a", "namespace": "c"}})
    assert not sel.matches({"metadata": {"name": "a", "namespace": "b"}})
    assert sel.value_of("metadata.name") == "a"
    with pytest.raises(ApiError):
        parse_field_selector("spec.x=1", ("metadata.name",), "Pod")


def test_merge_patch_rfc7386() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}
    assert merge_patch(target, {"a": "z", "c": {"f": None}, "l": [3]}) == {"a": "z", "c": {"d": "e"}, "l": [3]}
    assert target["c"] == {"d": "e", "f": "g"}  # input untouched


def test_json_patch_rfc6902() -> None:
    doc = {"a": {"b": [1, 2]}, "x": 1}
    ops = [
        {"op": "add", "path": "/a/b/-", "value": 3},
        {"op": "add", "path": "/a/b/0", "value": 0},
        {"op": "remove", "path": "/x"},
        {"op": "copy", "from": "/a/b", "path": "/c"},
        {"op": "move", "from": "/c", "path": "/d"},
        {"op": "replace", "path": "/a/b/1", "value": 9},
        {"op": "test", "path": "/d/3", "value": 3},
        {"op": "add", "path": "/e~1f", "value": True},
    ]
    assert json_patch(doc, ops) == {"a": {"b": [0, 9, 2, 3]}, "d": [0, 1, 2, 3], "e/f": True}
    assert doc == {"a": {"b": [1, 2]}, "x": 1}


POD: dict[str, Any] = {
    "metadata": {"name": "p", "finalizers": ["a"], "labels": {"x": "1"}},
    "spec": {
        "containers": [
            {"name": "app", "image": "v1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
            {"name": "side", "image": "s1"},
        ],
        "tolerations": [{"key": "k1"}],
    },
}


def test_strategic_merge_merges_keyed_lists() -> None:
    patch = {
        "metadata": {"finalizers": ["b"], "labels": {"x": None}},
        "spec": {
            "containers": [{"name": "app", "image": "v2", "env": [{"name": "B", "value": "3"}]}],
            "tolerations": [{"key": "k2"}],  # no patch strategy: replaced
        },
    }
    out = strategic_merge(POD, patch, "pods")
    assert out["metadata"] == {"name": "p", "finalizers": ["a", "b"], "labels": {}}
    app, side = out["spec"]["containers"]
    assert app == {"name": "app", "image": "v2", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}]}
    assert side == {"name": "side", "image": "s1"}
    assert out["spec"]["tolerations"] == [{"key": "k2"}]
    assert POD["spec"]["containers"][0]["image"] == "v1"  # input untouched


def test_strategic_merge_directives() -> None:
    patch = {
        "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]},
        "spec": {
            "$setElementOrder/containers": [{"name": "side"}, {"name": "app"}],
            "containers": [{"name": "new", "image": "n"}, {"name": "app", "$patch": "delete"}],
        },
    }
    out = strategic_merge(POD, patch, "pods")
    assert out["metadata"]["finalizers"] == []
    assert [c["name"] for c in out["spec"]["containers"]] == ["side", "new"]
    replaced = strategic_merge(POD, {"spec": {"containers": [{"$patch": "replace"}, {"name": "only"}]}}, "pods")
    assert replaced["spec"]["containers"] == [{"name": "only"}]
    retained = strategic_merge({"spec": {"a": 1, "b": 2}}, {"spec": {"$retainKeys": ["b"], "b": 3}}, "deployments")
    assert retained == {"spec": {"b": 3}}
    gone = strategic_merge(POD, {"spec": {"$patch": "delete"}}, "pods")
    assert "spec" not in gone


@pytest.mark.parametrize(
    ("patch", "code"),
    [
        ({"$whatever": 1}, 415),
        ({"spec": {"$patch": "merge-please"}}, 415),
        ({"spec": {"containers": [{"image": "no-name"}]}}, 422),
        ({"metadata": {"finalizers": [{"a": 1}]}}, 422),
        ({"$patch": "delete"}, 422),
    ],
)
def test_strategic_merge_refuses_what_it_cannot_apply(patch: dict[str, object], code: int) -> None:
    with pytest.raises(ApiError) as info:
        strategic_merge(POD, patch, "pods")
    assert info.value.code == code


def test_continue_token_round_trip() -> None:
    assert decode_continue(encode_continue(42, "ns/name\0")) == (42, "ns/name\0")
    for bad in ("", "!!!", encode_continue(42, "x")[:-3]):
        with pytest.raises(ApiError):
            decode_continue(bad)
