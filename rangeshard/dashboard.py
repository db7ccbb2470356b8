"""``rangeshard dashboard``: a live view of the hash ring of every controller type, in a browser.

Purpose
    Serves one self-contained page (``rangeshard/static/dashboard.html``,
    package data: HTML, CSS and JavaScript inline, no CDN, no build step,
    works offline) that draws, for each controller type, the
    63-bit hash space as a horizontal bar split into the instances' ranges:
    widths proportional to each range's share of the space, colour by handover
    state (``init``/``locked``/``wait``/``active``), a lock marker on locked
    instances, and each instance's ``workloadNum`` and id inside its segment.
    A table below each bar lists the details, with each instance's *progress*
    as the range filter proxy measures it (``--proxy URL``, by default the
    proxy of a ``rangeshard up`` in ``--state-dir``): a stuck instance (its
    oldest unanswered change is older than its ``stuckAfterSeconds``) is
    marked STUCK with its count in its segment. Endpoints:

    * ``GET /`` the page;
    * ``GET /api/ring`` the current view as JSON (:func:`ring_payload`);
    * ``GET /api/events`` server-sent events: one ``ring`` event with the
      full view on connect and after every registry change, a comment line as
      keep-alive every :data:`KEEPALIVE_SECONDS`;
    * ``GET /healthz`` (always ok) and ``GET /readyz`` (200 once the first
      registry view arrived from etcd, 503 before).

Invariants
    * Read-only: the dashboard never writes to etcd.
    * Every view shown is one :class:`~registry.RegistryView`, i.e. etcd at
      exactly one revision; ranges are derived exactly as the controllers
      derive them (:class:`~registry.Snapshot`).
    * Hash keys and range bounds are exact integers in ``/api/ring``; since
      JavaScript numbers cannot hold 63-bit integers, every bound is also
      given as a ``0x…`` hex string, which is what the page displays.
    * A slow or stalled browser never blocks anything: subscribers are only
      woken (an :class:`asyncio.Event` each) and read the latest payload when
      they are ready; intermediate views may be coalesced, the last one is
      always delivered.
    * The page keeps showing the last known ring while etcd is unreachable and
      says so (``etcd: unreachable``).

Concurrency model
    uvicorn owns the event loop. A :class:`~registry.MembershipWatch` thread
    (``membership-watch-dashboard``) turns each registry change into a payload
    and hands it to the loop with ``call_soon_threadsafe``; the
    :class:`RingHub` lives on the loop only. A second named thread
    (``dashboard-etcd-probe``, :class:`EtcdProbe`) reads etcd's revision every
    second to report reachability the same way; with a proxy, a third
    (``dashboard-progress``, :class:`ProgressPoller`) reads the proxy's
    metrics every :data:`PROGRESS_POLL_SECONDS`. They are started in the app's
    lifespan and stopped at shutdown; on SIGINT/SIGTERM the hub is closed first so open
    event streams end and uvicorn can shut down promptly.

Dependency direction
    Part of the CLI layer: it may import ``registry`` (and ``rangeshard.cli``);
    nothing below the CLI imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from importlib import resources
from typing import Annotated, Any

import anyio.to_thread
import orjson
import typer
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, PlainTextResponse, Response, StreamingResponse

from hashing import MAX_HASH
from rangeshard.cli.common import (
    EtcdOptions,
    KubeconfigOpt,
    ProxyOpt,
    ProxyTokenFileOpt,
    fail,
    with_etcd_options,
)
from rangeshard.cli.progress import Progress, ProgressUnavailable, ProxyAccess, describe, fetch
from rangeshard.cli.state import find_proxy
from rangeshard.core import serving
from rangeshard.core.errors import ConfigError, RangeshardError
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.loops import join_thread, start_thread
from rangeshard.core.process import free_port
from rangeshard.core.serving import ShutdownSignal
from registry import DEFAULT_PREFIX, MembershipWatch, Registry, RegistryView
from registry.models import check_name

log = logging.getLogger(__name__)


@functools.cache
def page() -> str:
    """The dashboard page: ``rangeshard/static/dashboard.html`` (package data; HTML, CSS and JS, no CDN)."""
    return resources.files("rangeshard").joinpath("static/dashboard.html").read_text(encoding="utf-8")


KEEPALIVE_SECONDS = 15.0
"""Seconds between SSE keep-alive comments on a quiet stream."""

WATCH_PROBE_SECONDS = 1.0
"""Liveness probe interval of the membership watch: bounds shutdown time and how soon an outage shows."""

STATUS_POLL_SECONDS = 1.0
"""How often the etcd probe checks that etcd answers."""

PROGRESS_POLL_SECONDS = 2.0
"""How often the progress poller reads the proxy's metrics."""

