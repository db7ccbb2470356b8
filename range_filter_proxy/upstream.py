"""The upstream API server, seen through an interface of our own.

Purpose
    :class:`Upstream` is everything the proxy needs from an API server, one
    explicit interface: what the shared watch cache needs (discovery, a
    list, a watch stream and the current resourceVersion) and the optional
    capabilities with their defaults (pass-through, delegated reviews).
    :class:`HttpUpstream` implements all of it with one ``httpx.AsyncClient`` against
    a real kube-apiserver or the local API server, except the watch body,
    which :mod:`range_filter_proxy.watchstream` reads (an asyncio protocol
    parsing with httptools: a fraction of httpx's CPU per read); tests may
    implement the protocol in memory. :func:`load_upstream_config` reuses the ``kubernetes``
    package's kubeconfig / in-cluster loading for the base URL, TLS material
    and credentials.

Invariants
    * A watch that the upstream ends with 410 (HTTP status or an ``ERROR``
      event whose Status has code 410) raises :class:`UpstreamGone`; any other
      failure raises :class:`UpstreamError` / :class:`UpstreamUnavailable`.
      httpx errors never escape this module untranslated.
    * Watches always ask for bookmarks and carry ``timeoutSeconds``, so a dead
      TCP connection cannot hang a cache forever.
    * Pass-through forwards the client's ``Authorization`` header unchanged;
      only when the client sent none (and the caller allows it: not in
      ``delegate`` auth mode) are the proxy's own credentials used.
    * Credentials and tokens never appear in log lines or error messages.

Concurrency model
    One ``HttpUpstream`` per proxy, shared by every task of the event loop
    (httpx's client is safe for concurrent use within one loop). Credentials
    come from a kubernetes ``Configuration`` whose refresh hook is called
    synchronously per request (cheap: it only re-reads when a token expires).
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import httpx
import orjson

from range_filter_proxy.errors import ApiError, UpstreamError, UpstreamGone, UpstreamUnavailable, bad_request
from range_filter_proxy.resources import ResourceInfo, parse_resource_list
from range_filter_proxy.watchstream import (
    MAX_WATCH_LINE_BYTES,
    WatchEvent,
    WatchStream,
    decode_watch_line,
    open_watch,
)
from rangeshard.core.errors import AnswerLost, ConfigError, PeerError
from rangeshard.core.http1client import ClientPool, ClientResponse, client_ssl
from rangeshard.core.kubeapi import read_status, status_message
from rangeshard.core.rest import GVR, group_version_path
from rangeshard.core.settings import check_api_url

log = logging.getLogger(__name__)

#: Server-side timeout asked for on upstream watches; the cache re-watches from its last RV.
UPSTREAM_WATCH_TIMEOUT_S = 300


@dataclass(slots=True)
class ListResult:
    """A list response: its items (decoded), the list's resourceVersion and continue token.

    ``shard_info`` is the list's ``metadata.shardInfo`` when the upstream sent
    one: a KEP-5866 server (``ShardedListAndWatch``) answers a list with a
    ``shardSelector`` with it; anything else leaves it ``None``.
    """

    items: list[dict[str, Any]]
    resource_version: str
    continue_token: str | None = None
    shard_info: dict[str, Any] | None = None


class Upstream:
    """The upstream as the proxy uses it: one explicit interface of every capability.

    Every upstream implements the five methods the watch cache needs
    (``discover``, ``preferred_version``, ``list``, ``watch``,
    ``current_resource_version``); tests and benches implement them in
    memory. The rest has a default here, and an upstream that can do more
    says so by overriding it:

    * ``watch_apply`` - a watch whose events are applied as they are read
      (default: iterate ``watch``);
    * ``forward`` - pass an arbitrary request through (default: 404, nothing
      is passed through);
    * ``post_json`` - TokenReview / SubjectAccessReview for ``--auth-mode
      delegate`` (``reviews``; default: none);
    * ``aclose`` - release connections (default: nothing to release);
    * ``pool_state``, ``pool_detail``, ``unanswered`` - the connection pool
      and the requests in it, for the proxy's pool watchdog (default: none).
    """

    #: True if :meth:`post_json` sends delegated reviews.
    reviews: bool = False

    async def discover(self, group: str, version: str) -> dict[str, ResourceInfo]:
        """The resources of one group/version (raises :class:`UpstreamError`)."""
        raise NotImplementedError

    async def preferred_version(self, group: str) -> str:
        """The preferred version of an API group (``v1`` for the core group)."""
        raise NotImplementedError

    async def list(self, gvr: GVR, params: Mapping[str, str] | None = None) -> ListResult:
        """List a whole collection (``params`` are extra query parameters)."""
        raise NotImplementedError

    def watch(self, gvr: GVR, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Watch a collection after ``resource_version`` (raises :class:`UpstreamGone` on 410)."""
        raise NotImplementedError

    async def current_resource_version(self, gvr: GVR) -> str:
        """The upstream's current resourceVersion, as a consistent (quorum) read would see it."""
        raise NotImplementedError

    async def current_object(self, gvr: GVR, namespace: str | None, name: str) -> dict[str, Any] | None:
        """One object as the upstream has it now (a consistent read); ``None`` when it does not exist.

        A list of that name (``fieldSelector=metadata.name=``), not a get: the proxy's own
        identity may only list and watch (``rangeshard deploy rbac``).
        """
        raise ApiError(404, "NotFound", f"the proxy cannot read {gvr.path(namespace, name)} from its upstream")

    async def watch_apply(self, gvr: GVR, resource_version: str, apply: Callable[[WatchEvent], None]) -> int:
        """Watch, calling ``apply`` for every event; the number of events once the watch ends."""
        count = 0
        async for event in self.watch(gvr, resource_version):
            count += 1
            apply(event)
        return count

    async def forward(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        *,
        own_credentials: bool = True,
    ) -> ClientResponse:
        """Send ``method target`` (raw path and query) upstream; the answer, its body as it comes (caller closes it)."""
        raise ApiError(404, "NotFound", f"the proxy cannot pass {method} {target.split('?', 1)[0]} through")

    async def post_json(self, path: str, doc: dict[str, Any]) -> Any:
        """POST ``doc`` with the proxy's own credentials; the decoded answer (2xx) or :class:`UpstreamError`."""
        raise UpstreamError(f"POST {path}: this upstream sends no reviews", 501)

    async def aclose(self) -> None:
        """Release what the upstream holds (connections)."""

    def pool_state(self) -> tuple[int, int, int] | None:
        """``(connections, idle connections, requests waiting for one)``, or ``None`` without a pool."""
        return None

    def pool_detail(self) -> str:
        """The pool's connections by state, for the pool watchdog's warning (empty without a pool)."""
        return ""

    def unanswered(self) -> Sequence[tuple[str, float]]:
        """Requests sent and not answered yet (their headers), oldest first: ``(what, sent at)``."""
        return []


