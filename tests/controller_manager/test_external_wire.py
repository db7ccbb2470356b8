"""The external endpoint's wire guarantees (issue 47), through a real endpoint and a real loopback fake proxy.

* Never twice: a controller's GET leaves a kept-alive connection in the
  endpoint's pool; its next request, a create with ``generateName``, reaches
  a proxy that reads it and dies before answering. The create arrives
  exactly once and the controller gets a 503 Status saying it may have been
  applied; the next request is served on a new connection.
* Bounded: a watch answer with a line that never ends is cut at the limit
  (``rangeshard.core.http1.MAX_LINE_BYTES``, the proxy's too) with an
  ``ERROR`` event carrying a Status and a WARNING; the memory the endpoint
  allocated meanwhile (tracemalloc, every thread) stays O(limit) although
  the proxy sends four times as much.
* A malformed chunked body ends the relayed watch at once, while the proxy
  keeps the connection open.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import tracemalloc
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from hashing import MAX_HASH, HashRange
from rangeshard.core.http1 import MAX_LINE_BYTES
from rangeshard.core.process import free_port
from tests.controller_manager.test_external_endpoint import (
    CONFIGMAPS,
    FakeShard,
    Seen,
    Upstream,
    _endpoint,
    chunk,
    default_respond,
    event,
    start_chunked,
)


def test_a_create_the_proxy_took_without_answering_arrives_once_and_is_a_503() -> None:
    def dies_on_create(handler: BaseHTTPRequestHandler, seen: Seen) -> None:
        if seen.method == "POST":
            handler.close_connection = True  # the body was read: the proxy acted on it, then died
            return
        default_respond(handler, seen)

    up = Upstream(dies_on_create)
    ep = _endpoint(up.url, FakeShard(range=HashRange(0, MAX_HASH)))
    try:
        with httpx.Client(base_url=ep.url, timeout=10) as c:
            assert c.get(f"{CONFIGMAPS}/cm").status_code == 200  # leaves a kept-alive connection in the pool
            assert up.connections == 1
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "cm-"}}
            resp = c.post(CONFIGMAPS, json=body)
            assert resp.status_code == 503, resp.text
            status = resp.json()
            assert status["kind"] == "Status" and status["reason"] == "ServiceUnavailable"
            assert "may have been applied" in status["message"]
            assert [s.method for s in up.seen] == ["GET", "POST"], "the create reached the proxy exactly once"
            assert up.connections == 1, "the create went over the pooled connection"
            assert c.get(f"{CONFIGMAPS}/cm").status_code == 200, "the next request gets a new connection"
            assert up.connections == 2
    finally:
        ep.stop()
        up.close()


def test_a_watch_line_that_never_ends_is_cut_with_an_error_event_and_bounded_memory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent = 0
    piece = b"y" * (1 << 20)

    def endless(handler: BaseHTTPRequestHandler, seen: Seen) -> None:
        nonlocal sent
        start_chunked(handler)
        chunk(handler, event("a", "6") + b'{"type":"ADDED","object":{"kind":"ConfigMap","data":"')
        try:
            while sent < 4 * MAX_LINE_BYTES:
                chunk(handler, piece)
                sent += len(piece)
        except OSError:
            return  # the endpoint cut the connection

    up = Upstream(endless)
    ep = _endpoint(up.url, FakeShard(range=HashRange(0, MAX_HASH)))
    tracemalloc.start()
    try:
        with (
            caplog.at_level(logging.WARNING, logger="controller_manager.external.endpoint"),
            httpx.Client(base_url=ep.url, timeout=30) as c,
            c.stream("GET", CONFIGMAPS, params={"watch": "1", "resourceVersion": "0"}) as resp,
        ):
            tracemalloc.reset_peak()
            lines = [json.loads(line) for line in resp.iter_lines() if line.strip()]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        ep.stop()
        up.close()
    assert [ev["type"] for ev in lines] == ["ADDED", "ERROR"], lines
    status = lines[1]["object"]
    assert status["kind"] == "Status" and status["code"] == 500 and f"longer than {MAX_LINE_BYTES}" in status["message"]
    assert sent < 4 * MAX_LINE_BYTES, "the endpoint read the line to its end instead of cutting it"
    assert peak < 2 * MAX_LINE_BYTES, f"peak {peak / 2**20:.1f} MiB for a {MAX_LINE_BYTES / 2**20:.0f} MiB limit"
    assert any(r.levelno == logging.WARNING and "longer than" in r.getMessage() for r in caplog.records)


def test_a_malformed_chunked_watch_body_ends_the_relayed_watch_at_once() -> None:
    hold = threading.Event()

    def broken(handler: BaseHTTPRequestHandler, seen: Seen) -> None:
        start_chunked(handler)
        chunk(handler, event("a", "6"))
        handler.wfile.write(b"zz-not-a-chunk-size\r\n")
        handler.wfile.flush()
        hold.wait(30)  # the connection stays open: only the framing says the body is broken

    up = Upstream(broken)
    ep = _endpoint(up.url, FakeShard(range=HashRange(0, MAX_HASH)))
    try:
        started = time.monotonic()
        with (
            httpx.Client(base_url=ep.url, timeout=10) as c,
            c.stream("GET", CONFIGMAPS, params={"watch": "1", "resourceVersion": "0"}) as resp,
        ):
            lines = [json.loads(line) for line in resp.iter_lines() if line.strip()]
        assert time.monotonic() - started < 5, "the relay waited for the proxy to close the connection"
        assert [ev["object"]["metadata"]["name"] for ev in lines] == ["a"]
    finally:
        hold.set()
        ep.stop()
        up.close()


def test_an_endpoint_whose_proxy_is_gone_answers_503_not_a_hang() -> None:
    ep = _endpoint(f"http://127.0.0.1:{free_port()}")
    try:
        resp = httpx.post(f"{ep.url}{CONFIGMAPS}", json={"metadata": {"generateName": "x-"}}, timeout=10)
        assert resp.status_code == 503 and "cannot be reached" in resp.json()["message"]
    finally:
        ep.stop()
