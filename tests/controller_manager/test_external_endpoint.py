"""The external endpoint's serving-period bookkeeping and its watch cut, without a cluster.

* A watch may resume only from a resourceVersion handed out (by a list or a
  watch event) since the last reset; anything else is a 410 and the client
  relists. Answers cut under an older range never count.
* A reset ends a relayed watch even when the upstream is silent: the cut
  shuts the socket down (closing the response alone does not wake a read
  blocked in another thread).
* A request for a range the endpoint serves nothing of gets a selector
  that matches nothing; a client's own ``shardSelector`` is a 400.
* Every write to a ``shard`` resource (create, update, patch, delete, and
  writes to its subresources such as ``/status``) carries the owner token at
  the start of its User-Agent, followed by the client's own; reads, other
  resources, Events, Leases and discovery pass the client's User-Agent
  unchanged.

The shard instance is an in-memory stand-in with the two attributes the
endpoint reads (``allowed``, ``epoch``); the upstream is a real local socket
(a plain HTTP server standing in for the proxy, or ``httpx.MockTransport``).
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from controller_manager.config import ExternalSection
from controller_manager.external import Endpoint, _Watch
from hashing import MAX_HASH, HashRange, ShardBy
from rangeshard.core.ownertoken import OwnerToken


@dataclass
class FakeShard:
    allowed: HashRange | None = None
    epoch: int = 0


def _endpoint(upstream: str = "http://127.0.0.1:9") -> tuple[Endpoint, FakeShard]:
    shard = FakeShard()
    section = ExternalSection.model_validate({"shard": [{"resource": "configmaps", "by": "uid"}]})
    return Endpoint("ext", section, shard, proxy_url=upstream), shard  # type: ignore[arg-type]


def test_a_watch_resumes_only_from_a_resource_version_of_the_current_serving_period() -> None:
    ep, _ = _endpoint()
    try:
        assert ep.fresh("") and ep.fresh("0"), "no resourceVersion carries no state"
        assert not ep.fresh("17"), "never handed out"
        gen = ep.generation()
        ep.issued("17", gen)
        ep.issued("", gen)  # ignored
        assert ep.fresh("17")
        ep.reset_watches("range changed")
        assert not ep.fresh("17"), "a list of the old range must not seed a watch of the new one"
        ep.issued("18", gen)  # answered after the reset, but cut under the old range
        assert not ep.fresh("18")
        ep.issued("19", ep.generation())
        assert ep.fresh("19")
    finally:
        ep.stop()


def test_issued_resource_versions_are_bounded() -> None:
    from controller_manager import external  # noqa: PLC0415

    ep, _ = _endpoint()
    try:
        gen = ep.generation()
        for i in range(external._ISSUED_MAX + 10):
            ep.issued(str(i), gen)
        assert not ep.fresh("0" + "1"), "the oldest were dropped"
        assert ep.fresh(str(external._ISSUED_MAX + 9))
    finally:
        ep.stop()


def _silent_upstream() -> tuple[socket.socket, threading.Event]:
    """A server that answers a streaming 200 and then sends nothing until told to stop."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    done = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            done.wait(30)

    threading.Thread(target=serve, daemon=True).start()
    return server, done


def test_a_reset_cuts_a_silent_watch_at_once() -> None:
    server, done = _silent_upstream()
    port = server.getsockname()[1]
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=httpx.Timeout(30.0, read=None))
    try:
        response = client.send(client.build_request("GET", "/api/v1/configmaps?watch=true"), stream=True)
        watch = _Watch(response)
        ended = threading.Event()
        errors: list[Any] = []

        def read() -> None:
            try:
                for _ in response.iter_lines():
                    pass
            except Exception as e:  # the cut may surface as a read error; either way the relay ends
                errors.append(e)
            ended.set()

        threading.Thread(target=read, daemon=True).start()
        time.sleep(0.2)  # let the reader block in recv (scenario time)
        assert not ended.is_set(), "the upstream sent nothing: the read must still be blocked"
        watch.cut()
        assert ended.wait(5), "the cut did not end a read blocked on a silent upstream"
        assert watch.reset
    finally:
        done.set()
        client.close()
        server.close()


