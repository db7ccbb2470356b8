"""The local endpoint of an external controller: every request relayed to the proxy, cut to the instance's range.

Purpose
    :class:`Endpoint` serves the URL the controller's kubeconfig names and
    relays each request to the range filter proxy over its sockets
    (:mod:`controller_manager.external.wire`), as
    :func:`rangeshard.core.requestinfo.classify` reads it and
    :mod:`rangeshard.core.relay`'s rules forward it; what a list, a watch
    and a write of a ``shard`` resource become is the package's docstring
    (:mod:`controller_manager.external`). ``watch=tRuE`` is the 400 every
    server of ours answers; with ``proxy.tokenFile`` the manager's token
    replaces the controller's ``Authorization``.

Invariants
    * Everything else passes unchanged: method, path and query as sent,
      status, headers, body (streamed as it comes).
    * A list of a ``shard`` resource is answered only after its
      resourceVersion was recorded: a watch from it, sent as soon as the
      answer arrives, is fresh.

Concurrency model
    One event loop on the thread ``external-<name>-endpoint``; the socket is
    bound at construction (the URL is known before the child starts). The
    shard instance's callbacks reach :class:`ServingState` from its own
    thread; a cut reaches a relay through ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import threading
from typing import Any
from urllib.parse import parse_qsl, urlencode

import orjson

from controller_manager.config import ExternalSection
from controller_manager.external.serving import ServingState, Shard
from controller_manager.external.wire import Request, Response, Server, UpstreamError, UpstreamPool, UpstreamResponse
from controller_manager.external.workload import MainObjects
from hashing import ShardBy, label_of_path
from rangeshard.core import relay
from rangeshard.core.kubeapi import ApiError, event_line, expired_status
from rangeshard.core.loops import start_thread
from rangeshard.core.objpath import dig
from rangeshard.core.ownertoken import FENCED_HEADER
from rangeshard.core.requestinfo import RequestInfo, classify
from rangeshard.core.tokenfile import BearerTokenFile

log = logging.getLogger(__name__)

#: Matches no object: lists and watches while the instance may serve nothing.
NOTHING = "metadata.name=rangeshard-serves-nothing.invalid"
#: The watch event a reset watch and a stale resume end with (every client library relists on it).
EXPIRED_EVENT = event_line("ERROR", expired_status("rangeshard: the instance's range changed; relist"))
_JSON = [("Content-Type", "application/json")]


class _Watch:
    """One relayed watch of a ``shard`` resource; :meth:`cut` ends it from any thread."""

    __slots__ = ("loop", "reset", "response")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.reset = False
        self.response: UpstreamResponse | None = None

    def cut(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop already ended: nothing is relayed any more
            self.loop.call_soon_threadsafe(self._abort)

    def _abort(self) -> None:
        if self.response is not None:
            self.response.abort()


class Endpoint:
    """The local HTTP endpoint of one external controller (see module docstring)."""

    def __init__(
        self,
        name: str,
        section: ExternalSection,
        shard: Shard,
        *,
        proxy_url: str,
        token_file: str | None = None,
        ca_cert: str | None = None,
    ) -> None:
        self.name = name
        self.state = ServingState(
            name,
            shard,
            {s.resource: s.rule for s in section.shard},
            section.drain_seconds,
            paths={s.resource: s.path for s in section.shard},
        )
        #: The main resource's objects the controller was served: the instance's workload (rebalance).
        self.main_label = section.main_resource.resource
        self.main = MainObjects(section.main_resource.rule, section.main_resource.label)
        #: The manager's token for the proxy (``proxy.tokenFile``), replacing the controller's own.
        self.token_file = BearerTokenFile(token_file) if token_file is not None else None
        self.upstream = UpstreamPool(proxy_url, ca_cert=ca_cert)
        host, _, port = section.listen.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server((host, int(port)), family=family)
        self._server = Server(self.handle, name)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}"

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        self._thread = start_thread(f"external-{self.name}-endpoint", self._run, what=f"external {self.name}: endpoint")
        self._ready.wait(10)
        log.info("%s: endpoint for the external controller on %s", self.name, self.url)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        try:
            await self._server.start(self.socket)
        finally:
            self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            self._server.close()
            self.upstream.close()

    def stop(self) -> None:
        """Cut every watch, close the connections, end the loop (idempotent; also before :meth:`start`)."""
        self.state.reset_watches("the manager is stopping")
        loop, stopping, thread = self._loop, self._stopping, self._thread
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop just ended
                loop.call_soon_threadsafe(stopping.set)
        if thread is not None:
            thread.join(10)
        self.socket.close()

    # -- one request ------------------------------------------------------------------
    async def handle(self, request: Request, response: Response) -> None:
        """Relay one request of the controller (the rules of the module docstring)."""
        path, _, query = request.target.partition("?")
        params = dict(parse_qsl(query, keep_blank_values=True))
        info = classify(request.method, path, params)
        if info.invalid is not None:
            _status(response, info.invalid)
            return
        rule = self.state.rules.get(info.resource.label) if info.resource is not None else None
        sharded_read = rule is not None and request.method == "GET" and info.collection
        authorization = self.token_file.authorization() if self.token_file is not None else None
        headers = relay.request_headers(request.headers, authorization=authorization, identity=sharded_read)
        if sharded_read and rule is not None:
            await self._sharded_read(request, response, info, rule, path, params, headers)
            return
        write_rule = relay.write_rule(self.state.rules, info)
        if write_rule is None:
            await self._relay(request, response, request.target, headers)
            return
        with self.state.write() as token:
            if token is not None:
                label = label_of_path(self.state.paths.get(info.resource.label, "")) if info.resource else None
                headers = relay.declare(headers, token, write_rule, label)
            fenced = await self._relay(request, response, request.target, headers)
        if fenced == "StaleEpoch" and token is not None:
            # The proxy saw a registry change our views folded away (a range that changed and changed back):
            # take a fresh epoch (a reset, then a new token), as an in-process controller does. Without it the
            # child's writes would be fenced with this token until the next range change.
            self.state.shard.write_fenced(token, stale_epoch=True)

    async def _sharded_read(
        self,
        request: Request,
        response: Response,
        info: RequestInfo,
        rule: ShardBy,
        path: str,
        params: dict[str, str],
        headers: relay.Headers,
    ) -> None:
        """A list or watch of a ``shard`` resource: cut to the range served now."""
        if "shardSelector" in params:
            _status(response, ApiError(400, "BadRequest", "shardSelector is set by rangeshard for this resource"))
            return
        generation = self.state.generation()
        if info.is_watch and not self.state.fresh(params.get("resourceVersion", "")):
            response.start(200, _JSON, None)  # as kube answers a too old resourceVersion: one ERROR 410 event
            response.write(EXPIRED_EVENT)
            return
        query = list(params.items())
        selector = self.state.served_selector(
            rule, self.state.paths.get(info.resource.label) if info.resource else None
        )
        if selector is not None:
            query.append(("shardSelector", selector))
        else:
            fields = params.get("fieldSelector")
            query = [(k, v) for k, v in query if k != "fieldSelector"]
            query.append(("fieldSelector", f"{fields},{NOTHING}" if fields else NOTHING))
        target = f"{path}?{urlencode(query)}"
        main = info.resource is not None and info.resource.label == self.main_label
        if info.is_watch:
            await self._watch(request, response, target, list(headers), generation, main)
        else:
            namespace = info.path.namespace if info.path is not None else None
            await self._list(request, response, target, list(headers), generation, (main, namespace))

    async def _send(
        self, request: Request, response: Response, target: str, headers: relay.Headers
    ) -> UpstreamResponse | None:
        """The proxy's answer to ``request`` sent to ``target``; ``None`` once a 503 answered that it is unreachable."""
        try:
            return await self.upstream.request(request.method, target, list(headers), request.body)
        except UpstreamError as e:
            _status(response, ApiError(503, "ServiceUnavailable", f"the range filter proxy cannot be reached: {e}"))
            return None

    async def _relay(self, request: Request, response: Response, target: str, headers: relay.Headers) -> str | None:
        """Pass the answer on as it comes: status, headers, body (its length kept, else chunked).

        Returns the fencing reason when the proxy fenced the request (its ``409`` with ``X-Rangeshard-Fenced``).
        """
        upstream = await self._send(request, response, target, headers)
        if upstream is None:
            return None
        fenced = None
        if upstream.status == 409:
            fenced = next((v for k, v in upstream.headers if k.lower() == FENCED_HEADER.lower()), None)
        try:
            response.start(upstream.status, relay.response_headers(upstream.headers, framed=True), upstream.length)
            async for pieces in upstream.pieces():
                for piece in pieces:
                    response.write(piece)
                await response.drain()
        finally:
            upstream.close()
        return fenced

    async def _list(
        self,
        request: Request,
        response: Response,
        target: str,
        headers: relay.Headers,
        generation: int,
        main: tuple[bool, str | None] = (False, None),
    ) -> None:
        """A list of a ``shard`` resource: its resourceVersion (and, of the main resource, its objects) recorded
        before the answer goes out (``main``: whether it is the main resource, and the list's namespace)."""
        upstream = await self._send(request, response, target, headers)
        if upstream is None:
            return
        try:
            body = await upstream.read()
        finally:
            upstream.close()
        if upstream.status == 200:
            doc = _decoded(body)
            self.state.issued(_resource_version(doc, "metadata"), generation)
            if main[0] and generation == self.state.generation():
                self.main.listed(doc, main[1])
        response.start(upstream.status, relay.response_headers(upstream.headers, framed=True), len(body))
        response.write(body)

    async def _watch(
        self,
        request: Request,
        response: Response,
        target: str,
        headers: relay.Headers,
        generation: int,
        main: bool = False,
    ) -> None:
        """A watch of a ``shard`` resource, relayed event by event until it ends or a reset cuts it."""
        watch = _Watch(asyncio.get_running_loop())
        self.state.register(watch, generation)
        try:
            upstream = await self._send(request, response, target, headers)
            if upstream is None:
                return
            watch.response = upstream
            if watch.reset:  # cut while the request was on its way: the cut found nothing to abort
                upstream.abort()
            try:
                if upstream.status != 200:
                    body = await upstream.read()
                    response.start(upstream.status, relay.response_headers(upstream.headers, framed=True), len(body))
                    response.write(body)
                    return
                response.start(200, relay.response_headers(upstream.headers, framed=True), None)
                await self._events(upstream, response, watch, generation, main)
            finally:
                upstream.close()
        finally:
            self.state.forget(watch)

    async def _events(
        self, upstream: UpstreamResponse, response: Response, watch: _Watch, generation: int, main: bool = False
    ) -> None:
        pending = b""
        try:
            async for pieces in upstream.pieces():
                data = pending + b"".join(pieces)
                end = data.rfind(b"\n") + 1
                pending, data = data[end:], data[:end]
                if not data:
                    continue
                if not self._deliver(watch, generation, data, response, main):
                    break
                await response.drain()
            if pending and not watch.reset:  # the last event, without a line end
                self._deliver(watch, generation, pending + b"\n", response, main)
        except UpstreamError as e:
            if not watch.reset:
                log.debug("%s: upstream watch ended: %s", self.name, e)
        if watch.reset:  # cut: nothing more of the range served before is relayed
            response.write(EXPIRED_EVENT)

    def _deliver(self, watch: _Watch, generation: int, data: bytes, response: Response, main: bool = False) -> bool:
        events = [_decoded(line) for line in data.split(b"\n") if line.strip()]
        versions = [_resource_version(ev, "object", "metadata") for ev in events]
        delivered = self.state.deliver(watch, generation, versions, functools.partial(response.write, data))
        if delivered and main:
            for ev in events:
                self.main.event(ev)
        return delivered


def _status(response: Response, error: ApiError) -> None:
    body = orjson.dumps(error.status())
    response.start(error.code, _JSON, len(body))
    response.write(body)


def _decoded(data: bytes) -> Any:
    """A JSON list or watch event, decoded once (``None`` when it is not JSON)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _resource_version(found: Any, *path: str) -> str:
    """``<path>.resourceVersion`` of a decoded list (path ``metadata``) or watch event (``object, metadata``), or ""."""
    found = dig(found, (*path, "resourceVersion"))
    return found if isinstance(found, str) else ""
