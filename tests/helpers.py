"""Small test utilities shared by the suites (polling with a deadline, never bare sleeps; the CLI as a child;
missing prerequisites that fail under the README test command)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn, TypeVar

import pytest

from rangeshard.core.process import popen

T = TypeVar("T")

REQUIRE_ALL = "RANGESHARD_REQUIRE_ALL"
"""Set to ``1`` by ``scripts/test.sh`` (the README test command): a missing prerequisite fails, never skips."""


def missing_prerequisite(what: str, *, module_level: bool = False) -> NoReturn:
    """A tool or package the test needs is missing: skip, or fail under ``RANGESHARD_REQUIRE_ALL=1``."""
    if os.environ.get(REQUIRE_ALL) == "1":
        pytest.fail(f"{what} ({REQUIRE_ALL}=1: the full suite needs it)", pytrace=False)
    pytest.skip(what, allow_module_level=module_level)


def wait_until(
    predicate: Callable[[], T], timeout: float = 10.0, message: str = "condition", interval: float = 0.02
) -> T:
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T = predicate()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message} (last value: {last!r})")
        time.sleep(interval)
        last = predicate()
    return last


def run_cli(
    args: Sequence[str], log: Path, *, new_session: bool = False, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``python -m rangeshard.cli.main ARGS`` with stdout and stderr appended to ``log``.

    ``new_session`` puts it in its own process group (so a test can signal
    the group); ``env`` entries are added to this process's environment. It
    dies with this process (:func:`rangeshard.core.process.popen`).
    """
    with open(log, "ab") as logf:
        return popen(
            [sys.executable, "-m", "rangeshard.cli.main", *args],
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=new_session,
            env={**os.environ, **env} if env else None,
        )
