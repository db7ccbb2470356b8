"""A client that dies mid-request is an expected event: a DEBUG line and a counter, never a traceback.

Both HTTP servers (the proxy, forwarding a write; the local API server,
reading the body itself) are sent a request whose body is cut short by a
closed socket, as a SIGKILLed manager's write would be.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path
from typing import Any

import httpx

from range_filter_proxy.process import ProxyProcess
from tests.helpers import wait_until


def _cut_short(url: str, path: str) -> None:
    """POST ``path`` announcing 4096 body bytes, send 20, then close the socket."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n"
        sock.sendall(head.encode() + b'{"apiVersion": "v1",')
        time.sleep(0.2)  # let the server start reading the body before the socket goes away


def _counter(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    m = re.search(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _wait_counter(url: str, name: str, at_least: float) -> None:
    wait_until(lambda: _counter(url, name) >= at_least, 10, f"{name} >= {at_least}")


def test_proxy_and_apiserver_count_client_disconnects_without_traceback(
    local_apiserver: Any, proxy: ProxyProcess
) -> None:
    api_name = "local_apiserver_client_disconnects_total"
    proxy_name = "range_filter_proxy_client_disconnects_total"
    api_before = _counter(local_apiserver.url, api_name)
    proxy_before = _counter(proxy.url, proxy_name)
    for _ in range(3):
        _cut_short(proxy.url, "/api/v1/namespaces/default/configmaps")
        _cut_short(local_apiserver.url, "/api/v1/namespaces/default/configmaps")
    _wait_counter(proxy.url, proxy_name, proxy_before + 3)
    _wait_counter(local_apiserver.url, api_name, api_before + 3)
    # Both still serve.
    assert httpx.get(proxy.url + "/api/v1/namespaces", timeout=5).status_code == 200
    assert httpx.get(local_apiserver.url + "/api/v1/namespaces", timeout=5).status_code == 200
    for log in (Path(proxy.log_path), Path(local_apiserver.log_path)):
        text = log.read_text()
        assert "Traceback" not in text, f"{log}:\n{text[-3000:]}"
        assert "ClientDisconnect" not in text
