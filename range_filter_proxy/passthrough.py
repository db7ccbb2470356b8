"""Passing every request the cache does not serve through to the upstream, with write fencing.

Purpose
    :class:`PassThrough` forwards a request upstream unchanged (status,
    headers, body, the client's ``Authorization``) and relays the answer.
    With write fencing on, a write carrying an owner token is forwarded only
    if :class:`range_filter_proxy.fencing.WriteFence` lets it pass; else
    ``409`` (``fenced_status``), counted in
    ``range_filter_proxy_fenced_writes_total{reason}``. Writes without a token
    pass unchanged.

    It works at the ASGI level (:meth:`PassThrough.serve`: scope, receive,
    send) over the one HTTP/1.1 client (:mod:`rangeshard.core.http1client`, through
    :meth:`range_filter_proxy.upstream.Upstream.forward`): the proxy's app
    hands it every request that is not a collection ``GET`` before FastAPI
    routes anything (:meth:`range_filter_proxy.app.Proxy.relay`), and a
    collection ``GET`` the cache does not serve reaches it as a
    :class:`RelayResponse`. Per request that leaves out FastAPI's routing,
    its middleware stack, Starlette's streaming task group and httpx/httpcore
    (which retried a failing ``import sniffio`` and built socket attribute
    dicts on every pool operation).

Invariants
    * What passes is :mod:`rangeshard.core.relay`'s rules (the external
      endpoint follows the same ones): hop-by-hop headers are dropped both
      ways; protobuf is removed from the ``Accept`` header (the proxy answers
      JSON only); the shard rule of a write is the one it declares.
    * In ``static`` auth mode the client's token stays here: the proxy's own
      credentials are used upstream; in ``delegate`` mode the proxy's own are
      never added.
    * A write is sent upstream at most once (:class:`rangeshard.core.http1client.ClientPool`);
      one whose connection died before the answer is a 503 saying it may
      have been applied. Request bodies are read whole, at most the proxy's
      ``--max-request-body-bytes`` (413 beyond).
    * An answer with a length up to :data:`_WHOLE` is read whole and sent in
      one piece; any other streams, and ends as soon as the client goes away
      or the shutdown begins. The upstream connection is released (back to
      the pool or closed) in every case, synchronously: no cancellation can
      leave it in use.
    * An upstream that cannot pass requests through (an in-memory one) answers
      404 (:meth:`range_filter_proxy.upstream.Upstream.forward`).

Concurrency model
    Coroutines on the proxy's event loop; a streamed answer has one task
    waiting for the client's disconnect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from fastapi import Request, Response

from hashing import ShardBy
from range_filter_proxy.auth import AuthMode
from range_filter_proxy.cache import CacheManager
from range_filter_proxy.errors import ApiError, UpstreamError
from range_filter_proxy.fencing import WriteFence, write_keys
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.resources import ResourceInfo
from range_filter_proxy.rootchain import RootChain
from range_filter_proxy.upstream import Upstream
from rangeshard.core import relay
from rangeshard.core.errors import PeerError
from rangeshard.core.http1client import ClientResponse
from rangeshard.core.kubeapi import (
    Receive,
    RequestTooLarge,
    Scope,
    Send,
    declared_too_large,
    read_body,
    status_object,
)
from rangeshard.core.ownertoken import (
    FENCED_HEADER,
    SHARD_BY_HEADER,
    SHARD_HASH_HEADER,
    SHARD_LABEL_HEADER,
    OwnerToken,
    fenced_status,
    parse_shard_hash,
)
from rangeshard.core.protobuf import ProtobufError, read_write_body
from rangeshard.core.requestinfo import OBJECT_BODY_METHODS, is_write
from rangeshard.core.rest import GVR, parse_rest_path
from rangeshard.core.serving import ShutdownSignal

log = logging.getLogger(__name__)

#: An answer with a length up to this is read whole before it is relayed (one send); longer ones stream.
_WHOLE = 1 << 20
_JSON = [(b"content-type", b"application/json")]


Refusal = tuple[int, bytes, list[tuple[bytes, bytes]]]


def _refusal(code: int, doc: dict[str, Any], *headers: tuple[bytes, bytes]) -> Refusal:
    return code, orjson.dumps(doc), [*_JSON, *headers]


class PassThrough:
    """Forwarding to the upstream, fenced writes (see module docstring)."""

    def __init__(
        self,
        upstream: Upstream,
        manager: CacheManager,
        metrics: ProxyMetrics,
        auth_mode: AuthMode,
        fence: WriteFence | None,
        shutdown: ShutdownSignal,
        max_body_bytes: int = 3 * 1024 * 1024,
    ) -> None:
        self.upstream = upstream
        self.manager = manager
        self.metrics = metrics
        self.auth_mode = auth_mode
        self.fence = fence
        self.shutdown = shutdown
        self.max_body_bytes = max_body_bytes
        #: Relayed answers not closed yet: ``id -> (method, target, opened at)`` (the pool watchdog names them).
        self.open_responses: dict[int, tuple[str, str, float]] = {}

    async def fence_write(
        self, method: str, path: str, headers: Mapping[str, str], raw: bytes, fence: WriteFence
    ) -> Refusal | None:
        """The refusal (status, body, headers) of a fenced write with an owner token, or ``None`` to pass it.

        ``headers`` are keyed by lower case names. The body is read (JSON, a
        YAML apply patch, or protobuf) only to find the object's keys; what
        goes upstream is the body as it came.
        """
        token = OwnerToken.parse(headers.get("user-agent"))
        if token is None:
            return None
        self.metrics.fencing_checks.inc()
        try:
            rule = relay.declared_rule(headers)
        except ValueError as e:
            return _refusal(400, status_object(400, "BadRequest", f"{SHARD_BY_HEADER}: {e}"))
        label: str | None = None
        if rule is ShardBy.LABEL:
            try:
                label = relay.declared_label(headers)
            except ValueError as e:
                return _refusal(400, status_object(400, "BadRequest", f"{SHARD_LABEL_HEADER}: {e}"))
            if label is None:
                message = f"{SHARD_BY_HEADER}: label needs the label key in {SHARD_LABEL_HEADER}"
                return _refusal(400, status_object(400, "BadRequest", message))
        target = parse_rest_path(path)
        body: Any = None
        if method in OBJECT_BODY_METHODS:
            try:
                body = read_write_body(raw, headers.get("content-type"))
            except ProtobufError as e:
                if method == "POST":
                    message = (
                        f"write fencing: cannot read the protobuf body of this create by {token.owner} ({e}), so "
                        "its shard range cannot be checked; send JSON (e.g. the client's content type "
                        "application/json, kube-controller-manager --kube-api-content-type=application/json)"
                    )
                    self.metrics.fenced_writes.labels("UnreadableBody").inc()
                    log.warning("refused %s %s: %s", method, path, message)
                    return _refusal(415, status_object(415, "UnsupportedMediaType", message))
                log.debug("fencing %s %s: unreadable protobuf body (%s): judged by the cache", method, path, e)
        cached: Any = None
        chain: RootChain | None = None
        if target is not None:
            cache = self.manager.caches.get(target.gvr)
            if cache is not None and target.name is not None:
                hit = cache.objects.get((target.namespace or "", target.name))
                cached = hit.obj if hit is not None else None
            if cache is not None:
                chain = cache.chain
        declared = parse_shard_hash(headers.get(SHARD_HASH_HEADER.lower()))
        namespace = target.namespace if target is not None else None
        if chain is not None and rule is ShardBy.ROOT:
            # By the chain as the upstream has it once the registry view is fresh, not as the via caches
            # have it: they may not have applied a re-parenting yet (the old root's owner would pass).
            await fence.fresh_view()
            root_key = await self._fresh_root_keys(chain, (body, cached), namespace)
            keys, verdict = write_keys(rule, declared, body, cached, namespace, root_key, label)
            if verdict is None:
                verdict = fence.decide_now(token, keys)
        else:
            keys, verdict = write_keys(rule, declared, body, cached, namespace, None, label)
            if verdict is None:
                verdict = await fence.check(token, keys)
        if verdict is None:
            return None
        self.metrics.fenced_writes.labels(verdict.reason).inc()
        log.info("fenced %s %s of %s: %s", method, path, token, verdict.why)
        doc = fenced_status(token, verdict.reason, verdict.why)
        return _refusal(409, doc, (FENCED_HEADER.lower().encode(), verdict.reason.encode("latin-1")))

    async def _fresh_root_keys(
        self, chain: RootChain, objects: tuple[Any, ...], namespace: str | None
    ) -> Callable[[Any], int | None]:
        """The ``root`` key of each of ``objects`` (a write's body, its cached object) by the upstream's chain now.

        Each owner is read once per write (a body and its cached object usually share it);
        fencing never guesses: an owner that cannot be read answers 503.
        """
        reads: dict[tuple[GVR, str | None, str], Mapping[str, Any] | None] = {}

        async def read(info: ResourceInfo, ns: str | None, name: str) -> Mapping[str, Any] | None:
            at = (info.gvr, ns, name)
            if at not in reads:
                try:
                    reads[at] = await self.upstream.current_object(info.gvr, ns, name)
                except UpstreamError as e:
                    what = info.gvr.path(ns, name)
                    raise ApiError(
                        503, "ServiceUnavailable", f"write fencing: cannot read the owner {what}: {e}"
                    ) from e
            return reads[at]

        found = [(o, await chain.fresh_key_of_object(o, namespace, read)) for o in objects if o is not None]
        return lambda obj: next((key for o, key in found if o is obj), None)

    def forward(self, _request: Request) -> Response:
        """The answer to a request the app routed here: relayed when it is sent (:class:`RelayResponse`)."""
        return RelayResponse(self)

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass one ASGI request through (or answer the refusal of a fenced write); errors are raised.

        Raises :class:`ApiError` (a bad request, 413), :class:`range_filter_proxy.errors.UpstreamError`
        and :class:`rangeshard.core.kubeapi.ClientGone`; the caller answers them.
        """
        method: str = scope["method"]
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        lower = {k.lower(): v for k, v in headers}
        if declared_too_large(scope["headers"], self.max_body_bytes):
            raise RequestTooLarge(self.max_body_bytes)
        body = await read_body(receive, self.max_body_bytes) if relay.has_body(method, lower) else b""
        path: str = scope["path"]
        if self.fence is not None and is_write(method):
            refused = await self.fence_write(method, path, lower, body, self.fence)
            if refused is not None:
                await send_json(send, *refused)
                return
        self.metrics.passthrough_requests.labels(method).inc()
        # In static mode the client's token means nothing upstream: the proxy's own credentials are used.
        forwarded = relay.request_headers(headers, client_authorization=self.auth_mode is not AuthMode.STATIC)
        target = (scope.get("raw_path") or path.encode()).decode("latin-1")
        query = scope.get("query_string") or b""
        if query:
            target += "?" + query.decode("latin-1")
        answer = await self.upstream.forward(
            method, target, forwarded, body, own_credentials=self.auth_mode is not AuthMode.DELEGATE
        )
        await self._answer(answer, method, target, receive, send)

    async def _answer(self, answer: ClientResponse, method: str, target: str, receive: Receive, send: Send) -> None:
        key = id(answer)
        self.open_responses[key] = (method, target[:200], time.monotonic())
        try:
            headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in relay.response_headers(answer.headers)]
            start = {"type": "http.response.start", "status": answer.status, "headers": headers}
            if answer.complete or (answer.length is not None and answer.length <= _WHOLE):
                body = await answer.read()
                await send(start)
                await send({"type": "http.response.body", "body": body})
                return
            await send(start)
            await self._stream(answer, method, target, receive, send)
        finally:
            self.open_responses.pop(key, None)
            answer.close()

    async def _stream(self, answer: ClientResponse, method: str, target: str, receive: Receive, send: Send) -> None:
        """The body as it comes, until it ends, the client goes away or the shutdown begins."""
        gone = asyncio.ensure_future(_disconnect(receive))

        def left(done: asyncio.Future[None]) -> None:
            if not done.cancelled():  # cancelled: the answer ended first (and its connection may serve another)
                answer.abort()

        gone.add_done_callback(left)
        forget = self.shutdown.on_set(answer.abort)
        try:
            async for pieces in answer.pieces():
                await send({"type": "http.response.body", "body": b"".join(pieces), "more_body": True})
        except PeerError as e:
            if not gone.done() and not self.shutdown.is_set:
                log.warning("the upstream cut its answer to %s %s: %s", method, target.split("?", maxsplit=1)[0], e)
        finally:
            forget()
            gone.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnect(receive: Receive) -> None:
    """Until the client went away (what else ``receive`` returns, such as an unread empty body, is dropped)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class RelayResponse(Response):
    """A response that passes its request through (a collection ``GET`` the cache does not serve).

    What :meth:`PassThrough.serve` raises reaches the app's exception handlers (the response has not started).
    """

    def __init__(self, passthrough: PassThrough) -> None:
        super().__init__()
        self.passthrough = passthrough

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.passthrough.serve(scope, receive, send)


async def send_json(send: Send, code: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """A complete JSON answer (``headers`` beside its type and length)."""
    out = [*(headers or _JSON), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": code, "headers": out})
    await send({"type": "http.response.body", "body": body})
