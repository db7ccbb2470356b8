"""The one writer of watch-stream lines and the one kubeconfig builder (rangeshard.core.kubeapi)."""

from __future__ import annotations

import orjson

from rangeshard.core.kubeapi import event_line, kubeconfig, watch_line_prefix


def test_an_object_and_its_json_bytes_give_kube_apiservers_line() -> None:
    obj = {"kind": "Pod", "metadata": {"name": "p", "resourceVersion": "7"}, "x": [1, "ü"]}
    expected = orjson.dumps({"type": "MODIFIED", "object": obj}) + b"\n"
    assert event_line("MODIFIED", obj) == expected
    assert event_line("MODIFIED", orjson.dumps(obj)) == expected
    assert event_line("MODIFIED", memoryview(orjson.dumps(obj))) == expected


def test_every_type_has_its_prefix() -> None:
    for etype in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"):
        assert event_line(etype, b"{}").startswith(watch_line_prefix(etype))
        assert orjson.loads(event_line(etype, b"{}")) == {"type": etype, "object": {}}


def test_the_one_kubeconfig_builder() -> None:
    """What the local cluster writes, and (with skip_tls_verify) what the external endpoint hands its child."""
    doc = kubeconfig("http://127.0.0.1:8080", "test")
    assert doc["clusters"] == [{"name": "test", "cluster": {"server": "http://127.0.0.1:8080"}}]
    assert doc["contexts"] == [{"name": "test", "context": {"cluster": "test", "user": "test"}}]
    assert doc["current-context"] == "test" and doc["users"] == [{"name": "test", "user": {}}]
    js = kubeconfig("http://127.0.0.1:9", skip_tls_verify=True)
    assert js["clusters"][0] == {
        "name": "rangeshard",
        "cluster": {"server": "http://127.0.0.1:9", "insecure-skip-tls-verify": True},
    }