_SPACE = MAX_HASH + 1  # number of keys in the hash space


# -- the view as JSON ----------------------------------------------------------


def ring_payload(
    view: RegistryView | None,
    *,
    prefix: str,
    etcd: str,
    received_at: float | None = None,
    progress: dict[tuple[str, str], Progress] | None = None,
    progress_error: str | None = None,
) -> dict[str, Any]:
    """The JSON document of ``/api/ring`` and of every ``ring`` event.

    ``etcd`` is ``connecting`` (no view yet), ``ok`` or ``unreachable``. Each
    controller type lists ``instances`` (members owning a range, in hash
    order) and ``unowned`` (records repeating another's key, which own
    nothing; only possible by hand). ``share`` is the fraction of the whole
    hash space, ``0..1``. Each instance's ``progress`` is what the proxy
    measured (``null``: unknown) and ``progressText`` its one-line summary;
    ``progressError`` says why progress is unknown.
    """
    types: list[dict[str, Any]] = []
    if view is not None:
        for ctype, snap in sorted(view.snapshots.items()):
            instances: list[dict[str, Any]] = []
            unowned: list[dict[str, Any]] = []
            for m in snap.members:
                rec = m.record
                item: dict[str, Any] = {
                    **m.summary(),
                    "hashKeyHex": f"0x{rec.hash_key:016x}",
                    "rangeStartHex": f"0x{m.range.lo:016x}" if m.range else None,
                    "rangeEndHex": f"0x{m.range.hi:016x}" if m.range else None,
                    "share": (m.range.hi - m.range.lo + 1) / _SPACE if m.range else 0.0,
                    "startedAt": rec.started_at,
                    "heartbeatAt": rec.heartbeat_at,
                }
                measured = progress.get((ctype, rec.instance_id)) if progress is not None else None
                item["progress"] = measured.to_json() if measured is not None else None
                item["progressText"] = describe(measured)
                (instances if m.range is not None else unowned).append(item)
            types.append(
                {
                    "controllerType": ctype,
                    "instances": instances,
                    "unowned": unowned,
                    "workloadNum": sum(i["workloadNum"] for i in instances + unowned),
                }
            )
    return {
        "synced": view is not None,
        "revision": view.revision if view is not None else 0,
        "receivedAt": received_at,
        "etcd": etcd,
        "prefix": prefix,
        "maxHash": MAX_HASH,
        "controllerTypes": types,
        "progressError": progress_error,
    }


# -- the hub: latest payload + subscriber wake-ups, on the event loop ----------


class RingHub:
    """The latest ring payload and the SSE subscribers waiting for the next one.

    Every method except the ``*_threadsafe`` ones (:meth:`publish_threadsafe`,
    :meth:`etcd_status_threadsafe`) must be called on the event loop.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._view: RegistryView | None = None
        self._received_at: float | None = None
        self._etcd = "connecting"
        self._progress: dict[tuple[str, str], Progress] | None = None
        self._progress_error: str | None = "no proxy given (--proxy URL)"
        self._version = 0
        self._payload = self._render()
        self._subscribers: set[asyncio.Event] = set()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    # loop binding / cross-thread entry points
    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def _call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (shutdown)
            loop.call_soon_threadsafe(fn, *args)

    def publish_threadsafe(self, view: RegistryView) -> None:
        """Hand a view to the loop (called on the membership watch thread)."""
        self._call_soon(self.publish, view, time.time())

    def etcd_status_threadsafe(self, reachable: bool) -> None:
        """Report the probe's result (called on the probe thread)."""
        self._call_soon(self.set_etcd_status, reachable)

    def progress_threadsafe(self, progress: dict[tuple[str, str], Progress] | None, error: str | None) -> None:
        """Report the proxy's progress metrics (called on the poller thread)."""
        self._call_soon(self.set_progress, progress, error)

    # loop-only
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def synced(self) -> bool:
        return self._view is not None

    def _render(self) -> bytes:
        doc = ring_payload(
            self._view,
            prefix=self.prefix,
            etcd=self._etcd,
            received_at=self._received_at,
            progress=self._progress,
            progress_error=self._progress_error,
        )
        return orjson.dumps(doc)

    def _changed(self) -> None:
        self._payload = self._render()
        self._version += 1
        for ev in self._subscribers:
            ev.set()

    def publish(self, view: RegistryView, received_at: float) -> None:
        self._view = view
        self._received_at = received_at
        if not view.reconnected:  # a reconnect view is re-delivered before etcd answered again
            self._etcd = "ok"
        self._changed()

    def set_etcd_status(self, reachable: bool) -> None:
        """``ok``/``unreachable``; before the first view ``connecting`` either way."""
        status = ("ok" if reachable else "unreachable") if self.synced else "connecting"
        if status != self._etcd:
            log.info("dashboard: etcd %s", status)
            self._etcd = status
            self._changed()

    def set_progress(self, progress: dict[tuple[str, str], Progress] | None, error: str | None) -> None:
        """The proxy's latest progress metrics (``None`` and why: unknown); republished when they changed."""
        if (progress, error) != (self._progress, self._progress_error):
            self._progress, self._progress_error = progress, error
            self._changed()

    def current(self) -> tuple[int, bytes]:
        return self._version, self._payload

    def subscribe(self) -> asyncio.Event:
        ev = asyncio.Event()
        self._subscribers.add(ev)
        return ev

    def unsubscribe(self, ev: asyncio.Event) -> None:
        self._subscribers.discard(ev)

    def close(self) -> None:
        """End every event stream (server shutdown)."""
        self._closed = True
        for ev in self._subscribers:
            ev.set()


