"""An informer never hands a half-read watch connection to its next request.

A real loopback HTTP/1.1 server (keep-alive, chunked watch streams) and the
official client's urllib3 pool: a watch that the informer leaves before the
server ends it (an ERROR event, a reset) must not go back to the pool as it
is, or the next list reads the rest of that stream as its status line
(``BadStatusLine``) or waits on it. Found as a 3x slower convergence of the
e2e joins when the informer first drove the core reflector.
"""

from __future__ import annotations

import itertools
import json
import logging
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes.client import ApiClient, Configuration

from controller_manager.informer import Informer
from controller_manager.resources import REPLICASETS
from hashing import MAX_HASH, UID_PATH, HashRange
from tests.helpers import wait_until


def rs(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": rv}}


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, watch_ending: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        #: What a watch sends after its event: "error410", "error500" or "open" (nothing, stays open).
        self.watch_ending = watch_ending
        self.requests: list[tuple[int, str, dict[str, list[str]]]] = []
        self.lists = 0
        self.closing = threading.Event()
        self.lock = threading.Lock()
        #: Called with ("list" | "watch", how many of that kind so far) when a request arrives.
        self.hook: Callable[[str, int], None] = lambda kind, n: None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        kind = "watch" if "watch" in query else "list"
        with self.server.lock:
            self.server.requests.append((id(self.connection), kind, query))
            n = sum(k == kind for _, k, _ in self.server.requests)
        self.server.hook(kind, n)
        if "watch" not in query:
            with self.server.lock:
                self.server.lists += 1
                n = self.server.lists
            body = json.dumps({"items": [rs(f"r{n}", str(10 * n))], "metadata": {"resourceVersion": str(10 * n)}})
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        # The events come a little after the headers, as from a server that waits for its cache:
        # a connection given back right after the headers has nothing unread yet.
        if self.server.closing.wait(0.3):
            return
        for line in self._watch_lines(query["resourceVersion"][0]):
            data = (line + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.server.closing.wait(30)
        self.close_connection = True

    def _watch_lines(self, rv: str) -> Iterator[str]:
        yield json.dumps({"type": "MODIFIED", "object": rs("w", str(int(rv) + 1))})
        ending = self.server.watch_ending
        if ending.startswith("error"):
            code = int(ending[5:])
            yield json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": code, "message": "gone"}})


@pytest.fixture
def make_informer() -> Iterator[Any]:
    made: list[tuple[_Server, Informer, ApiClient]] = []

    def make(watch_ending: str, hook: Callable[[Informer, str, int], None] | None = None) -> tuple[_Server, Informer]:
        server = _Server(watch_ending)
        threading.Thread(target=server.serve_forever, name="fake-apiserver", daemon=True).start()
        config = Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
        client = ApiClient(config)
        informer = Informer(
            client,
            REPLICASETS,
            path=UID_PATH,
            range_source=lambda: (1, HashRange(0, MAX_HASH)),
            on_event=lambda kind, o: None,
            name="conn",
            request_timeout=20.0,
        )
        if hook is not None:
            server.hook = lambda kind, n: hook(informer, kind, n)
        made.append((server, informer, client))
        return server, informer

    yield make
    for server, informer, client in made:
        server.closing.set()
        informer.stop()
        client.close()
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("ending", ["error410", "error500"])
def test_a_watch_left_on_an_error_event_is_not_reused_by_the_next_list(
    make_informer: Any, ending: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    server, informer = make_informer(ending)
    informer.start()
    started = time.monotonic()
    # 410 relists at once, 500 after the 0.2 s backoff.
    wait_until(lambda: server.lists >= 3, 10, "three lists")
    assert time.monotonic() - started < 8
    with server.lock:
        kinds = [k for _, k, _ in server.requests]
        conns = [(c, k) for c, k, _ in server.requests]
    assert kinds[:4] == ["list", "watch", "list", "watch"]
    # The list after a watch never shares that watch's connection (it is still streaming).
    for (watch_conn, k), (next_conn, _) in itertools.pairwise(conns):
        if k == "watch":
            assert next_conn != watch_conn
    wait_until(lambda: informer.last_error is None and informer.synced_epoch == 1, 5, "synced without error")
    expected = [] if ending == "error410" else ["informer conn: API error 500: gone"]
    assert set(warnings(caplog)) <= set(expected)


def test_a_reset_while_watching_relists_on_a_fresh_connection(
    make_informer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    server, informer = make_informer("open")
    informer.start()
    wait_until(lambda: [k for _, k, _ in server.requests] == ["list", "watch"], 10, "a watch open")
    wait_until(lambda: informer.get("ns/w") is not None, 5, "the watch's event applied")
    for n in range(2, 5):
        informer.reset()
        wait_until(lambda n=n: server.lists >= n, 5, f"list {n} after a reset")
        wait_until(lambda n=n: sum(k == "watch" for _, k, _ in server.requests) >= n, 5, f"watch {n}")
    assert informer.last_error is None
    assert informer.get(f"ns/r{server.lists}") is not None
    assert warnings(caplog) == []


@pytest.mark.parametrize("when", ["list", "watch"])
def test_a_reset_racing_a_request_never_gives_back_a_streaming_connection(
    make_informer: Any, when: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The range changes while the second list is answered, or just as the second watch is answered (before the
    informer holds the response, so :meth:`Informer.reset` cannot close it): the informer leaves that watch
    (or never opens it) and relists. Given back to the pool mid-stream, the watch's connection would carry the
    next list, which would read the watch's first chunk as its status line (``BadStatusLine``) 0.3 s later."""
    caplog.set_level(logging.WARNING)

    def hook(informer: Informer, kind: str, n: int) -> None:
        if kind == when and n == 2:
            informer.reset()

    server, informer = make_informer("open", hook)
    informer.start()

    def watches() -> int:
        with server.lock:
            return sum(k == "watch" for _, k, _ in server.requests)

    # The first watch stays open: a range change ends it; the requests after it meet the second reset.
    wait_until(lambda: watches() == 1, 10, "the first watch")
    informer.reset()
    wait_until(lambda: server.lists >= 3 and watches() >= (3 if when == "watch" else 2), 10, "the relist's watch")
    wait_until(lambda: informer.last_error is None and informer.get("ns/w") is not None, 5, "a watch's event")
    assert warnings(caplog) == []


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What was logged at WARNING or above (a request that met the rest of a stream logs one)."""
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
