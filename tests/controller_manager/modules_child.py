"""Run ``rangeshard controller-manager`` in this process and report which modules it loaded.

Usage: ``modules_child.py CONFIG METRICS_PORT OUT [WAIT]``. The manager runs as the CLI runs it; a
thread waits until ``/readyz`` answers 200 (at most WAIT seconds, default 20), then writes ``{"ready": bool,
"modules": [...]}`` to OUT and sends this process SIGTERM (a graceful stop).
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import threading
import time
import urllib.request


def report(port: str, out: str, wait: float) -> None:
    deadline = time.monotonic() + wait
    ready = False
    while not ready and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
                ready = resp.status == 200
        except OSError:
            time.sleep(0.05)
    with open(out, "w") as f:
        json.dump({"ready": ready, "modules": sorted(sys.modules)}, f)
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    config, port, out = sys.argv[1:4]
    wait = float(sys.argv[4]) if len(sys.argv) > 4 else 20.0
    threading.Thread(target=report, args=(port, out, wait), daemon=True).start()
    sys.argv = ["rangeshard", "controller-manager", "--config", config]
    runpy.run_module("rangeshard.cli.main", run_name="__main__")


if __name__ == "__main__":
    main()