async def _events(hub: RingHub, keepalive: float) -> AsyncIterator[bytes]:
    wake = hub.subscribe()
    try:
        yield b"retry: 2000\n\n"
        sent = -1
        while not hub.closed:
            wake.clear()  # before reading: a publish during the yield below sets it again
            version, payload = hub.current()
            if version != sent:
                sent = version
                yield b"event: ring\ndata: " + payload + b"\n\n"  # orjson output has no newline
            try:
                await asyncio.wait_for(wake.wait(), keepalive)
            except TimeoutError:
                yield b": keepalive\n\n"
    finally:
        hub.unsubscribe(wake)


class EtcdProbe:
    """Named thread (``dashboard-etcd-probe``) reporting whether etcd answers a cheap read.

    The membership watch retries silently while etcd is away, so the page
    learns about an outage from here: every ``interval`` seconds one
    ``revision()`` read with a short timeout; the result goes to the hub.
    """

    def __init__(self, config: EtcdConfig, hub: RingHub, interval: float = STATUS_POLL_SECONDS) -> None:
        self.config = replace(config, timeout=min(config.timeout, max(interval, 1.0)))
        self.hub = hub
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = start_thread("dashboard-etcd-probe", self._run, what="dashboard: etcd probe")

    def stop(self) -> None:
        self._stop.set()
        join_thread(self._thread, self.config.timeout + self.interval + 1)

    def _run(self) -> None:
        client: EtcdClient | None = None
        try:
            while not self._stop.wait(self.interval):
                try:
                    if client is None:
                        client = EtcdClient(self.config)
                    client.revision()
                    self.hub.etcd_status_threadsafe(True)
                except RangeshardError as e:
                    log.debug("dashboard: etcd probe failed: %s", e)
                    self.hub.etcd_status_threadsafe(False)
                    if client is not None:
                        client.close()
                        client = None
        finally:
            if client is not None:
                client.close()


class ProgressPoller:
    """Named thread (``dashboard-progress``) reading each instance's progress from the proxy's metrics."""

    def __init__(self, proxy_url: str | ProxyAccess, hub: RingHub, interval: float = PROGRESS_POLL_SECONDS) -> None:
        self.proxy_url = proxy_url
        self.hub = hub
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = start_thread("dashboard-progress", self._run, what="dashboard: progress poller")

    def stop(self) -> None:
        self._stop.set()
        join_thread(self._thread, self.interval + 5)

    def _run(self) -> None:
        while True:
            try:
                self.hub.progress_threadsafe(fetch(self.proxy_url, timeout=min(3.0, self.interval + 1)), None)
            except ProgressUnavailable as e:
                log.debug("dashboard: %s", e)
                self.hub.progress_threadsafe(None, str(e))
            if self._stop.wait(self.interval):
                return


# -- the app -------------------------------------------------------------------


