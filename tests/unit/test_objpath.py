"""The one walker of dotted paths (rangeshard.core.objpath), used by selectors, field labels, tables and conversion."""

from __future__ import annotations

from typing import Any

from rangeshard.core.objpath import dig, get_path, set_path


def test_reading_never_raises() -> None:
    obj = {"spec": {"template": {"spec": {"nodeName": "n1"}}, "replicas": 3, "list": [1]}}
    assert get_path(obj, "spec.template.spec.nodeName") == "n1"
    assert get_path(obj, ".spec.replicas") == get_path(obj, " spec..replicas ") == 3  # a CRD's scale path form
    assert get_path(obj, "spec.replicas.x") is None  # through a non-object
    assert get_path(obj, "spec.list.0") is None
    assert get_path(obj, "status.phase") is None
    assert get_path(None, "a") is None
    assert dig(obj, ("spec", "replicas")) == 3
    assert dig({"metadata": {"annotations": {"a.b/c": "x"}}}, ("metadata", "annotations", "a.b/c")) == "x"


def test_writing_creates_parents() -> None:
    obj: dict[str, Any] = {"spec": "not an object"}
    set_path(obj, ".spec.replicas", 2)
    set_path(obj, "status.selector", "a=b")
    assert obj == {"spec": {"replicas": 2}, "status": {"selector": "a=b"}}
