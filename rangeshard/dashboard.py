"""``rangeshard dashboard``: a live view of the hash ring of every controller type, in a browser.

Purpose
    Serves one self-contained page (HTML, CSS and JavaScript inline: no CDN,
    no build step, works offline) that draws, for each controller type, the
    63-bit hash space as a horizontal bar split into the instances' ranges:
    widths proportional to each range's share of the space, colour by handover
    state (``init``/``locked``/``wait``/``active``), a lock marker on locked
    instances, and each instance's ``workloadNum`` and id inside its segment.
    A table below each bar lists the details. Endpoints:

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
    second to report reachability the same way. Both are started in the app's
    lifespan and stopped at shutdown; on SIGINT/SIGTERM the hub is closed first so open
    event streams end and uvicorn can shut down promptly.

Dependency direction
    Part of the CLI layer: it may import ``registry`` (and ``rangeshard.cli``);
    nothing below the CLI imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Annotated, Any

import orjson
import typer
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, PlainTextResponse, Response, StreamingResponse

from hashing import MAX_HASH
from rangeshard.cli.common import DEFAULT_REGISTRY_PREFIX, EtcdOptions, fail, with_etcd_options
from rangeshard.core import serving
from rangeshard.core.errors import ConfigError, RangeshardError
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.loops import start_thread
from rangeshard.core.process import free_port
from rangeshard.core.serving import ShutdownSignal
from registry import MembershipWatch, RegistryView
from registry.models import check_name

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 15.0
"""Seconds between SSE keep-alive comments on a quiet stream."""

WATCH_PROBE_SECONDS = 1.0
"""Liveness probe interval of the membership watch: bounds shutdown time and how soon an outage shows."""

STATUS_POLL_SECONDS = 1.0
"""How often the etcd probe checks that etcd answers."""

_SPACE = MAX_HASH + 1  # number of keys in the hash space


# -- the view as JSON ----------------------------------------------------------


def ring_payload(
    view: RegistryView | None, *, prefix: str, etcd: str, received_at: float | None = None
) -> dict[str, Any]:
    """The JSON document of ``/api/ring`` and of every ``ring`` event.

    ``etcd`` is ``connecting`` (no view yet), ``ok`` or ``unreachable``. Each
    controller type lists ``instances`` (members owning a range, in hash
    order) and ``unowned`` (records repeating another's key, which own
    nothing; only possible by hand). ``share`` is the fraction of the whole
    hash space, ``0..1``.
    """
    types: list[dict[str, Any]] = []
    if view is not None:
        for ctype, snap in sorted(view.snapshots.items()):
            instances: list[dict[str, Any]] = []
            unowned: list[dict[str, Any]] = []
            for m in snap.members:
                rec = m.record
                item: dict[str, Any] = {
                    "instanceId": rec.instance_id,
                    "state": rec.state.value,
                    "isLocked": rec.is_locked,
                    "giver": rec.giver,
                    "hashKey": rec.hash_key,
                    "hashKeyHex": f"0x{rec.hash_key:016x}",
                    "rangeStart": m.range.lo if m.range else None,
                    "rangeEnd": m.range.hi if m.range else None,
                    "rangeStartHex": f"0x{m.range.lo:016x}" if m.range else None,
                    "rangeEndHex": f"0x{m.range.hi:016x}" if m.range else None,
                    "share": (m.range.hi - m.range.lo + 1) / _SPACE if m.range else 0.0,
                    "workloadNum": rec.workload_num,
                    "host": rec.host,
                    "pid": rec.pid,
                    "startedAt": rec.started_at,
                    "heartbeatAt": rec.heartbeat_at,
                }
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
    }


# -- the hub: latest payload + subscriber wake-ups, on the event loop ----------


class RingHub:
    """The latest ring payload and the SSE subscribers waiting for the next one.

    Every method except the ``*_threadsafe`` ones (:meth:`publish_threadsafe`,
    :meth:`etcd_status_threadsafe`, :meth:`close_threadsafe`) must be called
    on the event loop.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._view: RegistryView | None = None
        self._received_at: float | None = None
        self._etcd = "connecting"
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

    def close_threadsafe(self) -> None:
        self._call_soon(self.close)

    # loop-only
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def synced(self) -> bool:
        return self._view is not None

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def _render(self) -> bytes:
        doc = ring_payload(self._view, prefix=self.prefix, etcd=self._etcd, received_at=self._received_at)
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
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=self.config.timeout + self.interval + 1)

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


