"""A tiny external controller for the liveness tests: serves ``GET /healthz`` (200) until it is wedged.

Usage: ``healthz_child.py PIDS_FILE [PORT]`` (PORT defaults to ``$RANGESHARD_PROBE_PORT``). Once it listens
it appends its pid to PIDS_FILE, one line per start, so a test sees every (re)start; each ``/healthz`` it
answers appends its pid to ``PIDS_FILE.hits``. Any other path is a 404. SIGSTOP wedges it: the port still accepts connections (the kernel's backlog) but nothing answers.
"""

from __future__ import annotations

import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/healthz":
            with open(sys.argv[1] + ".hits", "a") as f:
                f.write(f"{os.getpid()}\n")
        code, body = (200, b"ok") if self.path == "/healthz" else (404, b"no such path")
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    pids = sys.argv[1]
    port = int(sys.argv[2]) if len(sys.argv) > 2 else int(os.environ["RANGESHARD_PROBE_PORT"])
    server = HTTPServer(("127.0.0.1", port), Handler)
    with open(pids, "a") as f:
        f.write(f"{os.getpid()}\n")
    print(f"healthz child {os.getpid()} serving on {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