@dataclass(slots=True)
class UpstreamConfig:
    """Where the upstream is and how to authenticate to it."""

    base_url: str
    verify: ssl.SSLContext | bool = True
    auth: Callable[[], str | None] = field(default=lambda: None)

    def authorization(self) -> str | None:
        """The proxy's own ``Authorization`` header value, if it has credentials."""
        return self.auth()


def _config_from_kubernetes(cfg: Any) -> UpstreamConfig:
    """Translate a ``kubernetes.client.Configuration`` into an :class:`UpstreamConfig`."""
    host = str(cfg.host).rstrip("/")
    verify: ssl.SSLContext | bool = True
    if host.startswith("https"):
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        if not cfg.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        verify = ctx

    def auth() -> str | None:
        token = cfg.get_api_key_with_prefix("authorization") or cfg.get_api_key_with_prefix("BearerToken")
        if token:
            return str(token)
        if cfg.username and cfg.password:
            return str(cfg.get_basic_auth_token())
        return None

    return UpstreamConfig(host, verify, auth)


def load_upstream_config(
    upstream: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    in_cluster: bool = False,
    upstream_ca: str | None = None,
) -> UpstreamConfig:
    """Build the upstream configuration from exactly one of URL, kubeconfig or in-cluster config.

    ``upstream_ca`` (``--upstream-ca``) is a PEM CA bundle that verifies an
    ``https://`` ``--upstream`` (kubeconfig and in-cluster configs carry their own).
    """
    chosen = sum([upstream is not None, kubeconfig is not None, in_cluster])
    if chosen != 1:
        raise ConfigError("give exactly one of --upstream URL, --kubeconfig FILE or --in-cluster")
    if upstream_ca is not None and (upstream is None or not upstream.startswith("https://")):
        raise ConfigError("--upstream-ca goes with an https:// --upstream URL")
    if upstream is not None:
        try:
            url = check_api_url(upstream)  # the one grammar: no credentials, query or fragment
        except ValueError as e:
            raise ConfigError(f"--upstream: {e}") from None
        verify: ssl.SSLContext | bool = True
        if upstream_ca is not None:
            try:
                verify = ssl.create_default_context(cafile=upstream_ca)
            except (OSError, ssl.SSLError) as e:
                raise ConfigError(f"--upstream-ca {upstream_ca}: {e}") from e
        return UpstreamConfig(url, verify)
    from kubernetes import client as k8s_client  # noqa: PLC0415  (slow import, only when needed)
    from kubernetes import config as k8s_config  # noqa: PLC0415

    cfg = k8s_client.Configuration()
    try:
        if in_cluster:
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=cfg
            )
    except (k8s_config.ConfigException, OSError, ValueError) as e:
        raise ConfigError(f"cannot load the upstream configuration: {e}") from e
    return _config_from_kubernetes(cfg)


