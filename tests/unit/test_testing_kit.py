"""rangeshard.testing helpers that need no cluster: the audit overlap assertion and wait_until."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller_manager.audit import AuditLog
from rangeshard.testing import assert_no_overlap, overlaps, wait_until


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