def test_selectors_for_nothing_and_for_a_range() -> None:
    ep, shard = _endpoint()
    try:
        assert ep.served_selector(ShardBy.UID) is None, "locked or between ranges: nothing"
        shard.allowed = HashRange(0, 2**62 - 1)
        selector = ep.served_selector(ShardBy.UID)
        assert selector is not None and selector.startswith("shardRange(object.metadata.uid,")
    finally:
        ep.stop()


def test_the_endpoint_refuses_a_clients_own_shard_selector_and_serves_nothing_while_locked() -> None:
    """Through the real HTTP server: 400 Status for a client's selector; nothing while no range is allowed."""
    seen: list[str] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json={"kind": "ConfigMapList", "metadata": {"resourceVersion": "5"}, "items": []})

    ep, _ = _endpoint()
    ep.client = httpx.Client(base_url="http://upstream.invalid", transport=httpx.MockTransport(upstream))
    ep.start()
    try:
        with httpx.Client(base_url=ep.url, timeout=10) as c:
            bad = c.get("/api/v1/namespaces/a/configmaps", params={"shardSelector": "x"})
            assert bad.status_code == 400 and bad.json()["kind"] == "Status"
            ok = c.get("/api/v1/namespaces/a/configmaps", params={"fieldSelector": "metadata.name=x"})
            assert ok.status_code == 200
            assert "rangeshard-serves-nothing" in seen[-1] and "metadata.name%3Dx" in seen[-1], seen[-1]
            # The list's resourceVersion was handed out in this serving period: a watch may resume from it.
            assert ep.fresh("5")
            other = c.get("/api/v1/namespaces/a/pods")
            assert other.status_code == 200 and "fieldSelector" not in seen[-1], "other resources pass through"
            stale = c.get("/api/v1/namespaces/a/configmaps", params={"watch": "true", "resourceVersion": "4"})
            assert stale.status_code == 200
            (line,) = stale.text.splitlines()
            assert '"type":"ERROR"' in line and '"code":410' in line, line
    finally:
        ep.stop()


