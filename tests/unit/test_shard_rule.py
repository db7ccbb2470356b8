"""The one shard rule (``hashing.ShardBy``): its key, its selector and every reader of it agree."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller_manager.config import ExternalSection
from hashing import (
    MAX_HASH,
    NAMESPACE_PATH,
    OWNER_PATH,
    PATHS,
    ROOT_PATH,
    UID_PATH,
    HashRange,
    ObjectHashes,
    ShardBy,
    hash_key,
    label_of_path,
    label_path,
    parse_shard_selector,
    range_to_selector,
)


def _obj(uid: str | None = None, namespace: str | None = None, owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if uid is not None:
        meta["uid"] = uid
    if namespace is not None:
        meta["namespace"] = namespace
    if owner is not None:
        meta["ownerReferences"] = [{"kind": "X", "name": "x", "uid": owner, "controller": True}]
    return {"metadata": meta}


def test_rules_paths_and_names() -> None:
    fixed = [r for r in ShardBy if r is not ShardBy.LABEL]
    assert {r.value: r.path for r in fixed} == {
        "uid": UID_PATH,
        "owner": OWNER_PATH,
        "namespace": NAMESPACE_PATH,
        "root": ROOT_PATH,
    }
    assert {r.path for r in fixed} == set(PATHS)
    for rule in ShardBy:
        path = rule.path_for(label="tenant")
        assert ShardBy.of_path(path) is rule
        assert ShardBy.parse(rule.value) is rule
        assert ShardBy.parse(f" {rule.value} ") is rule
    with pytest.raises(ValueError, match=r"unknown shard rule 'name'; one of: uid, owner, namespace, root, label"):
        ShardBy.parse("name")
    with pytest.raises(ValueError, match="unsupported path"):
        ShardBy.of_path("object.metadata.name")
    with pytest.raises(ValueError, match="label_path"):
        _ = ShardBy.LABEL.path
    assert [r for r in ShardBy if r.matches_absent] == [ShardBy.OWNER]


def test_key_of_each_rule() -> None:
    owned = _obj("pod-1", "ns-a", "rs-1")
    assert ShardBy.UID.key(owned) == hash_key("pod-1")  # by uid: an owned object by its OWN uid
    assert ShardBy.OWNER.key(owned) == hash_key("rs-1")
    assert ShardBy.NAMESPACE.key(owned) == hash_key("ns-a")
    orphan = _obj("pod-2")
    assert ShardBy.OWNER.key(orphan) is None  # no controller owner: every range sees it
    assert ShardBy.NAMESPACE.key(orphan) is None  # cluster-scoped: no range
    assert ShardBy.NAMESPACE.key(orphan, "from-url") == hash_key("from-url")  # a body's namespace from its URL
    assert ShardBy.NAMESPACE.key(owned, "from-url") == hash_key("ns-a")  # the body's own wins
    assert ShardBy.UID.key({"metadata": {"generateName": "x-"}}) is None  # a create: not known yet
    assert ShardBy.UID.key({}) is None and ShardBy.UID.key({"metadata": "garbage"}) is None
    not_controller = {"metadata": {"uid": "p", "ownerReferences": [{"uid": "o", "controller": False}]}}
    assert ShardBy.OWNER.key(not_controller) is None


_UIDS = st.one_of(st.none(), st.text(min_size=1, max_size=12))


@given(
    uid=_UIDS,
    namespace=_UIDS,
    owner=_UIDS,
    bounds=st.tuples(st.integers(0, MAX_HASH), st.integers(0, MAX_HASH)),
    rule=st.sampled_from(list(ShardBy)),
    tenant=_UIDS,
)
def test_the_key_lies_in_a_range_exactly_when_the_selector_of_that_range_matches(
    uid: str | None,
    namespace: str | None,
    owner: str | None,
    bounds: tuple[int, int],
    rule: ShardBy,
    tenant: str | None,
) -> None:
    """What the fence checks (the key in the range) is what the informers and the endpoint read (the selector)."""
    rng = HashRange(min(bounds), max(bounds))
    obj = _obj(uid, namespace, owner)
    if tenant is not None:
        obj["metadata"]["labels"] = {"example.com/tenant": tenant, "other": "x"}
    label = "example.com/tenant" if rule is ShardBy.LABEL else None
    selector = parse_shard_selector(range_to_selector(rng, rule.path_for(label="example.com/tenant")))
    key = rule.key(obj, label=label)
    matched = selector.matches(obj)
    assert matched == (rule.matches_absent if key is None else rng.contains(key))
    assert selector.predicate()(ObjectHashes.of(obj)) == matched
    term = selector.terms[0]
    assert rule.in_range(ObjectHashes.of(obj), term.start, term.end, label) == matched


def test_by_label_places_by_the_value_else_by_the_uid() -> None:
    """``{by: label, label: KEY}``: FNV of the label's value; an object without the label by its own uid."""
    labelled = {"metadata": {"uid": "u-1", "labels": {"tekton.dev/pipelineRun": "run-7"}}}
    other = {"metadata": {"uid": "u-2", "labels": {"tekton.dev/pipelineRun": "run-7", "x": "y"}}}
    bare = {"metadata": {"uid": "u-3"}}
    key = "tekton.dev/pipelineRun"
    assert ShardBy.LABEL.key(labelled, label=key) == hash_key("run-7") == ShardBy.LABEL.key(other, label=key)
    assert ShardBy.LABEL.key(bare, label=key) == hash_key("u-3")
    assert ShardBy.LABEL.key({"metadata": {"labels": {}}}, label=key) is None  # a create: no uid yet
    path = label_path(key)
    assert path == "object.metadata.labels(tekton.dev/pipelineRun)"
    assert ShardBy.of_path(path) is ShardBy.LABEL and label_of_path(path) == key
    sel = parse_shard_selector(range_to_selector(HashRange(hash_key("run-7"), hash_key("run-7")), path))
    assert sel.matches(labelled) and sel.matches(other) and not sel.matches(bare)
    assert str(sel) == range_to_selector(HashRange(hash_key("run-7"), hash_key("run-7")), path)
    with pytest.raises(ValueError, match="needs a label key"):
        ShardBy.LABEL.key(labelled)
    for bad in ("", "-x", "a/b/c", "UPPER.example.com/x", "x" * 64):
        with pytest.raises(ValueError, match="is not a label key"):
            label_path(bad)


