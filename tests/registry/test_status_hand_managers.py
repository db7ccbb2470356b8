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


def test_a_slow_health_endpoint_is_not_down(tmp_path: Path) -> None:
    """On a loaded machine a manager's /readyz may take seconds: status waits for it (it gave up after 1-2 s)."""
    import threading  # noqa: PLC0415
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: PLC0415

    answer = threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answer.wait(2.5)  # the machine is busy: the answer comes after 2.5 s
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        managers = tmp_path / "managers"
        managers.mkdir()
        me = os.getpid()
        record = {"name": "manager s (by hand)", "kind": "manager", "pid": me, "startTime": process_start_time(me)}
        (managers / "s.json").write_text(json.dumps({**record, "port": 1, "url": url, "healthUrl": url + "/readyz"}))
        status = _status(tmp_path)
        assert status.returncode == 0, status.stdout + status.stderr
        assert json.loads(status.stdout)["components"][0]["healthy"] is True
    finally:
        server.shutdown()
        server.server_close()