def _status_error(code: int, body: bytes, what: str) -> UpstreamError:
    """The error of an answer with HTTP ``code``: its ``Status`` message if it sent one; 410: :class:`UpstreamGone`."""
    status = read_status(body)
    message = status_message(status, f"{what}: HTTP {code}")
    return UpstreamGone(message, status) if code == 410 else UpstreamError(message, code, status)


class HttpUpstream(Upstream):
    """:class:`Upstream` over HTTP, with every capability: raw pass-through and delegated reviews."""

    reviews = True

    def __init__(self, config: UpstreamConfig, *, max_connections: int = 200) -> None:
        self.config = config
        self.client = httpx.AsyncClient(
            base_url=config.base_url,
            verify=config.verify,
            timeout=httpx.Timeout(30.0, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=50),
            follow_redirects=False,
        )
        #: The pass-through's keep-alive connections (:mod:`rangeshard.core.http1client`): writes and uncached reads.
        self.pool = ClientPool(
            config.base_url,
            ssl_context=client_ssl(config.verify),
            connect_timeout=10.0,
            max_idle=50,
            max_connections=max_connections,
        )
        #: Requests sent and not answered yet (their headers): ``id -> (what, sent at)`` (the pool watchdog).
        self.in_flight: dict[int, tuple[str, float]] = {}

    async def aclose(self) -> None:
        """Close every pooled connection."""
        self.pool.close()
        await self.client.aclose()

    @contextlib.contextmanager
    def _sent(self, what: str) -> Iterator[None]:
        """Count ``what`` among the requests sent and not answered yet while the block runs."""
        key = object()
        self.in_flight[id(key)] = (what, time.monotonic())
        try:
            yield
        finally:
            self.in_flight.pop(id(key), None)

    def pool_state(self) -> tuple[int, int, int]:
        """``(connections, idle connections, requests waiting for one)`` of the pass-through pool (diagnostics)."""
        return self.pool.state()

    def unanswered(self) -> Sequence[tuple[str, float]]:
        return sorted(self.in_flight.values(), key=lambda r: r[1])

    def pool_detail(self) -> str:
        """The pass-through pool's connections in use and idle, for the watchdog."""
        connections, idle, _ = self.pool.state()
        return f"{connections - idle} in use, at most {self.pool.max_connections}"

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        auth = self.config.authorization()
        if auth:
            headers["Authorization"] = auth
        return headers

    async def _get_json(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        try:
            with self._sent(f"GET {path}"):
                resp = await self.client.get(path, params=dict(params or {}), headers=self._headers())
        except httpx.HTTPError as e:
            raise UpstreamUnavailable(f"GET {path}: {e!r}") from e
        if resp.status_code != 200:
            raise _status_error(resp.status_code, resp.content, f"GET {path}")
        try:
            return orjson.loads(resp.content)
        except orjson.JSONDecodeError as e:
            raise UpstreamError(f"GET {path}: response is not JSON: {e}") from e

    async def post_json(self, path: str, doc: dict[str, Any]) -> Any:
        """POST ``doc`` with the proxy's own credentials; the decoded answer (2xx) or :class:`UpstreamError`.

        Used for TokenReview / SubjectAccessReview: the body may hold a token,
        so neither it nor the answer is ever put in an error message.
        """
        headers = self._headers()
        headers["Content-Type"] = "application/json"
        try:
            resp = await self.client.post(path, content=orjson.dumps(doc), headers=headers)
        except httpx.HTTPError as e:
            raise UpstreamUnavailable(f"POST {path}: {type(e).__name__}") from e
        if not 200 <= resp.status_code < 300:
            raise _status_error(resp.status_code, resp.content, f"POST {path}")
        try:
            return orjson.loads(resp.content)
        except orjson.JSONDecodeError as e:
            raise UpstreamError(f"POST {path}: response is not JSON") from e

    async def discover(self, group: str, version: str) -> dict[str, ResourceInfo]:
        path = group_version_path(group, version)
        doc = await self._get_json(path)
        if not isinstance(doc, dict):
            raise UpstreamError(f"GET {path}: not an APIResourceList")
        return parse_resource_list(group, version, doc)

    async def preferred_version(self, group: str) -> str:
        if not group:
            return "v1"
        doc = await self._get_json(f"/apis/{group}")
        preferred = doc.get("preferredVersion") if isinstance(doc, dict) else None
        version = preferred.get("version") if isinstance(preferred, dict) else None
        if not isinstance(version, str):
            raise UpstreamError(f"API group {group!r} has no preferred version")
        return version

    async def list(self, gvr: GVR, params: Mapping[str, str] | None = None) -> ListResult:
        doc = await self._get_json(gvr.path(), params)
        if not isinstance(doc, dict):
            raise UpstreamError(f"list {gvr}: not a list object")
        items = doc.get("items") or []
        meta = doc.get("metadata") or {}
        rv, cont, shard_info = meta.get("resourceVersion"), meta.get("continue"), meta.get("shardInfo")
        if not isinstance(items, list) or not isinstance(rv, str):
            raise UpstreamError(f"list {gvr}: no items or no metadata.resourceVersion")
        return ListResult(
            [i for i in items if isinstance(i, dict)],
            rv,
            cont if isinstance(cont, str) and cont else None,
            shard_info if isinstance(shard_info, dict) else None,
        )

    async def current_resource_version(self, gvr: GVR) -> str:
        return (await self.list(gvr, {"limit": "1"})).resource_version

    async def current_object(self, gvr: GVR, namespace: str | None, name: str) -> dict[str, Any] | None:
        # Over the pass-through pool (the fence asks on every root write): a fraction of httpx's CPU.
        path = gvr.path(namespace)
        target = f"{path}?{urlencode({'fieldSelector': f'metadata.name={name}'})}"
        answer = await self.forward("GET", target, [("Accept", "application/json")], b"")
        try:
            body = await answer.read()
        except PeerError as e:
            raise UpstreamUnavailable(f"GET {path}: {e}") from e
        finally:
            answer.close()
        if answer.status != 200:
            raise _status_error(answer.status, body, f"GET {path}")
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise UpstreamError(f"GET {path}: response is not JSON: {e}") from e
        items = doc.get("items") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise UpstreamError(f"list {path} of {name!r}: not a list object")
        return next((i for i in items if isinstance(i, dict)), None)

    async def watch(self, gvr: GVR, resource_version: str) -> AsyncIterator[WatchEvent]:
        stream = await self._open_watch(gvr, resource_version)
        try:
            async for lines in stream.batches():
                for line in lines:
                    yield decode_watch_line(line, stream.what)
        finally:
            stream.close()

    async def _open_watch(self, gvr: GVR, resource_version: str) -> WatchStream:
        """Open a watch stream (status 200; 410 raises :class:`UpstreamGone`, others :class:`UpstreamError`).

        The body is read by :mod:`range_filter_proxy.watchstream` (asyncio
        protocol + httptools), not httpx. The caller closes the stream.
        """
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(UPSTREAM_WATCH_TIMEOUT_S),
        }
        what = f"watch {gvr}"
        stream = await open_watch(
            self.config.base_url,
            gvr.path(),
            params,
            list(self._headers().items()),
            verify=self.config.verify,
            what=what,
            connect_timeout=10.0,
            read_timeout=UPSTREAM_WATCH_TIMEOUT_S + 30.0,
            max_line=MAX_WATCH_LINE_BYTES,
        )
        if stream.status != 200:
            try:
                body = await stream.read_body()
            finally:
                stream.close()
            raise _status_error(stream.status, body, what)
        return stream

    async def watch_apply(self, gvr: GVR, resource_version: str, apply: Callable[[WatchEvent], None]) -> int:
        """Watch, calling ``apply`` for every event as its read arrives; the number of lines once the watch ends.

        ``apply`` runs inside the socket's read callback (no task switch per
        read), so it must be synchronous; what it raises ends the watch and is
        raised here, as are decoding errors (:class:`UpstreamGone` on 410).
        """
        stream = await self._open_watch(gvr, resource_version)
        what = stream.what
        decode = decode_watch_line
        count = 0

        def sink(lines: list[bytes]) -> None:
            nonlocal count
            count += len(lines)  # only tells "no event at all" from "some" (the cache's quick-end check)
            for line in lines:
                apply(decode(line, what))

        try:
            await stream.feed(sink)
        finally:
            stream.close()
        return count

    async def forward(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        *,
        own_credentials: bool = True,
    ) -> ClientResponse:
        """Send ``method target`` (raw path and query) upstream over the pass-through pool; the answer (caller
        closes it). A write is sent at most once: no answer is :class:`UpstreamUnavailable` saying it may have
        been applied.

        Without an ``Authorization`` header in ``headers`` the proxy's own
        credentials are added, unless ``own_credentials`` is false.
        """
        out_headers: list[tuple[str, str]] = [*headers]
        if own_credentials and not any(k.lower() == "authorization" for k, _ in out_headers):
            auth = self.config.authorization()
            if auth:
                out_headers.append(("Authorization", auth))
        key = object()
        self.in_flight[id(key)] = (f"{method} {target[:200]}", time.monotonic())
        try:
            return await self.pool.request(method, target, out_headers, body)
        except ValueError as e:  # a header with a line break: never sent, its value never echoed
            raise bad_request(f"invalid request to pass through: {e}") from None
        except AnswerLost as e:
            path = target.split("?", 1)[0]
            raise UpstreamUnavailable(f"{method} {path}: no answer ({e}); the request may have been applied") from e
        except PeerError as e:
            raise UpstreamUnavailable(f"{method} {target.split('?', 1)[0]}: {e}") from e
        finally:
            del self.in_flight[id(key)]