def test_config_reads_rules_and_resource_names_as_the_proxy_does() -> None:
    section = ExternalSection.model_validate(
        {
            "shard": [
                {"resource": "deployments.v1.apps", "by": "uid"},
                {"resource": "pods", "by": "owner"},
                {"resource": "gadgets.v1beta1.bars.example.org", "by": "namespace"},
            ]
        }
    )
    assert [(s.resource, s.rule) for s in section.shard] == [
        ("deployments.apps", ShardBy.UID),
        ("pods", ShardBy.OWNER),
        ("gadgets.bars.example.org", ShardBy.NAMESPACE),
    ]
    with pytest.raises(ValueError, match="listed twice"):
        ExternalSection.model_validate(
            {"shard": [{"resource": "deployments.apps"}, {"resource": "deployments.v1.apps", "by": "owner"}]}
        )
    with pytest.raises(ValueError, match="uid"):
        ExternalSection.model_validate({"shard": [{"resource": "pods", "by": "name"}]})
    with pytest.raises(ValueError, match="label: required with by: label"):
        ExternalSection.model_validate({"shard": [{"resource": "pods", "by": "label"}]})
    with pytest.raises(ValueError, match="label: only for by: label"):
        ExternalSection.model_validate({"shard": [{"resource": "pods", "by": "uid", "label": "tenant"}]})
    with pytest.raises(ValueError, match="is not a label key"):
        ExternalSection.model_validate({"shard": [{"resource": "pods", "by": "label", "label": "a b"}]})
    labelled = ExternalSection.model_validate(
        {"shard": [{"resource": "taskruns.tekton.dev", "by": "label", "label": "tekton.dev/pipelineRun"}]}
    )
    assert labelled.shard[0].path == "object.metadata.labels(tekton.dev/pipelineRun)"
    main = labelled.published_main()
    assert main.by is ShardBy.LABEL and main.label_key == "tekton.dev/pipelineRun"
