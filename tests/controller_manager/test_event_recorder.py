"""The built-in controllers' event recorder posts its events over kept-alive connections.

It asks the official client for the raw answer (no model decoding), which
leaves the connection checked out of the pool until the answer is read: an
answer never read cost a new TCP connection per event. A real loopback
HTTP/1.1 server counts the connections.
"""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration

from controller_manager.controllers.events import EventRecorder
from tests.helpers import wait_until


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections: set[int] = set()
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.connections.add(self.client_address[1])  # the client port: one per TCP connection
            self.server.events.append(body)
        data = json.dumps({**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    threading.Thread(target=s.serve_forever, name="fake-apiserver", daemon=True).start()
    yield s
    s.shutdown()
    s.server_close()


def test_events_are_posted_over_one_kept_alive_connection(server: _Server) -> None:
    client = ApiClient(Configuration(host=f"http://127.0.0.1:{server.server_address[1]}"))
    recorder = EventRecorder(client, "deployment-controller")
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "r", "namespace": "ns", "uid": "u"}}
    for i in range(10):
        recorder.event(rs, "SuccessfulCreate", f"Created pod: p{i}")
    wait_until(lambda: len(server.events) == 10, 10, "ten events posted")
    assert [e["message"] for e in server.events] == [f"Created pod: p{i}" for i in range(10)]
    assert len(server.connections) == 1  # one at a time from one thread: the connection is given back each time
    client.close()
