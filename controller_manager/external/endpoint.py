"""The local endpoint of an external controller: every request relayed to the proxy, cut to the instance's range.

Purpose
    :class:`Endpoint` serves the URL the controller's kubeconfig names and
    relays each request to the range filter proxy over the one HTTP/1.1
    layer (:mod:`rangeshard.core.http1server`, :mod:`rangeshard.core.http1client`), as
    :func:`rangeshard.core.requestinfo.classify` reads it and
    :mod:`rangeshard.core.relay`'s rules forward it; what a list, a watch
    and a write of a ``shard`` resource become is the package's docstring
    (:mod:`controller_manager.external`). ``watch=tRuE`` is the 400 every
    server of ours answers; with ``proxy.tokenFile`` the manager's token
    replaces the controller's ``Authorization``.

Invariants
    * Everything else passes unchanged: method, path and query as sent
      (but a consistent list, which asks for ``resourceVersion=0`` as
      client-go's first list does: :func:`_cached_list`), status, headers,
      body (streamed as it comes).
    * A list of a ``shard`` resource is answered only after its
      resourceVersion was recorded: a watch from it, sent as soon as the
      answer arrives, is fresh.
    * A write reaches the proxy at most once: one the proxy took without
      answering is a 503 Status saying it may have been applied.
    * A watch event longer than :data:`rangeshard.core.http1.MAX_LINE_BYTES`
      (the proxy's limit too) ends the watch with an ``ERROR`` event (a 500
      Status) and a WARNING; a malformed body ends it at once.

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
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode

import orjson

from controller_manager.config import ExternalSection
from controller_manager.external.serving import ServingState, Shard
from controller_manager.external.workload import MainObjects
from controller_manager.freshness import written_version
from controller_manager.handover import rank
from hashing import ShardBy, label_of_path
from rangeshard.core import relay
from rangeshard.core.errors import AnswerLost, LineTooLong, PeerError
from rangeshard.core.http1 import MAX_LINE_BYTES, LineSplitter
from rangeshard.core.http1client import ClientPool, ClientResponse, client_ssl
from rangeshard.core.http1server import Request, Response, Server
from rangeshard.core.kubeapi import ApiError, event_line, expired_status, status_object
from rangeshard.core.loops import start_thread
from rangeshard.core.objpath import dig
from rangeshard.core.ownertoken import FENCED_HEADER
from rangeshard.core.requestinfo import RequestInfo, classify
from rangeshard.core.tokenfile import BearerTokenFile

log = logging.getLogger(__name__)

#: The annotation of the bookmark that ends a streaming list's initial events.
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
#: Matches no object: lists and watches while the instance may serve nothing.
NOTHING = "metadata.name=rangeshard-serves-nothing.invalid"
#: The watch event a reset watch and a stale resume end with (every client library relists on it).
EXPIRED_EVENT = event_line("ERROR", expired_status("rangeshard: the instance's range changed; relist"))
_JSON = [("Content-Type", "application/json")]


class _Watch:
    """One relayed watch of a ``shard`` resource; :meth:`cut` ends it from any thread."""

    __slots__ = ("label", "loop", "reset", "response", "streaming")

    def __init__(self, loop: asyncio.AbstractEventLoop, label: str, streaming: bool) -> None:
        self.loop = loop
        self.label = label
        self.streaming = streaming
        self.reset = False
        self.response: ClientResponse | None = None

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
            ranks={s.resource: rank(s.rule, s.via) for s in section.shard},
            step_seconds=section.handover_step_seconds,
            settle_seconds=section.handover_settle_seconds,
        )
        #: The main resource's objects the controller was served: the instance's workload (rebalance).
        self.main_label = section.main_resource.resource
        self.main = MainObjects(section.main_resource.rule, section.main_resource.label)
        #: The manager's token for the proxy (``proxy.tokenFile``), replacing the controller's own.
        self.token_file = BearerTokenFile(token_file) if token_file is not None else None
        self.upstream = ClientPool(proxy_url, ssl_context=client_ssl(ca_cert))
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
        write_rule = relay.write_rule(self.state.rules, info)
        authorization = self.token_file.authorization() if self.token_file is not None else None
        identity = sharded_read or write_rule is not None  # the relay reads the answer: uncompressed
        headers = relay.request_headers(request.headers, authorization=authorization, identity=identity)
        if sharded_read and rule is not None:
            await self._sharded_read(request, response, info, rule, path, params, headers)
            return
        if write_rule is None or info.resource is None:
            await self._relay(request, response, _cached_list(request, info, path, params), headers)
            return
        written = functools.partial(self.state.wrote, info.resource.label)
        with self.state.write() as token:
            if token is not None:
                label = label_of_path(self.state.paths.get(info.resource.label, ""))
                headers = relay.declare(headers, token, write_rule, label)
            fenced = await self._relay(request, response, request.target, headers, written)
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
        """A list or watch of a ``shard`` resource: cut to the range served now for it.

        A consistent list (no ``resourceVersion``) is asked "not older than"
        the highest resourceVersion the controller was handed of it or that a
        peer (a giver) or this instance wrote of it
        (:mod:`controller_manager.freshness`), which the proxy answers from
        its cache: a relist after a reset costs no upstream read, and is never
        older than what the controller saw or the giver wrote.
        """
        if "shardSelector" in params:
            _status(response, ApiError(400, "BadRequest", "shardSelector is set by rangeshard for this resource"))
            return
        label = info.resource.label if info.resource is not None else ""
        generation = self.state.generation(label)
        streaming = info.is_watch and params.get("sendInitialEvents", "").lower() in ("true", "1", "t")
        rv = params.get("resourceVersion", "")
        if info.is_watch and not streaming and not self.state.fresh(label, rv):
            response.start(200, _JSON, None)  # as kube answers a too old resourceVersion: one ERROR 410 event
            response.write(EXPIRED_EVENT)
            return
        query = list(params.items())
        if rv == "" and "continue" not in params and (streaming or not info.is_watch):
            floor = max(self.state.floor(label), self.state.shard.floor(label))
            query = [(k, v) for k, v in query if k not in ("resourceVersion", "resourceVersionMatch")]
            query.append(("resourceVersion", str(floor)))
            if floor or streaming:
                query.append(("resourceVersionMatch", "NotOlderThan"))
        selector = self.state.served_selector(label)
        if selector is not None:
            query.append(("shardSelector", selector))
        else:
            fields = params.get("fieldSelector")
            query = [(k, v) for k, v in query if k != "fieldSelector"]
            query.append(("fieldSelector", f"{fields},{NOTHING}" if fields else NOTHING))
        target = f"{path}?{urlencode(query)}"
        main = label == self.main_label
        if info.is_watch:
            await self._watch(
                request,
                response,
                target,
                list(headers),
                _Watch(asyncio.get_running_loop(), label, streaming),
                generation,
                main,
            )
        else:
            namespace = info.path.namespace if info.path is not None else None
            await self._list(request, response, target, list(headers), label, generation, (main, namespace))

    async def _send(
        self, request: Request, response: Response, target: str, headers: relay.Headers
    ) -> ClientResponse | None:
        """The proxy's answer to ``request`` sent to ``target``; ``None`` once a Status answered that there is none.

        A write is never sent twice: when the proxy took it and closed the connection without an answer, the
        controller gets a 503 saying it may have been applied (:class:`rangeshard.core.http1client.ClientPool`).
        """
        try:
            return await self.upstream.request(request.method, target, list(headers), request.body)
        except AnswerLost as e:
            message = f"the range filter proxy sent no answer ({e}); the request may have been applied"
            _status(response, ApiError(503, "ServiceUnavailable", message))
        except PeerError as e:
            _status(response, ApiError(503, "ServiceUnavailable", f"the range filter proxy cannot be reached: {e}"))
        except ValueError as e:  # a header with a line break (its value is never echoed)
            _status(response, ApiError(400, "BadRequest", str(e)))
        return None

    async def _relay(
        self,
        request: Request,
        response: Response,
        target: str,
        headers: relay.Headers,
        written: Callable[[int | None], None] | None = None,
    ) -> str | None:
        """Pass the answer on as it comes: status, headers, body (its length kept, else chunked).

        Returns the fencing reason when the proxy fenced the request (its ``409`` with ``X-Rangeshard-Fenced``).
        ``written``: a write of a ``shard`` resource; a successful answer's resourceVersion (the object as
        written; ``None``: a Status, or an answer longer than :data:`MAX_LINE_BYTES`) is handed to it.
        """
        upstream = await self._send(request, response, target, headers)
        if upstream is None:
            return None
        fenced = None
        if upstream.status == 409:
            fenced = next((v for k, v in upstream.headers if k.lower() == FENCED_HEADER.lower()), None)
        kept: list[bytes] | None = [] if written is not None and 200 <= upstream.status < 300 else None
        size = 0
        try:
            response.start(upstream.status, relay.response_headers(upstream.headers, framed=True), upstream.length)
            async for pieces in upstream.pieces():
                for piece in pieces:
                    response.write(piece)
                    if kept is not None and size <= MAX_LINE_BYTES:
                        kept.append(bytes(piece))
                        size += len(piece)
                await response.drain()
        finally:
            upstream.close()
        if written is not None and kept is not None:
            written(written_version(b"".join(kept)) if size <= MAX_LINE_BYTES else None)
        return fenced

    async def _list(
        self,
        request: Request,
        response: Response,
        target: str,
        headers: relay.Headers,
        label: str,
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
            self.state.issued(label, _resource_version(doc, "metadata"), generation)
            if main[0] and generation == self.state.generation(label):
                self.main.listed(doc, main[1])
        response.start(upstream.status, relay.response_headers(upstream.headers, framed=True), len(body))
        response.write(body)

    async def _watch(
        self,
        request: Request,
        response: Response,
        target: str,
        headers: relay.Headers,
        watch: _Watch,
        generation: int,
        main: bool = False,
    ) -> None:
        """A watch of a ``shard`` resource, relayed event by event until it ends or a reset cuts it."""
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
        self, upstream: ClientResponse, response: Response, watch: _Watch, generation: int, main: bool = False
    ) -> None:
        lines = LineSplitter(MAX_LINE_BYTES)
        try:
            async for pieces in upstream.pieces():
                data = lines.block(pieces)
                if not data:
                    continue
                if not self._deliver(watch, generation, data, response, main):
                    break
                await response.drain()
            last = lines.rest()
            if last is not None and not watch.reset:  # the last event, without a line end
                self._deliver(watch, generation, last + b"\n", response, main)
        except LineTooLong as e:
            upstream.abort()
            log.warning("%s: a watch event from the proxy is longer than %d bytes; the watch ends", self.name, e.limit)
            if not watch.reset:
                message = f"rangeshard: a watch event longer than {e.limit} bytes; the watch was ended"
                response.write(event_line("ERROR", status_object(500, "InternalError", message)))
        except PeerError as e:
            if not watch.reset:
                log.debug("%s: upstream watch ended: %s", self.name, e)
        if watch.reset:  # cut: nothing more of the range served before is relayed
            response.write(EXPIRED_EVENT)

    def _deliver(self, watch: _Watch, generation: int, data: bytes, response: Response, main: bool = False) -> bool:
        events = [_decoded(line) for line in data.split(b"\n") if line.strip()]
        versions = [_resource_version(ev, "object", "metadata") for ev in events]
        ended = watch.streaming and any(_initial_events_end(ev) for ev in events)
        delivered = self.state.deliver(watch, generation, versions, functools.partial(response.write, data), ended)
        if delivered and main:
            for ev in events:
                self.main.event(ev)
        return delivered


def _cached_list(request: Request, info: RequestInfo, path: str, params: dict[str, str]) -> str:
    """The target of a relayed request: a consistent list of another resource asks for ``resourceVersion=0``.

    As client-go's first list does: the proxy (or the API server) answers it
    from its cache instead of a quorum read, which a cache cannot prove fresh
    for a quiet resource on a real API server (an upstream LIST: kopf lists
    namespaces and CRDs at every start). Everything else passes as sent.
    """
    if (
        request.method != "GET"
        or not info.collection
        or info.is_watch
        or info.resource is None
        or params.get("resourceVersion")
        or "continue" in params
        or "resourceVersionMatch" in params
    ):
        return request.target
    query = [(k, v) for k, v in params.items() if k != "resourceVersion"]
    return f"{path}?{urlencode([*query, ('resourceVersion', '0')])}"


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


def _initial_events_end(event: Any) -> bool:
    """Whether a decoded watch event is the bookmark that ends a streaming list's initial state."""
    if not isinstance(event, dict) or event.get("type") != "BOOKMARK":
        return False
    return bool(dig(event, ("object", "metadata", "annotations", INITIAL_EVENTS_END)) == "true")


def _resource_version(found: Any, *path: str) -> str:
    """``<path>.resourceVersion`` of a decoded list (path ``metadata``) or watch event (``object, metadata``), or ""."""
    found = dig(found, (*path, "resourceVersion"))
    return found if isinstance(found, str) else ""