# -- the app -------------------------------------------------------------------


def create_app(
    config: EtcdConfig,
    *,
    prefix: str = DEFAULT_REGISTRY_PREFIX,
    controller_type: str | None = None,
    hub: RingHub | None = None,
    keepalive: float = KEEPALIVE_SECONDS,
) -> FastAPI:
    """The dashboard app; its lifespan starts and stops the membership watch."""
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
        )
        probe = EtcdProbe(config, hub)
        watch.start()
        probe.start()
        try:
            yield
        finally:
            hub.close()
            await asyncio.gather(asyncio.to_thread(watch.stop), asyncio.to_thread(probe.stop))

    app = FastAPI(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.hub = hub

    @app.get("/")
    async def index() -> Response:
        return HTMLResponse(PAGE, headers={"Cache-Control": "no-store"})

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
    prefix: str = DEFAULT_REGISTRY_PREFIX,
    controller_type: str | None = None,
) -> None:
    """Run the dashboard in the foreground until SIGINT/SIGTERM."""
    hub = RingHub(prefix)
    app = create_app(config, prefix=prefix, controller_type=controller_type, hub=hub)
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
    except RangeshardError as e:
        fail(e)
    if port == 0:
        port = free_port(host)
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"rangeshard dashboard on http://{shown}:{port}/ (etcd {config.urls}, prefix {prefix}); Ctrl-C stops it")
    serve(config, host=host, port=port, prefix=prefix, controller_type=controller_type)