class _Upstream:
    """A real local HTTP server standing in for the proxy: records (method, path, User-Agent), answers 200 JSON."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        #: The ``X-Rangeshard-Shard-By`` header of each request, in the order of ``seen``.
        self.rules: list[str | None] = []
        seen, rules = self.seen, self.rules

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                seen.append((self.command, self.path, self.headers.get("User-Agent")))
                rules.append(self.headers.get("X-Rangeshard-Shard-By"))
                body = b'{"kind":"Status","apiVersion":"v1","status":"Success"}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_writes_to_a_shard_resource_carry_the_owner_token_and_other_requests_pass_unchanged() -> None:
    """Through the real endpoint to a real upstream socket: which requests get the owner token in their User-Agent."""
    upstream = _Upstream()
    section = ExternalSection.model_validate({"shard": [{"resource": "gadgets.bars.example.org", "by": "uid"}]})
    ep = Endpoint("ext", section, FakeShard(allowed=HashRange(0, MAX_HASH)), proxy_url=upstream.url)  # type: ignore[arg-type]
    token = OwnerToken("gadget", "m-1", 0xABC, 4)
    ep.on_token(token)
    ep.start()
    child_ua = "kopf/1.37.2"
    gadgets = "/apis/bars.example.org/v1/namespaces/a/gadgets"
    merge = {"Content-Type": "application/merge-patch+json"}
    try:
        with httpx.Client(base_url=ep.url, timeout=10, headers={"User-Agent": child_ua}) as c:
            tagged = [
                c.post(gadgets, json={"metadata": {"name": "g1"}}),
                c.put(f"{gadgets}/g1", json={"metadata": {"name": "g1"}}),
                c.put(f"{gadgets}/g1/status", json={"metadata": {"name": "g1"}, "status": {"ok": True}}),
                c.patch(f"{gadgets}/g1/status", content=b'{"status":{"ok":false}}', headers=merge),
                c.delete(f"{gadgets}/g1"),
            ]
            n_tagged = len(upstream.seen)
            untagged = [
                c.get(f"{gadgets}/g1"),  # a read of the shard resource
                c.put("/api/v1/namespaces/a/configmaps/c1", json={"metadata": {"name": "c1"}}),
                c.patch("/api/v1/namespaces/a/configmaps/c1/status", content=b"{}", headers=merge),
                c.post("/api/v1/namespaces/a/events", json={"metadata": {"name": "e1"}}),
                c.put("/apis/coordination.k8s.io/v1/namespaces/a/leases/l1", json={"metadata": {"name": "l1"}}),
                c.get("/apis/bars.example.org/v1"),  # discovery
            ]
        assert all(r.status_code == 200 for r in tagged + untagged), [r.text for r in tagged + untagged]
        assert len(upstream.seen) == len(tagged) + len(untagged)
        for method, path, agent in upstream.seen[:n_tagged]:
            # The token first, then the client's own agent, then the declared rule (for the audit log).
            assert agent == f"{token.user_agent()} {child_ua} rangeshard-shard-by/uid", (method, path, agent)
            assert OwnerToken.parse(agent) == token
        assert [(m, p.split("?")[0]) for m, p, _ in upstream.seen[:n_tagged]] == [
            ("POST", gadgets),
            ("PUT", f"{gadgets}/g1"),
            ("PUT", f"{gadgets}/g1/status"),
            ("PATCH", f"{gadgets}/g1/status"),
            ("DELETE", f"{gadgets}/g1"),
        ]
        for method, path, agent in upstream.seen[n_tagged:]:
            assert agent == child_ua, (method, path, agent)
        assert upstream.rules == ["uid"] * n_tagged + [None] * (len(upstream.seen) - n_tagged), upstream.rules
        assert ep.writes_in_flight == 0, "every write ended"
    finally:
        ep.stop()
        upstream.close()


def test_a_watch_that_opens_across_a_reset_is_cut_at_once() -> None:
    """A reset between a watch's freshness check and its registration still ends it with ERROR 410.

    The race seen under load with the JavaScript informer: it listed while its instance was locked
    (nothing), the instance was unlocked while its watch request was on the way (the check still saw
    the list's resourceVersion as fresh, the selector already the new range), and the watch, never
    cut, resumed from an empty list: the controller never saw the objects of its range.
    """
    ep, shard = _endpoint()
    resets: list[str] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("watch") == "true":
            shard.allowed = HashRange(0, MAX_HASH)
            ep.reset_watches("the instance may now serve its range")  # lands while the request is upstream
            resets.append(str(request.url))
            event = b'{"type":"ADDED","object":{"kind":"ConfigMap","metadata":{"name":"a","resourceVersion":"6"}}}\n'
            return httpx.Response(200, content=event, headers={"Content-Type": "application/json"})
        return httpx.Response(200, json={"kind": "ConfigMapList", "metadata": {"resourceVersion": "5"}, "items": []})

    ep.client = httpx.Client(base_url="http://upstream.invalid", transport=httpx.MockTransport(upstream))
    ep.start()
    try:
        with httpx.Client(base_url=ep.url, timeout=10) as c:
            assert c.get("/api/v1/namespaces/a/configmaps").status_code == 200  # locked: serves nothing
            assert ep.fresh("5")
            watch = c.get("/api/v1/namespaces/a/configmaps", params={"watch": "true", "resourceVersion": "5"})
            assert resets, "the watch reached the upstream"
            lines = watch.text.splitlines()
            assert len(lines) == 1 and '"type":"ERROR"' in lines[0] and '"code":410' in lines[0], lines
            assert not ep.fresh("5"), "after the reset the empty list seeds no watch: the client relists"
    finally:
        ep.stop()
