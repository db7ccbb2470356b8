"""SIGTERM with watches open: every stream ends at once, exit 0, no traceback in the log.

uvicorn alone would wait out its graceful-shutdown timeout for the open
streams, then cancel them and log each as "Exception in ASGI application";
rangeshard.core.serving ends them first (found by a CI run that restarted
the local API server under a connected proxy).
"""

from __future__ import annotations

import re
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from local_apiserver.process import LocalApiServerProcess
from range_filter_proxy.process import ProxyProcess

# rangeshard.core.logs.LOG_FORMAT: "TIME LEVEL logger [thread] message", uvicorn's own lines included.
_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ \[[^\]]+\] ")
_BAD = ("Traceback", "Exception in ASGI application", "graceful shutdown exceeded", "Cancel ")


def _stop_with_open_watch(proc: Any, url: str, path: str) -> tuple[float, int, str]:
    """Open a watch on ``path``, SIGTERM ``proc`` while it is open; (seconds to exit, exit code, log)."""
    with (
        httpx.Client(base_url=url, timeout=30) as c,
        c.stream("GET", path, params={"watch": "true", "allowWatchBookmarks": "true"}) as resp,
    ):
        assert resp.status_code == 200
        started = time.monotonic()
        proc.proc.send_signal(signal.SIGTERM)
        for _ in resp.iter_lines():  # the stream ends by itself (no read timeout)
            pass
        code = proc.proc.wait(30)
        took = time.monotonic() - started
    proc.proc = None
    return took, code, proc.log_path.read_text()


def test_sigterm_ends_open_watches_cleanly(etcd_server: Any, tmp_path: Path) -> None:
    prefix = f"/shutdown-{uuid.uuid4().hex[:8]}"
    upstream = LocalApiServerProcess(etcd_server.url, prefix=prefix, log_file=tmp_path / "api.log")
    upstream.start(timeout=30)
    proxy = ProxyProcess(upstream.url, resources=["pods"], log_file=tmp_path / "proxy.log")
    try:
        proxy.start(timeout=30)
        # The proxy: one cached watch downstream, its own upstream watch open meanwhile.
        took, code, log = _stop_with_open_watch(proxy, proxy.url, "/api/v1/pods")
        assert code == 0, log
        assert not [b for b in _BAD if b in log], log
        assert took < 4, f"the proxy took {took:.1f}s to stop (its graceful timeout is 5s)"
        # One log format whichever way a server is started (here: python -m range_filter_proxy).
        assert [line for line in log.splitlines() if line and not _LINE.match(line)] == []
        assert "Uvicorn running on" in log
        # The local API server: a watch of its own plus nothing else.
        took, code, log = _stop_with_open_watch(upstream, upstream.url, "/api/v1/namespaces/default/configmaps")
        assert code == 0, log
        assert not [b for b in _BAD if b in log], log
        assert took < 2, f"the API server took {took:.1f}s to stop (its graceful timeout is 2s)"
        assert [line for line in log.splitlines() if line and not _LINE.match(line)] == []
    finally:
        proxy.stop()
        upstream.stop()