def create_app(
    config: EtcdConfig,
    *,
    prefix: str = DEFAULT_PREFIX,
    controller_type: str | None = None,
    hub: RingHub | None = None,
    keepalive: float = KEEPALIVE_SECONDS,
    proxy_url: str | ProxyAccess | None = None,
    progress_interval: float = PROGRESS_POLL_SECONDS,
) -> FastAPI:
    """The dashboard app; its lifespan starts and stops the membership watch (and the progress poller)."""
    hub = hub or RingHub(prefix)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        hub.bind(asyncio.get_running_loop())
        watch = MembershipWatch(
            config,
            hub.publish_threadsafe,
            controller_type=controller_type,
            prefix=prefix,
            name="dashboard",
            probe_interval=WATCH_PROBE_SECONDS,
            pins=True,  # the ring shows which instances are pinned (rangeshard rebalance pin)
        )
        probe = EtcdProbe(config, hub)
        poller = ProgressPoller(proxy_url, hub, progress_interval) if proxy_url else None
        watch.start()
        probe.start()
        if poller is not None:
            poller.start()
        try:
            yield
        finally:
            hub.close()
            stops = [watch.stop, probe.stop, *((poller.stop,) if poller is not None else ())]
            await asyncio.gather(*(anyio.to_thread.run_sync(stop) for stop in stops))

    app = FastAPI(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.hub = hub

    @app.get("/")
    async def index() -> Response:
        return HTMLResponse(page(), headers={"Cache-Control": "no-store"})

    @app.get("/api/ring")
    async def ring() -> Response:
        _, payload = hub.current()
        return Response(payload, media_type="application/json", headers={"Cache-Control": "no-store"})

    @app.get("/api/events")
    async def events() -> Response:
        return StreamingResponse(
            _events(hub, keepalive),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    @app.get("/healthz")
    async def healthz() -> Response:
        return PlainTextResponse("ok")

    @app.get("/readyz")
    async def readyz() -> Response:
        if hub.synced:
            return PlainTextResponse("ok")
        return PlainTextResponse("not ready: no registry view from etcd yet", status_code=503)

    return app


def serve(
    config: EtcdConfig,
    *,
    host: str,
    port: int,
    prefix: str = DEFAULT_PREFIX,
    controller_type: str | None = None,
    proxy_url: str | ProxyAccess | None = None,
) -> None:
    """Run the dashboard in the foreground until SIGINT/SIGTERM."""
    hub = RingHub(prefix)
    app = create_app(config, prefix=prefix, controller_type=controller_type, hub=hub, proxy_url=proxy_url)
    level = logging.getLogger().getEffectiveLevel()
    shutdown = ShutdownSignal()
    shutdown.on_set(hub.close)
    serving.serve(
        app,
        shutdown,
        host=host,
        port=port,
        log_level=level,
        access_log=level <= logging.DEBUG,
        timeout_graceful_shutdown=3,
        log_config=None,  # keep the handlers the CLI configured
    )


# -- the command -----------------------------------------------------------------


@with_etcd_options
def dashboard_command(
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port to serve on (0 = any free port).")] = 8090,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (the page is read-only and has no login).")
    ] = "127.0.0.1",
    controller_type: Annotated[str | None, typer.Option("--type", "-t", help="Only this controller type.")] = None,
    proxy: ProxyOpt = None,
    token_file: ProxyTokenFileOpt = None,
    kubeconfig: KubeconfigOpt = None,
    *,
    etcd_options: EtcdOptions,
) -> None:
    """Serve a live view of the hash ring in a browser (updates from etcd via server-sent events)."""
    try:
        if controller_type is not None:
            check_name("--type", controller_type)
        if not 0 <= port <= 65535:
            raise ConfigError(f"--port: {port} is outside 0-65535")
        config = etcd_options.config()
        prefix = etcd_options.prefix
        access = find_proxy(proxy, token_file, kubeconfig, etcd_options.state_dir)
        if access is None:  # the proxy the instances publish in their records
            with contextlib.suppress(RangeshardError), EtcdClient(config) as client:
                _rev, snaps = Registry(client, prefix).snapshots()
                access = find_proxy(None, token_file, kubeconfig, etcd_options.state_dir, snaps)
    except RangeshardError as e:
        fail(e)
    if port == 0:
        port = free_port(host)
    shown = f"[{host}]" if ":" in host else host
    progress = f"progress from {access.url}" if access else "no proxy: progress unknown"
    typer.echo(
        f"rangeshard dashboard on http://{shown}:{port}/ (etcd {config.urls}, prefix {prefix}; {progress}); "
        "Ctrl-C stops it"
    )
    serve(config, host=host, port=port, prefix=prefix, controller_type=controller_type, proxy_url=access)
