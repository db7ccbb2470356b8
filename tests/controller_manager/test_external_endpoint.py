"""The external endpoint without a cluster: its serving periods, its watch cut and what each request becomes.

* A watch may resume only from a resourceVersion handed out (by a list or a
  watch event) since the last reset; anything else is a 410 and the client
  relists. Answers cut under an older range never count.
* A reset ends a relayed watch at once, even when the upstream is silent,
  and nothing of the range served before is relayed after it.
* A request for a range the endpoint serves nothing of gets a selector
  that matches nothing; a client's own ``shardSelector`` is a 400.
* Every write to a ``shard`` resource (create, update, patch, delete, and
  writes to its subresources such as ``/status``) carries the owner token at
  the start of its User-Agent, followed by the client's own; reads, other
  resources, Events, Leases and discovery pass the client's User-Agent
  unchanged.
* ``watch=tRuE`` is the 400 every server of ours answers; the manager's
  token replaces the client's, and survives a moment of an unreadable file.
* Everything else passes unchanged: chunked answers stream, ``HEAD``, bodies,
  keep-alive; an unreachable proxy is a 503 Status.

The shard instance is an in-memory stand-in with the two attributes the
endpoint reads (``allowed``, ``epoch``); the upstream is a real local HTTP
server standing in for the proxy.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from controller_manager.config import ExternalSection
from controller_manager.external import Endpoint
from controller_manager.external.serving import ISSUED_MAX
from hashing import MAX_HASH, HashRange
from rangeshard.core.ownertoken import OwnerToken
from rangeshard.core.requestinfo import classify
from tests.helpers import wait_until

CONFIGMAPS = "/api/v1/namespaces/a/configmaps"


@dataclass
class FakeShard:
    """The shard instance as the serving state reads it: its range (``None``: nothing), lock and epoch."""

    range: HashRange | None = None
    locked: bool = False
    epoch: int = 0

    def serving_target(self) -> tuple[int, HashRange | None, bool]:
        return self.epoch, self.range, self.locked

    def write_fenced(self, token: OwnerToken | None, stale_epoch: bool) -> bool:
        return False

    #: What the peers published of their writes (``handoverResourceVersions``), per resource label.
    floors: dict[str, int] = field(default_factory=dict)

    def floor(self, label: str) -> int:
        return self.floors.get(label, 0)


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Respond = Callable[[BaseHTTPRequestHandler, Seen], None]


def answer(handler: BaseHTTPRequestHandler, status: int, body: bytes, **headers: str) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    for k, v in headers.items():
        handler.send_header(k.replace("_", "-"), v)
    handler.end_headers()
    handler.wfile.write(body)


def chunk(handler: BaseHTTPRequestHandler, data: bytes) -> None:
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()


def start_chunked(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    handler.wfile.flush()


def event(name: str, rv: str) -> bytes:
    obj = {"kind": "ConfigMap", "metadata": {"name": name, "resourceVersion": rv}}
    return json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n"


def default_respond(handler: BaseHTTPRequestHandler, seen: Seen) -> None:
    if seen.method == "GET" and "/configmaps" in seen.path and "/configmaps/" not in seen.path:
        body = b'{"kind":"ConfigMapList","metadata":{"resourceVersion":"5"},"items":[]}'
    else:
        body = b'{"kind":"Status","apiVersion":"v1","status":"Success"}'
    answer(handler, 200, body)


class Upstream:
    """A real local HTTP server standing in for the proxy: records each request, answers with ``respond``."""

    def __init__(self, respond: Respond = default_respond) -> None:
        self.seen: list[Seen] = []
        self.respond = respond
        self.connections = 0
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                upstream.connections += 1

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                seen = Seen(self.command, self.path, dict(self.headers.items()), self.rfile.read(length))
                upstream.seen.append(seen)
                upstream.respond(self, seen)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _answer  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _section(resource: str = "configmaps") -> ExternalSection:
    return ExternalSection.model_validate({"shard": [{"resource": resource, "by": "uid"}]})


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    try:
        yield up
    finally:
        up.close()


def _endpoint(upstream: str, shard: FakeShard | None = None, **kwargs: Any) -> Endpoint:
    ep = Endpoint("ext", _section(), shard or FakeShard(), proxy_url=upstream, **kwargs)
    ep.start()
    ep.state.on_epoch()  # serve the shard's range (nothing read yet: at once)
    return ep


# ---- serving periods, without sockets --------------------------------------------------------


def test_a_watch_resumes_only_from_a_resource_version_of_the_current_serving_period() -> None:
    ep = Endpoint("ext", _section(), FakeShard(), proxy_url="http://127.0.0.1:9")
    state = ep.state
    try:
        assert state.fresh("configmaps", "") and state.fresh("configmaps", "0"), "no resourceVersion carries no state"
        assert not state.fresh("configmaps", "17"), "never handed out"
        gen = state.generation("configmaps")
        state.issued("configmaps", "17", gen)
        state.issued("configmaps", "", gen)  # ignored
        assert state.fresh("configmaps", "17")
        state.reset_watches("range changed")
        assert not state.fresh("configmaps", "17"), "a list of the old range must not seed a watch of the new one"
        state.issued("configmaps", "18", gen)  # answered after the reset, but cut under the old range
        assert not state.fresh("configmaps", "18")
        state.issued("configmaps", "19", state.generation("configmaps"))
        assert state.fresh("configmaps", "19")
    finally:
        ep.stop()


def test_issued_resource_versions_are_bounded() -> None:
    ep = Endpoint("ext", _section(), FakeShard(), proxy_url="http://127.0.0.1:9")
    try:
        gen = ep.state.generation("configmaps")
        for i in range(ISSUED_MAX + 10):
            ep.state.issued("configmaps", str(i), gen)
        assert not ep.state.fresh("configmaps", "0" + "1"), "the oldest were dropped"
        assert ep.state.fresh("configmaps", str(ISSUED_MAX + 9))
    finally:
        ep.stop()


def test_selectors_for_nothing_and_for_a_range() -> None:
    shard = FakeShard()
    ep = Endpoint("ext", _section(), shard, proxy_url="http://127.0.0.1:9")
    try:
        ep.state.on_epoch()
        assert ep.state.served_selector("configmaps") is None, "locked or between ranges: nothing"
        shard.range = HashRange(0, 2**62 - 1)
        ep.state.on_epoch()
        selector = ep.state.served_selector("configmaps")
        assert selector is not None and selector.startswith("shardRange(object.metadata.uid,")
    finally:
        ep.stop()


# ---- through the endpoint ------------------------------------------------------------------------


def test_a_reset_cuts_a_silent_watch_at_once() -> None:
    done = threading.Event()

    def silent(handler: BaseHTTPRequestHandler, seen: Seen) -> None:
        start_chunked(handler)
        done.wait(30)

    up = Upstream(silent)
    ep = _endpoint(up.url, FakeShard(range=HashRange(0, MAX_HASH)))
    try:
        with (
            httpx.Client(base_url=ep.url, timeout=10) as c,
            c.stream("GET", CONFIGMAPS, params={"watch": "true"}) as resp,
        ):
            assert resp.status_code == 200
            wait_until(lambda: len(up.seen) == 1, 10, "the watch reached the upstream")
            time.sleep(0.2)  # the relay waits on a silent upstream (scenario time)
            ep.state.reset_watches("range changed")
            lines = list(resp.iter_lines())
        assert len(lines) == 1 and '"code":410' in lines[0] and '"type":"ERROR"' in lines[0], lines
        assert "shardSelector=shardRange" in up.seen[0].path
    finally:
        done.set()
        ep.stop()
        up.close()


def test_watch_events_are_relayed_their_versions_issued_and_nothing_after_a_cut() -> None:
    go_on = threading.Event()

    def events(handler: BaseHTTPRequestHandler, seen: Seen) -> None:
        start_chunked(handler)
        chunk(handler, event("a", "6") + event("b", "7")[:20])  # an event split over two chunks
        chunk(handler, event("b", "7")[20:])
        go_on.wait(10)
        for i in range(50):  # sent after the cut: none may reach the client
            try:
                chunk(handler, event(f"late{i}", str(100 + i)))
            except OSError:
                return
            time.sleep(0.01)

    up = Upstream(events)
    ep = _endpoint(up.url, FakeShard(range=HashRange(0, MAX_HASH)))
    try:
        with (
            httpx.Client(base_url=ep.url, timeout=10) as c,
            c.stream("GET", CONFIGMAPS, params={"watch": "1", "resourceVersion": "0"}) as resp,
        ):
            lines = resp.iter_lines()
            first = [json.loads(next(lines)) for _ in range(2)]
            assert [e["object"]["metadata"]["name"] for e in first] == ["a", "b"]
            assert ep.state.fresh("configmaps", "6") and ep.state.fresh("configmaps", "7"), (
                "a watch may resume from a relayed event"
            )
            ep.state.reset_watches("range changed")
            go_on.set()
            rest = list(lines)
        assert len(rest) == 1 and '"code":410' in rest[0], rest
        assert not ep.state.fresh("configmaps", "7")
    finally:
        go_on.set()
        ep.stop()
        up.close()


def test_the_endpoint_refuses_a_clients_own_shard_selector_and_serves_nothing_while_locked(upstream: Upstream) -> None:
    """400 Status for a client's selector; nothing while no range is allowed; a stale resume is a 410 event."""
    ep = _endpoint(upstream.url)
    try:
        with httpx.Client(base_url=ep.url, timeout=10) as c:
            bad = c.get(CONFIGMAPS, params={"shardSelector": "x"})
            assert bad.status_code == 400 and bad.json()["kind"] == "Status"
            ok = c.get(CONFIGMAPS, params={"fieldSelector": "metadata.name=x"})
            assert ok.status_code == 200 and ok.json()["kind"] == "ConfigMapList"
            assert "rangeshard-serves-nothing" in upstream.seen[-1].path
            assert "metadata.name%3Dx" in upstream.seen[-1].path, upstream.seen[-1].path
            assert "accept-encoding" not in {k.lower() for k in upstream.seen[-1].headers}, "the list is read"
            # The list's resourceVersion was handed out in this serving period: a watch may resume from it.
            assert ep.state.fresh("configmaps", "5")
            other = c.get("/api/v1/namespaces/a/pods")
            # Another resource's consistent list is asked from a cache, as client-go's first list.
            assert other.status_code == 200 and upstream.seen[-1].path == "/api/v1/namespaces/a/pods?resourceVersion=0"
            stale = c.get(CONFIGMAPS, params={"watch": "true", "resourceVersion": "4"})
            assert stale.status_code == 200
            (line,) = stale.text.splitlines()
            assert '"type":"ERROR"' in line and '"code":410' in line, line
    finally:
        ep.stop()


