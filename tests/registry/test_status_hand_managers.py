"""``rangeshard status`` lists managers started by hand with ``--state-dir`` (``DIR/managers/*.json``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rangeshard.core.process import process_start_time


def _status(state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rangeshard.cli.main", "status", "--state-dir", str(state), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_manager_added_by_hand_is_listed_and_a_dead_one_fails_the_status(tmp_path: Path) -> None:
    managers = tmp_path / "managers"
    managers.mkdir()
    me = os.getpid()
    alive = {"name": "manager x (by hand)", "kind": "manager", "pid": me, "startTime": process_start_time(me)}
    (managers / "x.json").write_text(json.dumps({**alive, "port": None, "url": None, "healthUrl": None}))
    ok = _status(tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    doc = json.loads(ok.stdout)
    assert [(c["name"], c["healthy"]) for c in doc["components"]] == [("manager x (by hand)", True)]
    dead = {**alive, "name": "manager y (by hand)", "startTime": 1}  # that pid, another process: not it
    (managers / "y.json").write_text(json.dumps({**dead, "port": None, "url": None, "healthUrl": None}))
    (managers / "garbage.json").write_text("{not json")
    down = _status(tmp_path)
    assert down.returncode == 1, down.stdout + down.stderr
    rows = {c["name"]: (c["healthy"], c["detail"]) for c in json.loads(down.stdout)["components"]}
    assert rows == {"manager x (by hand)": (True, "no health endpoint"), "manager y (by hand)": (False, "not running")}