# -- the page ------------------------------------------------------------------

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rangeshard ring</title>
<link rel="icon" href="data:,">
<style>
:root {
  --init: #3b7dd8; --locked: #d98e04; --wait: #8e44c9; --active: #23914a;
  --bg: #f6f7f9; --fg: #1d2330; --muted: #6b7385; --line: #d5d9e0;
  font-family: system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
}
body { margin: 0; background: var(--bg); color: var(--fg); }
header { display: flex; align-items: center; gap: 1rem; padding: .8rem 1.5rem; background: #1d2330; color: #fff; }
header h1 { font-size: 1.15rem; margin: 0; font-weight: 600; }
header .meta { color: #b8c0d0; font-size: .85rem; }
.pill { font-size: .78rem; padding: .15rem .55rem; border-radius: 1rem; background: #555; color: #fff; }
.pill.ok { background: var(--active); } .pill.bad { background: #c0392b; } .pill.wait { background: var(--locked); }
main { padding: 1rem 1.5rem 3rem; max-width: 1400px; }
.legend { display: flex; gap: 1.2rem; flex-wrap: wrap; font-size: .85rem; color: var(--muted); margin: .3rem 0 1rem; }
.legend span { display: inline-flex; align-items: center; gap: .35rem; }
.sw { width: .9rem; height: .9rem; border-radius: 3px; display: inline-block; }
section.ctype { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 1rem 1.2rem;
  margin-bottom: 1.2rem; }
section.ctype h2 { font-size: 1.05rem; margin: 0 0 .7rem; }
section.ctype h2 small { font-weight: 400; color: var(--muted); margin-left: .5rem; }
.bar { display: flex; height: 64px; border-radius: 6px; overflow: hidden; border: 1px solid #9aa3b2;
  background: #e9ecf1; }
.seg { position: relative; flex: 0 1 0%; min-width: 3px; box-sizing: border-box; border-right: 2px solid #fff;
  color: #fff; overflow: hidden; padding: .35rem .45rem; font-size: .78rem; line-height: 1.25;
  transition: flex-basis .35s ease, background-color .35s ease; text-shadow: 0 1px 1px rgba(0,0,0,.35); }
.seg:last-child { border-right: 0; }
.seg.init { background-color: var(--init); } .seg.locked { background-color: var(--locked); }
.seg.wait { background-color: var(--wait); } .seg.active { background-color: var(--active); }
.seg.is-locked { background-image: repeating-linear-gradient(135deg, rgba(255,255,255,.22) 0 6px,
  transparent 6px 12px); }
.seg .wl { font-weight: 700; font-size: .95rem; display: block; white-space: nowrap; }
.seg .id { display: block; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; opacity: .95; }
.seg .lock { position: absolute; top: 4px; right: 4px; width: 14px; height: 16px; display: none; }
.seg.is-locked .lock { display: block; }
.seg.is-locked .wl { padding-right: 16px; }
.axis { position: relative; height: 1.2rem; font-size: .72rem; color: var(--muted); margin-top: .2rem; }
.axis span { position: absolute; transform: translateX(-50%); white-space: nowrap; }
.axis span:first-child { transform: none; } .axis span:last-child { transform: translateX(-100%); }
table { border-collapse: collapse; width: 100%; margin-top: .6rem; font-size: .8rem; }
th, td { text-align: left; padding: .25rem .5rem; border-bottom: 1px solid #eceef2; white-space: nowrap; }
th { color: var(--muted); font-weight: 500; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.mono { font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
.st { display: inline-block; padding: 0 .4rem; border-radius: 3px; color: #fff; font-size: .75rem; }
.empty { color: var(--muted); padding: 2rem 0; }
.unowned { color: #c0392b; font-size: .8rem; margin-top: .4rem; }
</style>
</head>
<body>
<header>
  <h1>rangeshard &middot; hash ring</h1>
  <span id="conn" class="pill" data-testid="conn">connecting</span>
  <span id="etcd" class="pill" data-testid="etcd">etcd: ?</span>
  <span class="meta" id="meta"></span>
</header>
<main>
  <div class="legend">
    <span><i class="sw" style="background:var(--init)"></i>init</span>
    <span><i class="sw" style="background:var(--locked)"></i>locked</span>
    <span><i class="sw" style="background:var(--wait)"></i>wait</span>
    <span><i class="sw" style="background:var(--active)"></i>active</span>
    <span><i class="sw" style="background:#888;background-image:repeating-linear-gradient(135deg,
      rgba(255,255,255,.4) 0 3px,transparent 3px 6px)"></i>isLocked (waiting for its giver)</span>
    <span>width = share of the 63-bit hash space &middot; bold number = workloadNum</span>
  </div>
  <div id="types"><p class="empty">waiting for the registry&hellip;</p></div>
</main>
<script>
"use strict";
const LOCK_SVG = '<svg class="lock" viewBox="0 0 14 16" aria-hidden="true"><rect x="1" y="7" width="12" height="9" ' +
  'rx="1.5" fill="#fff"/><path d="M3.5 7V5a3.5 3.5 0 0 1 7 0v2" fill="none" stroke="#fff" stroke-width="2"/></svg>';
const $ = (sel, el) => (el || document).querySelector(sel);
function esc(s) {
  return String(s == null ? "" : s).replace(/[&<>"']/g,
    c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function pct(share) { return (share * 100).toFixed(share >= 0.1 ? 1 : 3) + "%"; }
function age(t) {
  if (t == null) return "-";
  const s = Math.max(0, Math.round(Date.now() / 1000 - t));
  return s < 120 ? s + "s" : s < 7200 ? Math.floor(s / 60) + "m" : Math.floor(s / 3600) + "h";
}
let last = null;

function section(type) {
  let sec = document.querySelector('section.ctype[data-type="' + CSS.escape(type) + '"]');
  if (!sec) {
    sec = document.createElement("section");
    sec.className = "ctype";
    sec.dataset.type = type;
    sec.innerHTML = '<h2></h2><div class="bar" role="list"></div><div class="axis">' +
      '<span style="left:0">0</span><span style="left:25%">2^61</span><span style="left:50%">2^62</span>' +
      '<span style="left:75%">3&middot;2^61</span><span style="left:100%">2^63&minus;1</span></div>' +
      '<div class="unowned"></div><table><thead><tr><th>instance</th><th>state</th><th>locked</th>' +
      '<th>range start</th><th>range end</th><th>share</th><th>workload</th><th>host / pid</th>' +
      '<th>heartbeat</th></tr></thead><tbody></tbody></table>';
    sec.querySelector(".bar").setAttribute("aria-label", "hash ring of " + type);
  }
  return sec;
}

function renderType(ct) {
  const sec = section(ct.controllerType);
  const n = ct.instances.length;
  sec.querySelector("h2").innerHTML = esc(ct.controllerType) + "<small>" + n + " instance" + (n === 1 ? "" : "s") +
    " &middot; " + ct.workloadNum + " objects</small>";
  const bar = sec.querySelector(".bar");
  const old = new Map([...bar.children].map(el => [el.dataset.instance, el]));
  const segs = ct.instances.map(inst => {
    let el = old.get(inst.instanceId);
    if (!el) {
      el = document.createElement("div");
      el.dataset.instance = inst.instanceId;
      el.setAttribute("role", "listitem");
      el.innerHTML = LOCK_SVG + '<span class="wl"></span><span class="id"></span>';
    }
    old.delete(inst.instanceId);
    el.className = "seg " + inst.state + (inst.isLocked ? " is-locked" : "");
    el.dataset.state = inst.state;
    el.dataset.locked = String(inst.isLocked);
    el.dataset.share = String(inst.share);
    el.dataset.workload = String(inst.workloadNum);
    el.style.flexBasis = (inst.share * 100) + "%";
    el.querySelector(".wl").textContent = inst.workloadNum;
    el.querySelector(".id").textContent = inst.instanceId;
    el.title = inst.instanceId + "\\nstate: " + inst.state + (inst.isLocked ? " (locked by " + inst.giver + ")" : "") +
      "\\nrange: [" + inst.rangeStartHex + ", " + inst.rangeEndHex + "]\\nshare: " + pct(inst.share) +
      "\\nworkloadNum: " + inst.workloadNum;
    return el;
  });
  for (const el of old.values()) el.remove();
  segs.forEach((el, i) => { if (bar.children[i] !== el) bar.insertBefore(el, bar.children[i] || null); });
  const un = sec.querySelector(".unowned");
  un.textContent = ct.unowned.length ? "own no range (duplicate hashKey): " +
    ct.unowned.map(u => u.instanceId).join(", ") : "";
  sec.querySelector("tbody").innerHTML = ct.instances.concat(ct.unowned).map(i =>
    '<tr data-instance="' + esc(i.instanceId) + '"><td>' + esc(i.instanceId) + '</td>' +
    '<td><span class="st" style="background:var(--' + esc(i.state) + ')">' + esc(i.state) + '</span></td>' +
    '<td>' + (i.isLocked ? "yes" + (i.giver ? " (by " + esc(i.giver) + ")" : "") : "no") + '</td>' +
    '<td class="mono">' + esc(i.rangeStartHex || "-") + '</td><td class="mono">' + esc(i.rangeEndHex || "-") +
    '</td><td class="num">' + pct(i.share) + '</td><td class="num">' + i.workloadNum + '</td>' +
    '<td>' + esc(i.host || "-") + (i.pid ? " / " + i.pid : "") + '</td>' +
    '<td class="num" data-heartbeat="' + (i.heartbeatAt == null ? "" : i.heartbeatAt) + '">' + age(i.heartbeatAt) +
    '</td></tr>').join("");
  return sec;
}

function render(doc) {
  last = doc;
  const etcd = $("#etcd");
  etcd.textContent = "etcd: " + doc.etcd;
  etcd.className = "pill " + (doc.etcd === "ok" ? "ok" : doc.etcd === "unreachable" ? "bad" : "wait");
  $("#meta").textContent = doc.synced ? "prefix " + doc.prefix + " · etcd revision " + doc.revision +
    " · updated " + new Date(doc.receivedAt * 1000).toLocaleTimeString() : "prefix " + doc.prefix;
  const root = $("#types");
  if (!doc.synced || doc.controllerTypes.length === 0) {
    root.innerHTML = '<p class="empty">' + (doc.synced ? "no controller instances registered" :
      "waiting for the registry&hellip;") + "</p>";
    return;
  }
  const keep = doc.controllerTypes.map(renderType);
  [...root.children].forEach(el => { if (!keep.includes(el)) el.remove(); });
  keep.forEach((el, i) => { if (root.children[i] !== el) root.insertBefore(el, root.children[i] || null); });
}

setInterval(() => {
  document.querySelectorAll("td[data-heartbeat]").forEach(td => {
    const t = td.dataset.heartbeat;
    td.textContent = t === "" ? "-" : age(Number(t));
  });
}, 1000);

function connect() {
  const conn = $("#conn");
  const es = new EventSource("api/events");
  es.addEventListener("ring", ev => {
    conn.textContent = "live"; conn.className = "pill ok";
    render(JSON.parse(ev.data));
  });
  es.onopen = () => { conn.textContent = "live"; conn.className = "pill ok"; };
  es.onerror = () => { conn.textContent = "reconnecting"; conn.className = "pill bad"; };
}
connect();
</script>
</body>
</html>
"""