def test_watch_true_in_odd_case_is_the_400_of_every_server(upstream: Upstream) -> None:
    """The endpoint used to take ``tRuE`` for a watch (its own parser); now the classifier's 400, as the proxy's."""
    ep = _endpoint(upstream.url, FakeShard(range=HashRange(0, MAX_HASH)))
    expected = classify("GET", CONFIGMAPS, {"watch": "tRuE"}).invalid
    assert expected is not None
    try:
        with httpx.Client(base_url=ep.url, timeout=10) as c:
            for path in (CONFIGMAPS, "/api/v1/namespaces/a/pods"):  # sharded or not
                resp = c.get(path, params={"watch": "tRuE"})
                assert resp.status_code == 400 and resp.json()["message"] == expected.message, resp.text
        assert upstream.seen == [], "refused at the endpoint"
    finally:
        ep.stop()


def test_writes_to_a_shard_resource_carry_the_owner_token_and_other_requests_pass_unchanged(
    upstream: Upstream,
) -> None:
    """Which requests get the owner token in their User-Agent, and the declared rule."""
    section = _section("gadgets.bars.example.org")
    ep = Endpoint("ext", section, FakeShard(range=HashRange(0, MAX_HASH)), proxy_url=upstream.url)
    token = OwnerToken("gadget", "m-1", 0xABC, 4)
    ep.state.on_token(token)
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
        for seen in upstream.seen[:n_tagged]:
            agent = seen.headers.get("User-Agent")
            # The token first, then the client's own agent, then the declared rule (for the audit log).
            assert agent == f"{token.user_agent()} {child_ua} rangeshard-shard-by/uid", (seen.method, agent)
            assert OwnerToken.parse(agent) == token
            assert seen.headers.get("X-Rangeshard-Shard-By") == "uid"
        assert [(s.method, s.path.split("?")[0]) for s in upstream.seen[:n_tagged]] == [
            ("POST", gadgets),
            ("PUT", f"{gadgets}/g1"),
            ("PUT", f"{gadgets}/g1/status"),
            ("PATCH", f"{gadgets}/g1/status"),
            ("DELETE", f"{gadgets}/g1"),
        ]
        assert upstream.seen[0].body == b'{"metadata":{"name":"g1"}}', "the body as sent"
        for seen in upstream.seen[n_tagged:]:
            assert seen.headers.get("User-Agent") == child_ua, seen
            assert "X-Rangeshard-Shard-By" not in seen.headers
        assert ep.state.writes_in_flight == 0, "every write ended"
    finally:
        ep.stop()


