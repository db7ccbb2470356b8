"""An informer's lists are "not older than" what is known of the resource, never a consistent read (issue 46).

A real loopback HTTP server stands in for the proxy and records each list's
query: the first list asks for any version (``0``, as client-go's first list);
a relist after a range change asks ``resourceVersion=<floor>&resourceVersionMatch=NotOlderThan``
with the floor the highest of the informer's own last version and what the
instance and its peers published of their writes (``floor_source``), which
the proxy serves from its cache; a list at a floor the proxy's cache does not
reach in time (``504``) is followed by one consistent read.
"""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes.client import ApiClient, Configuration

from controller_manager.informer import Informer
from controller_manager.resources import REPLICASETS
from hashing import MAX_HASH, UID_PATH, HashRange
from tests.helpers import wait_until


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lists: list[dict[str, list[str]]] = []
        #: Answer the next list "not older than" with 504 (the cache did not get there in time).
        self.too_large = False
        self.closing = threading.Event()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        if "watch" not in query:
            self.server.lists.append(query)
            if self.server.too_large and query.get("resourceVersionMatch") == ["NotOlderThan"]:
                self.server.too_large = False
                status = {"kind": "Status", "code": 504, "reason": "Timeout", "message": "Too large resource version"}
                self._send(504, status)
                return
            self._send(200, {"items": [], "metadata": {"resourceVersion": str(100 * len(self.server.lists))}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        obj = {"metadata": {"name": "w", "namespace": "ns", "uid": "w", "resourceVersion": "150"}}
        data = (json.dumps({"type": "ADDED", "object": obj}) + "\n").encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
        self.server.closing.wait(30)
        self.close_connection = True


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    threading.Thread(target=srv.serve_forever, name="fake-proxy", daemon=True).start()
    yield srv
    srv.closing.set()
    srv.shutdown()
    srv.server_close()


def _rv(query: dict[str, list[str]]) -> tuple[str | None, str | None]:
    return (query.get("resourceVersion") or [None])[0], (query.get("resourceVersionMatch") or [None])[0]


def test_relists_are_not_older_than_the_informers_own_view_and_the_givers_writes(server: _Server) -> None:
    floors = {"replicasets.apps": 0}
    client = ApiClient(Configuration(host=f"http://127.0.0.1:{server.server_address[1]}"))
    informer = Informer(
        client,
        REPLICASETS,
        path=UID_PATH,
        range_source=lambda: (1, HashRange(0, MAX_HASH)),
        on_event=lambda kind, o: None,
        name="floors",
        request_timeout=20.0,
        floor_source=lambda: floors[REPLICASETS.gvr.label],
    )
    informer.start()
    try:
        wait_until(lambda: informer.get("ns/w") is not None, 10, "the watch's event applied")
        assert _rv(server.lists[0]) == ("0", None), "nothing known yet: any version, from the cache"

        informer.reset()  # a range change: not older than what the informer saw
        wait_until(lambda: len(server.lists) == 2, 10, "a relist")
        assert _rv(server.lists[1]) == ("150", "NotOlderThan"), "the watch's last event"

        floors[REPLICASETS.gvr.label] = 420  # a giver published its last write of the resource
        informer.reset()
        wait_until(lambda: len(server.lists) == 3, 10, "a relist")
        assert _rv(server.lists[2]) == ("420", "NotOlderThan")

        server.too_large = True  # the proxy's cache does not reach the floor in time: one consistent read
        informer.reset()
        wait_until(lambda: len(server.lists) == 5 and informer.last_error is None, 10, "a relist after the 504")
        assert _rv(server.lists[3]) == ("420", "NotOlderThan")
        assert _rv(server.lists[4]) == (None, None)
        informer.reset()  # and then "not older than" again, above the consistent read's version (500)
        wait_until(lambda: len(server.lists) == 6, 10, "a relist")
        assert _rv(server.lists[5]) == ("500", "NotOlderThan")
    finally:
        server.closing.set()
        informer.stop()
        client.close()
