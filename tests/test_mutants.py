"""Mutation checks in CI: the handover mutants issue 18 names and the write-fence mutants of issue 30 are killed.

``scripts/mutants.py --key`` copies the tree, applies each mutant (giver
unlocks without draining; no fencing-deadline check in ``try_begin``; no lease
margin; deadline from the keepalive reply instead of its send time) and runs
the fastest tests that should kill it. The full list (``scripts/mutants.py``
without ``--key``) takes a few minutes and is documented in docs/testing.md.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_mutants(*args: str) -> str:
    """``scripts/mutants.py ARGS``: its output, after asserting it exited 0."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "mutants.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    return out


@pytest.mark.slow
def test_the_four_key_handover_mutants_are_killed() -> None:
    out = run_mutants("--key")
    for mutant in ("drain-skipped", "no-fencing-check", "no-margin-renew", "reply-time-renew"):
        assert f"{mutant}: killed" in out, out
    assert "4 mutants: 4 killed, 0 survived" in out, out


@pytest.mark.slow
def test_the_write_fence_mutants_are_killed_within_seconds() -> None:
    """Issues 30 and 36: the three fence mutants, the stale batched read, the cache-first shard hash, the guessed rule."""
    out = run_mutants("--fencing", "--timeout", "60")
    for mutant in (
        "fence-epoch-off-by-one",
        "fence-no-locked",
        "fence-no-range",
        "batched-read-joins-running",
        "shard-hash-cache-first",
        "fence-ignores-declared-rule",
    ):
        found = re.search(rf"^{mutant}: killed \(([0-9.]+)s\)", out, re.MULTILINE)
        assert found, out
        assert float(found.group(1)) < 60, f"{mutant} was only killed by the timeout:\n{out}"
    assert "6 mutants: 6 killed, 0 survived" in out, out