def test_a_watch_that_opens_across_a_reset_is_cut_at_once() -> None:
    """A reset between a watch's freshness check and its registration still ends it with ERROR 410.

    The race seen under load with the JavaScript informer: it listed while its instance was locked
    (nothing), the instance was unlocked while its watch request was on the way (the check still saw
    the list's resourceVersion as fresh, the selector already the new range), and the watch, never
    cut, resumed from an empty list: the controller never saw the objects of its range.
    """
    shard = FakeShard()
    holder: list[Endpoint] = []

    def respond(handler: BaseHTTPRequestHandler, seen: Seen) -> None:
        if "watch=true" in seen.path:
            shard.range = HashRange(0, MAX_HASH)
            holder[0].state.on_epoch()  # the instance may now serve its range: lands while upstream
            start_chunked(handler)
            chunk(handler, event("a", "6"))
            chunk(handler, b"")
            return
        default_respond(handler, seen)

    up = Upstream(respond)
    ep = _endpoint(up.url, shard)
    holder.append(ep)
    try:
        with httpx.Client(base_url=ep.url, timeout=10) as c:
            assert c.get(CONFIGMAPS).status_code == 200  # locked: serves nothing
            assert ep.state.fresh("configmaps", "5")
            watch = c.get(CONFIGMAPS, params={"watch": "true", "resourceVersion": "5"})
            assert any("watch=true" in s.path for s in up.seen), "the watch reached the upstream"
            lines = watch.text.splitlines()
            assert len(lines) == 1 and '"type":"ERROR"' in lines[0] and '"code":410' in lines[0], lines
            assert not ep.state.fresh("configmaps", "5"), (
                "after the reset the empty list seeds no watch: the client relists"
            )
    finally:
        ep.stop()
        up.close()


