"""rangeshard.core.timestamps: one writer and one reader of Kubernetes RFC 3339 times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from rangeshard.core.timestamps import format_micro_time, format_time, parse_time

T = datetime(2026, 11, 25, 3, 4, 5, 123456, tzinfo=UTC)


def test_format() -> None:
    assert format_time(T) == "2026-11-25T03:04:05Z"
    assert format_micro_time(T) == "2026-11-25T03:04:05.123456Z"
    # Another zone is written as UTC.
    assert format_time(T.astimezone(timezone(timedelta(hours=2)))) == "2026-11-25T03:04:05Z"
    assert format_time().endswith("Z") and parse_time(format_time()) is not None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-25T03:04:05Z", T.replace(microsecond=0)),
        ("2026-11-25T03:04:05.123456Z", T),
        ("2026-11-25T05:04:05+02:00", T.replace(microsecond=0)),  # an offset, read correctly
        ("2026-11-25t03:04:05z", T.replace(microsecond=0)),
    ],
)
def test_parse(text: str, expected: datetime) -> None:
    parsed = parse_time(text)
    assert parsed == expected and parsed is not None and parsed.tzinfo is UTC


@pytest.mark.parametrize(
    "text", [None, "", 5, "yesterday", "2026-11-25", "2026-11-25T03:04:05", "2026-13-25T03:04:05Z"]
)
def test_not_a_timestamp(text: object) -> None:
    assert parse_time(text) is None
