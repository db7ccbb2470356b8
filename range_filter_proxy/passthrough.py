"""Passing every request the cache does not serve through to the upstream, with write fencing.

Purpose
    :class:`PassThrough` forwards a request upstream unchanged (status,
    headers, streaming body, the client's ``Authorization``) and relays the
    answer as a stream. With write fencing on, a write carrying an owner token
    is forwarded only if :class:`range_filter_proxy.fencing.WriteFence` lets
    it pass; else ``409`` (``fenced_status``), counted in
    ``range_filter_proxy_fenced_writes_total{reason}``. Writes without a token
    pass unchanged.

Invariants
    * What passes is :mod:`rangeshard.core.relay`'s rules (the external
      endpoint follows the same ones): hop-by-hop headers are dropped both
      ways; protobuf is removed from the ``Accept`` header (the proxy answers
      JSON only); the shard rule of a write is the one it declares.
    * In ``static`` auth mode the client's token stays here: the proxy's own
      credentials are used upstream; in ``delegate`` mode the proxy's own are
      never added.
    * An upstream that cannot pass requests through (an in-memory one) answers
      404 (:meth:`range_filter_proxy.upstream.Upstream.forward`).
    * A relayed stream ends as soon as the shutdown begins.

Concurrency model
    Coroutines on the proxy's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import Request, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from hashing import ShardBy
from range_filter_proxy.auth import AuthMode
from range_filter_proxy.cache import CacheManager
from range_filter_proxy.errors import UpstreamError
from range_filter_proxy.fencing import WriteFence, write_keys
from range_filter_proxy.listing import json_response
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.upstream import Upstream
from rangeshard.core import relay
from rangeshard.core.kubeapi import RequestTooLarge, status_object
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
from rangeshard.core.rest import parse_rest_path
from rangeshard.core.serving import ShutdownSignal, retrieve_outcome, until_shutdown

log = logging.getLogger(__name__)


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
    ) -> None:
        self.upstream = upstream
        self.manager = manager
        self.metrics = metrics
        self.auth_mode = auth_mode
        self.fence = fence
        self.shutdown = shutdown
        #: Relayed answers not closed yet: ``id -> (method, target, opened at)`` (the pool watchdog names them).
        self.open_responses: dict[int, tuple[str, str, float]] = {}

    async def fence_write(self, request: Request, fence: WriteFence) -> Response | None:
        """The 409 of a fenced write with an owner token, or ``None`` to pass it through.

        The body is read (JSON, a YAML apply patch, or protobuf) only to find
        the object's keys; what goes upstream is the body as it came.
        """
        token = OwnerToken.parse(request.headers.get("user-agent"))
        if token is None:
            return None
        self.metrics.fencing_checks.inc()
        try:
            rule = relay.declared_rule(request.headers)
        except ValueError as e:
            return json_response(400, status_object(400, "BadRequest", f"{SHARD_BY_HEADER}: {e}"))
        label: str | None = None
        if rule is ShardBy.LABEL:
            try:
                label = relay.declared_label(request.headers)
            except ValueError as e:
                return json_response(400, status_object(400, "BadRequest", f"{SHARD_LABEL_HEADER}: {e}"))
            if label is None:
                message = f"{SHARD_BY_HEADER}: label needs the label key in {SHARD_LABEL_HEADER}"
                return json_response(400, status_object(400, "BadRequest", message))
        target = parse_rest_path(request.url.path)
        body: Any = None
        if request.method in OBJECT_BODY_METHODS:
            raw = await request.body()  # kept by Starlette: request.stream() replays it upstream
            try:
                body = read_write_body(raw, request.headers.get("content-type"))
            except ProtobufError as e:
                if request.method == "POST":
                    message = (
                        f"write fencing: cannot read the protobuf body of this create by {token.owner} ({e}), so "
                        "its shard range cannot be checked; send JSON (e.g. the client's content type "
                        "application/json, kube-controller-manager --kube-api-content-type=application/json)"
                    )
                    self.metrics.fenced_writes.labels("UnreadableBody").inc()
                    log.warning("refused %s %s: %s", request.method, request.url.path, message)
                    return json_response(415, status_object(415, "UnsupportedMediaType", message))
                log.debug(
                    "fencing %s %s: unreadable protobuf body (%s): judged by the cache",
                    request.method,
                    request.url.path,
                    e,
                )
        cached: Any = None
        root_key = None
        if target is not None:
            cache = self.manager.caches.get(target.gvr)
            if cache is not None and target.name is not None:
                hit = cache.objects.get((target.namespace or "", target.name))
                cached = hit.obj if hit is not None else None
            if cache is not None and cache.chain is not None:
                root_key = cache.chain.key_of_object
        declared = parse_shard_hash(request.headers.get(SHARD_HASH_HEADER))
        namespace = target.namespace if target is not None else None
        keys, verdict = write_keys(rule, declared, body, cached, namespace, root_key, label)
        if verdict is None:
            verdict = await fence.check(token, keys)
        if verdict is None:
            return None
        self.metrics.fenced_writes.labels(verdict.reason).inc()
        log.info("fenced %s %s of %s: %s", request.method, request.url.path, token, verdict.why)
        response = json_response(409, fenced_status(token, verdict.reason, verdict.why))
        response.headers[FENCED_HEADER] = verdict.reason
        return response

    async def forward(self, request: Request) -> Response:
        """The upstream's answer to ``request``, relayed as a stream (or the 409 of a fenced write)."""
        if self.fence is not None and is_write(request.method):
            fenced = await self.fence_write(request, self.fence)
            if fenced is not None:
                return fenced
        self.metrics.passthrough_requests.labels(request.method).inc()
        # In static mode the client's token means nothing upstream: the proxy's own credentials are used.
        headers = relay.request_headers(
            request.headers.items(), client_authorization=self.auth_mode is not AuthMode.STATIC
        )
        raw_path = request.scope.get("raw_path") or request.url.path.encode()
        target = raw_path.decode("latin-1")
        query = request.scope.get("query_string") or b""
        if query:
            target += "?" + query.decode("latin-1")
        body: AsyncIterator[bytes] | None = (
            request.stream() if relay.has_body(request.method, request.headers) else None
        )
        try:
            resp = await self.upstream.forward(
                request.method, target, headers, body, own_credentials=self.auth_mode is not AuthMode.DELEGATE
            )
        except UpstreamError as e:
            too_large = e.__cause__
            while too_large is not None and not isinstance(too_large, RequestTooLarge):
                too_large = too_large.__cause__ or too_large.__context__
            if isinstance(too_large, RequestTooLarge):
                raise too_large from e
            raise
        out_headers = dict(relay.response_headers(resp.headers.multi_items()))
        open_id = id(resp)
        self.open_responses[open_id] = (request.method, target[:200], time.monotonic())

        async def close() -> None:
            # Shielded: a cancellation arriving while httpcore closes the response (the client went away
            # just as the body ended) would leave its pooled connection ACTIVE forever; after 200 of those
            # the pool is full and every upstream request waits (issue 25's loaded runs).
            self.open_responses.pop(open_id, None)
            closing = asyncio.ensure_future(resp.aclose())
            closing.add_done_callback(retrieve_outcome)
            await asyncio.shield(closing)

        async def relayed() -> AsyncIterator[bytes]:
            # The raw stream, not ``resp.aiter_raw()``: that one closes the answer itself when the body
            # ends, where a cancellation could cut the close short; ``close`` shields it.
            stream = resp.stream
            try:
                if not isinstance(stream, httpx.AsyncByteStream):
                    raise TypeError(f"an upstream answer without an async body: {type(stream).__name__}")
                async for chunk in stream:
                    yield chunk
            finally:
                await close()

        return StreamingResponse(
            until_shutdown(relayed(), self.shutdown),
            status_code=resp.status_code,
            headers=out_headers,
            background=BackgroundTask(close),
        )