def test_the_managers_token_replaces_the_clients_and_outlives_an_unreadable_file(
    upstream: Upstream, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("manager-token\n")
    ep = _endpoint(upstream.url, token_file=str(token))
    try:
        with httpx.Client(base_url=ep.url, timeout=10, headers={"Authorization": "Bearer child"}) as c:
            assert c.get("/api/v1/namespaces/a/pods").status_code == 200
            token.unlink()  # a rotation in progress
            assert c.get("/api/v1/namespaces/a/pods").status_code == 200
            token.write_text("rotated\n")
            st = token.stat()
            os.utime(token, (st.st_atime, st.st_mtime + 10))
            assert c.get("/api/v1/namespaces/a/pods").status_code == 200
        assert [s.headers.get("Authorization") for s in upstream.seen] == [
            "Bearer manager-token",
            "Bearer manager-token",
            "Bearer rotated",
        ]
    finally:
        ep.stop()


def test_everything_else_passes_unchanged() -> None:
    """Chunked answers stream as they come, HEAD, status and headers, request bodies, one kept-alive connection."""
    release = threading.Event()

    def respond(handler: BaseHTTPRequestHandler, seen: Seen) -> None:
        if seen.path.startswith("/api/v1/namespaces/a/pods/p/log"):
            start_chunked(handler)
            chunk(handler, b"line 1\n")
            release.wait(10)
            chunk(handler, b"line 2\n")
            chunk(handler, b"")
        elif seen.method == "HEAD":
            handler.send_response(200)
            handler.send_header("Content-Length", "1234")
            handler.end_headers()
        elif seen.method == "POST":
            answer(handler, 201, seen.body, X_Upstream="yes")
        else:
            answer(handler, 404, b'{"kind":"Status","code":404}', Warning='299 - "deprecated"')

    up = Upstream(respond)
    ep = _endpoint(up.url)
    try:
        with httpx.Client(base_url=ep.url, timeout=10) as c:
            with c.stream("GET", "/api/v1/namespaces/a/pods/p/log", params={"follow": "true"}) as resp:
                pieces = resp.iter_text()
                assert next(pieces) == "line 1\n", "streamed before the answer ended"
                release.set()
                assert "".join(pieces) == "line 2\n"
            head = c.head("/api/v1/namespaces/a/pods/p")
            assert head.status_code == 200 and head.headers["content-length"] == "1234" and head.content == b""

            def body() -> Iterator[bytes]:
                yield b'{"metadata":'
                yield b'{"name":"x"}}'

            created = c.post("/api/v1/namespaces/a/pods", content=body())  # a chunked request body
            assert created.status_code == 201 and created.json() == {"metadata": {"name": "x"}}
            assert created.headers["x-upstream"] == "yes"
            missing = c.get("/api/v1/namespaces/a/pods/none?pretty=1&x=a%20b")
            assert missing.status_code == 404 and missing.headers["warning"] == '299 - "deprecated"'
        assert up.seen[-1].path == "/api/v1/namespaces/a/pods/none?pretty=1&x=a%20b", "the query as sent"
        assert up.connections <= 2, f"connections to the proxy are reused ({up.connections}; HEAD uses its own)"
    finally:
        release.set()
        ep.stop()
        up.close()


def test_an_unreachable_proxy_is_a_503_status() -> None:
    ep = _endpoint("http://127.0.0.1:9")
    try:
        resp = httpx.get(f"{ep.url}/api/v1/namespaces/a/pods", timeout=10)
        assert resp.status_code == 503 and resp.json()["reason"] == "ServiceUnavailable"
    finally:
        ep.stop()


@dataclass
class FencingShard(FakeShard):
    """A shard instance that records what the endpoint tells it of fenced writes."""

    fenced: list[tuple[OwnerToken | None, bool]] = field(default_factory=list)

    def write_fenced(self, token: OwnerToken | None, stale_epoch: bool) -> bool:
        self.fenced.append((token, stale_epoch))
        return True


def test_a_write_fenced_for_a_stale_epoch_makes_the_instance_take_a_fresh_epoch() -> None:
    """As an in-process controller does: else the child's writes stay fenced until the range changes again."""

    def respond(handler: BaseHTTPRequestHandler, seen: Seen) -> None:
        if "stale" in seen.path:
            answer(handler, 409, b'{"kind":"Status","code":409}', X_Rangeshard_Fenced="StaleEpoch")
        elif "locked" in seen.path:
            answer(handler, 409, b'{"kind":"Status","code":409}', X_Rangeshard_Fenced="Locked")
        elif "conflict" in seen.path:
            answer(handler, 409, b'{"kind":"Status","code":409,"reason":"Conflict"}')
        else:
            answer(handler, 200, b"{}")

    upstream = Upstream(respond)
    shard = FencingShard(range=HashRange(0, MAX_HASH))
    ep = Endpoint("ext", _section("configmaps"), shard, proxy_url=upstream.url)
    token = OwnerToken("ext", "m-1", 0xABC, 4)
    ep.state.on_token(token)
    ep.start()
    try:
        with httpx.Client(base_url=ep.url, timeout=10) as c:
            cms = "/api/v1/namespaces/a/configmaps"
            answers = [c.put(f"{cms}/{name}", json={"metadata": {"name": name}}) for name in ("stale", "locked")]
            answers.append(c.put(f"{cms}/conflict", json={"metadata": {"name": "conflict"}}))
            answers.append(c.put(f"{cms}/fine", json={"metadata": {"name": "fine"}}))
        assert [a.status_code for a in answers] == [409, 409, 409, 200]
        assert answers[0].headers["X-Rangeshard-Fenced"] == "StaleEpoch"  # relayed to the child as it came
        assert shard.fenced == [(token, True)]  # only the stale epoch asks for a fresh one
    finally:
        ep.stop()
        upstream.close()


def test_consistent_lists_are_asked_from_the_cache_never_older_than_what_the_controller_saw(
    upstream: Upstream,
) -> None:
    """Issue 46: a handover's relists cost no upstream read, and never go back before what was handed out."""
    ep = _endpoint(upstream.url, FakeShard(range=HashRange(0, MAX_HASH)))
    try:
        with httpx.Client(base_url=ep.url, timeout=10) as c:
            c.get(CONFIGMAPS)  # nothing handed out yet: any cached state
            assert "resourceVersion=0" in upstream.seen[-1].path
            assert "resourceVersionMatch" not in upstream.seen[-1].path
            c.get(CONFIGMAPS, params={"limit": "500"})  # the list answered resourceVersion 5: not older than that
            assert "resourceVersion=5&resourceVersionMatch=NotOlderThan" in upstream.seen[-1].path
            assert "limit=500" in upstream.seen[-1].path
            for params in (
                {"resourceVersion": "3"},  # the client names one: as sent
                {"continue": "abc", "limit": "1"},  # a next page: as sent
                {"resourceVersion": "4", "resourceVersionMatch": "Exact"},
            ):
                c.get(CONFIGMAPS, params=params)
                seen = upstream.seen[-1].path
                assert "resourceVersion=5" not in seen and "NotOlderThan" not in seen, (params, seen)
            c.get("/api/v1/namespaces/a/pods", params={"resourceVersion": "7"})
            assert upstream.seen[-1].path == "/api/v1/namespaces/a/pods?resourceVersion=7", "named: unchanged"
            c.get("/api/v1/namespaces/a/pods/p1")
            assert upstream.seen[-1].path == "/api/v1/namespaces/a/pods/p1", "a GET of one object: unchanged"
    finally:
        ep.stop()


def test_a_relist_is_not_older_than_the_givers_writes_and_the_controllers_writes_are_recorded() -> None:
    """Issue 46: the floor of a consistent list is also what a peer (the giver) published of its writes; the
    resourceVersion of each successful write of a shard resource is recorded for the instance to publish."""

    def respond(handler: BaseHTTPRequestHandler, seen: Seen) -> None:
        if seen.method == "GET":
            answer(handler, 200, b'{"kind":"ConfigMapList","metadata":{"resourceVersion":"5"},"items":[]}')
        elif seen.path.endswith("/refused"):
            answer(handler, 409, b'{"kind":"Status","status":"Failure","code":409}')
        elif seen.method == "DELETE":
            answer(handler, 200, b'{"kind":"Status","apiVersion":"v1","status":"Success"}')
        else:
            answer(handler, 201, json.dumps({"metadata": {"name": "c", "resourceVersion": seen.path[-2:]}}).encode())

    upstream = Upstream(respond)
    shard = FakeShard(range=HashRange(0, MAX_HASH), floors={"configmaps": 40})
    ep = _endpoint(upstream.url, shard)
    ep.state.on_token(OwnerToken("ext", "m-1", 0xABC, 4))
    try:
        with httpx.Client(base_url=ep.url, timeout=10) as c:
            c.get(CONFIGMAPS)  # nothing handed out, but the giver wrote at 40: not older than that
            assert "resourceVersion=40&resourceVersionMatch=NotOlderThan" in upstream.seen[-1].path
            assert c.put(f"{CONFIGMAPS}/c-77", json={}).status_code == 201
            assert c.put(f"{CONFIGMAPS}/c-52", json={}).status_code == 201  # lower: the highest is kept
            assert c.put(f"{CONFIGMAPS}/refused", json={}).status_code == 409  # not written: not recorded
            assert c.delete(f"{CONFIGMAPS}/c-99").status_code == 200  # a Status: no version
            assert c.put("/api/v1/namespaces/a/secrets/s-88", json={}).status_code == 201  # not a shard resource
            assert ep.state.written.snapshot() == {"configmaps": 77}
            assert ep.state.writes_in_flight == 0
            shard.floors["configmaps"] = 3  # what this controller was handed (5) is higher
            c.get(CONFIGMAPS)
            assert "resourceVersion=5&resourceVersionMatch=NotOlderThan" in upstream.seen[-1].path
    finally:
        ep.stop()
        upstream.close()


def test_a_streaming_list_needs_no_resume_point_and_its_bookmark_completes_a_step() -> None:
    """sendInitialEvents carries its state: never a 410 for its resourceVersion; its initial-events-end bookmark
    counts as the controller having taken the step in (client-go's WatchList)."""
    done = threading.Event()
    bookmark = {
        "type": "BOOKMARK",
        "object": {"kind": "ConfigMap", "metadata": {"resourceVersion": "9", "annotations": {
            "k8s.io/initial-events-end": "true"}}},
    }  # fmt: skip

    def respond(handler: BaseHTTPRequestHandler, seen: Seen) -> None:
        if "watch=" in seen.path:
            start_chunked(handler)
            chunk(handler, event("a", "8") + json.dumps(bookmark).encode() + b"\n")
            done.wait(10)
            return
        default_respond(handler, seen)

    up = Upstream(respond)
    shard = FakeShard(range=HashRange(0, MAX_HASH))
    ep = _endpoint(up.url, shard)
    try:
        with httpx.Client(base_url=ep.url, timeout=10) as c:
            assert c.get(CONFIGMAPS).status_code == 200  # the controller read configmaps once
            shard.range, shard.epoch = HashRange(0, MAX_HASH // 2), 1
            ep.state.on_epoch()  # a step that cuts configmaps: the controller must read them again
            assert not ep.state.synced(1)
            params = {"watch": "1", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
                      "resourceVersion": "4", "allowWatchBookmarks": "true"}  # fmt: skip
            with c.stream("GET", CONFIGMAPS, params=params) as resp:
                lines = resp.iter_lines()
                assert json.loads(next(lines))["type"] == "ADDED", "not a 410: a streaming list carries its state"
                assert json.loads(next(lines))["type"] == "BOOKMARK"
                wait_until(lambda: ep.state.synced(1), 10, "the step taken in at the initial-events-end bookmark")
    finally:
        done.set()
        ep.stop()
        up.close()
