"""rangeshard.testing helpers that need no cluster: the audit overlap assertion and wait_until."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from controller_manager.audit import AuditLog
from rangeshard.core.ownertoken import OwnerToken
from rangeshard.testing import TestKitError, _import, assert_no_overlap, assert_no_stale_writes, overlaps, wait_until


def write(path: Path, instance: str, spans: list[tuple[str, float, float]]) -> Path:
    with AuditLog(path) as log:
        for key, start, end in spans:
            log.record("widget", instance, key, start, end)
    return path


def test_assert_no_overlap_counts_records_and_names_overlaps(tmp_path: Path) -> None:
    a = write(tmp_path / "a.jsonl", "m1-widget", [("ns/w1", 1.0, 2.0), ("ns/w2", 1.0, 2.0)])
    b = write(tmp_path / "b.jsonl", "m2-widget", [("ns/w1", 2.5, 3.0)])
    assert assert_no_overlap([a, b, tmp_path / "missing.jsonl"]) == 3
    c = write(tmp_path / "c.jsonl", "m3-widget", [("ns/w2", 1.5, 1.7)])
    assert len(overlaps([a, b, c])) == 1
    with pytest.raises(AssertionError, match=r"(?s)1 overlapping reconcile\(s\).*ns/w2: m1-widget"):
        assert_no_overlap([a, b, c])


def test_wait_until_returns_the_value_or_fails_with_the_message() -> None:
    calls = iter([0, 0, 7])
    assert wait_until(lambda: next(calls), 5, "seven") == 7
    with pytest.raises(AssertionError, match=r"timed out after 0\.1s waiting for nothing"):
        wait_until(lambda: False, 0.1, "nothing")


def _event(token: OwnerToken, uid: str, n: int, code: int = 200) -> dict[str, object]:
    return {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "auditID": f"a{n}",
        "verb": "update",
        "userAgent": token.user_agent(),
        "objectRef": {"resource": "widgets", "namespace": "ns", "name": f"w-{uid}", "uid": uid},
        "responseStatus": {"code": code},
        "stageTimestamp": f"2026-11-24T00:00:{n:02d}.000000Z",
    }


def test_assert_no_stale_writes_reads_the_apiserver_audit_log(tmp_path: Path) -> None:
    a = OwnerToken("widget", "m1-widget", 0x10, 1)
    b = OwnerToken("widget", "m2-widget", 0x20, 1)
    other = OwnerToken("gadget", "m3-gadget", 0x30, 1)
    log = tmp_path / "audit.jsonl"
    fine = [_event(a, "u1", 1), _event(b, "u1", 2), _event(b, "u1", 3), _event(other, "u2", 4)]
    log.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in fine) + b'{"partial')
    assert assert_no_stale_writes(log) == 4
    # a wrote u1 again after b had: a stale owner. A failed write (409) changed nothing and does not count.
    stale = [*fine, _event(a, "u1", 5, code=409), _event(a, "u1", 6)]
    log.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in stale))
    with pytest.raises(AssertionError, match=r"(?s)1 stale-owner write\(s\).*STALE OWNER widget shard key u1"):
        assert_no_stale_writes(log)
    assert assert_no_stale_writes(log, "gadget") == 1  # limited to one controller type


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("json:loads", "is not a Controller subclass"),
        ("json:no_such_thing", "has no attribute 'no_such_thing'"),
        ("no_such_module_rs:Thing", "cannot import module 'no_such_module_rs'"),
        ("not a target", "must be 'module:Class'"),
    ],
)
def test_a_controller_named_by_module_and_class_is_resolved_as_a_managers_config_resolves_it(
    target: str, problem: str
) -> None:
    with pytest.raises(TestKitError, match=problem):
        _import(target)
    assert _import("controller_manager.controllers.replicaset:ReplicaSetController").name == "replicaset"
