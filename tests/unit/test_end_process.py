"""``end_process``: the exit code is kept and every buffered line is written, without finalization."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import atexit, logging, sys
from rangeshard.core.process import end_process
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s")
atexit.register(lambda: print("finalized", flush=True))  # must not run: no interpreter finalization
sys.stdout.write("buffered stdout line\\n")  # no flush: end_process flushes it
logging.getLogger("x").info("last log line")
end_process(int(sys.argv[1]))
"""


def test_end_process_keeps_the_code_and_flushes_without_finalizing() -> None:
    for code in (0, 1, 3):
        done = subprocess.run([sys.executable, "-c", CHILD, str(code)], capture_output=True, text=True, timeout=60)
        assert done.returncode == code, done.stderr
        assert done.stdout == "buffered stdout line\n"
        assert "INFO last log line" in done.stderr
        assert "finalized" not in done.stdout
