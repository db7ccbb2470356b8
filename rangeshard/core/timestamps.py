"""Kubernetes timestamps: RFC 3339 ``Time`` and ``MicroTime``, written and read in one place.

Purpose
    ``metav1.Time`` is UTC with second precision (``2026-11-25T03:04:05Z``);
    ``metav1.MicroTime`` adds microseconds (``...05.123456Z``, Events, audit
    logs, Leases). Everything of ours that stamps or reads such a value uses
    :func:`format_time`, :func:`format_micro_time` and :func:`parse_time`.

Invariants
    * Written values are always UTC with a ``Z``.
    * :func:`parse_time` accepts what kube-apiserver accepts (``Z`` or an
      offset, optional fractional seconds) and returns an aware UTC
      ``datetime``, or ``None`` for anything else (never raises).

Concurrency model
    Pure functions.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def format_time(t: datetime | None = None) -> str:
    """``t`` (default: now) as a ``metav1.Time``: ``YYYY-MM-DDTHH:MM:SSZ``."""
    return (t or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(t: datetime | None = None) -> str:
    """``t`` (default: now) as a ``metav1.MicroTime``: ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""
    return (t or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp as an aware UTC ``datetime``; ``None`` if it is not one."""
    if not isinstance(value, str) or len(value) < 20 or value[10] not in "Tt":
        return None
    text = value[:-1] + "+00:00" if value[-1] in "Zz" else value
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return parsed.astimezone(UTC)
