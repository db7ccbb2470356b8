"""External controllers: shard any controller, unmodified, through a local endpoint of its manager.

Purpose
    A controller entry with ``external:`` runs no ``Controller`` class. The
    manager registers one instance for it as usual (:class:`ShardInstance`:
    lease, lock -> wait -> active) and serves an HTTP **endpoint** the
    controller's kubeconfig points at (:class:`Endpoint`). The endpoint
    forwards every request to the range filter proxy and

    * adds ``shardSelector=shardRange(<path>, ...)`` for the instance's
      current range to every list and watch of a resource named in
      ``shard`` (a selector sent by the client itself is a 400);
    * puts the instance's owner token at the start of the User-Agent of
      every write to such a resource (the proxy's write fencing then protects
      it), followed by the client's own User-Agent;
    * turns a range change into watch resets: every open watch of a
      ``shard`` resource ends with an ``ERROR`` event carrying a ``410
      Expired`` Status, which every client library answers with a relist.

    With ``command`` the manager also runs the controller (:class:`Child`):
    ``KUBECONFIG`` names a kubeconfig for the endpoint (no credentials of
    the manager inside), ``RANGESHARD_INSTANCE_ID`` and
    ``RANGESHARD_CONTROLLER_TYPE`` are set, its output goes to the manager's
    log prefixed with ``[<name>]``, it is restarted with backoff when it
    exits and stopped (SIGTERM, then SIGKILL) on shutdown. ``$(NAME)`` in
    ``command`` is replaced by those variables (:func:`expand`, the kubelet's
    spelling). With ``livenessProbe`` a :class:`~controller_manager.probes.Prober`
    probes each run of it; ``failureThreshold`` failures in a row SIGKILL
    the process (WARNING with the probe's answer) and the restart loop starts
    it again with the same backoff.

Handover
    * What the endpoint serves is the instance's *allowed* range
      (``ShardInstance.allowed``): nothing while locked (a new instance owned
      nothing before) or between a range change and the reset that follows.
    * A range change resets every watch at once (the giver stops seeing the
      moved keys); the instance counts as synced as soon as that is done.
    * The giver is drained when no write of the controller to a ``shard``
      resource is in flight and ``drainSeconds`` have passed since the cut;
      then it unlocks the receiver as usual. Safety does not rest on the
      drain: a late write carries a stale owner token and the proxy refuses it.

Concurrency model
    Threads, like the rest of the manager: the endpoint is a
    ``ThreadingHTTPServer`` (one thread per connection, named
    ``external-<name>-endpoint``), each forwarding with a shared
    ``httpx.Client``; the child runs under a supervisor thread
    (``external-<name>-child``, which also copies its output) plus, with a
    probe, the prober's thread (``external-<name>-liveness``), whose failure
    action only signals the run it was given. The
    shard instance's callbacks (``on_epoch``, ``on_allowed``, ``on_token``)
    run on its state-machine thread and only touch fields under ``_lock``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import orjson
import yaml

from controller_manager.config import ExternalSection, LivenessProbeSection
from controller_manager.metrics import Metrics
from controller_manager.probes import Prober, ProbeResult, pick_port
from controller_manager.sharding import ShardInstance
from hashing import HashRange, ShardBy, range_to_selector
from rangeshard.core import relay
from rangeshard.core.etcd import EtcdConfig
from rangeshard.core.kubeapi import expired_status, status_object
from rangeshard.core.loops import start_thread
from rangeshard.core.ownertoken import OwnerToken
from rangeshard.core.process import terminate
from rangeshard.core.requestinfo import classify
from rangeshard.core.tokenfile import BearerTokenFile

log = logging.getLogger(__name__)

#: Matches no object: lists and watches while the instance may serve nothing.
_NOTHING = "metadata.name=rangeshard-serves-nothing.invalid"
#: How many resourceVersions handed to the controller are remembered per serving period.
_ISSUED_MAX = 65536
_EXPIRED = expired_status("rangeshard: the instance's range changed; relist")
#: The watch event a reset watch and a stale resume end with (every client library relists on it).
_EXPIRED_EVENT = orjson.dumps({"type": "ERROR", "object": _EXPIRED}) + b"\n"
#: Response headers not copied to the controller (the relay sets its own length or chunking).
_NOT_RELAYED = relay.HOP_BY_HOP | {"content-length", "content-encoding"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away is a DEBUG line; anything else is logged with its traceback (not printed)."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            log.debug("endpoint: client %s went away: %s", client_address, error)
        else:
            log.error("endpoint: request from %s failed", client_address, exc_info=error)


class _Watch:
    """One open watch of a ``shard`` resource: the upstream response a reset closes."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.reset = False

    def cut(self) -> None:
        """End the relay now: shut the upstream socket down (closing it alone does not wake a blocked read)."""
        self.reset = True
        stream = self.response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self.response.close()


class Endpoint:
    """The local HTTP endpoint of one external controller (see module docstring)."""

    def __init__(
        self,
        name: str,
        section: ExternalSection,
        shard: ShardInstance,
        *,
        proxy_url: str,
        token_file: str | None = None,
        ca_cert: str | None = None,
    ) -> None:
        self.name = name
        self.shard = shard
        #: The shard rule of each ``shard`` resource, by ``resource.group`` label (lists, watches and writes).
        self.rules: dict[str, ShardBy] = {s.label: s.rule for s in section.shard}
        self.drain_seconds = section.drain_seconds
        #: The manager's token for the proxy (``proxy.tokenFile``), replacing the controller's own.
        self.token_file = BearerTokenFile(token_file) if token_file is not None else None
        self.client = httpx.Client(base_url=proxy_url, verify=ca_cert or True, timeout=httpx.Timeout(30.0, read=None))
        host, _, port = section.listen.rpartition(":")
        self.server = _Server((host.strip("[]"), int(port)), _handler(self))
        self._lock = threading.Lock()
        self._watches: set[_Watch] = set()
        self.token: OwnerToken | None = None
        self.writes_in_flight = 0
        self.cut_at = 0.0
        self.reset_epoch = -1
        self.resets = 0
        #: resourceVersions the controller got (lists, watch events) since the last reset: a watch may
        #: resume from one of them; any other resumes from state of another range (see :meth:`fresh`).
        self._issued: OrderedDict[str, None] = OrderedDict()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        text = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{text}]" if ":" in text else text
        return f"http://{shown}:{port}"

    # -- the shard instance's callbacks (its state-machine thread) -----------------
    def on_epoch(self) -> None:
        """The range or lock changed: cut every watch, remember when (the drain counts from here)."""
        with self._lock:
            self.cut_at = time.monotonic()
        self.reset_watches("the instance's range changed")
        with self._lock:
            self.reset_epoch = self.shard.epoch

    def on_allowed(self) -> None:
        """Processing is allowed on a (new) range: the controller relists to see it."""
        self.reset_watches("the instance may now serve its range")

    def on_token(self, token: OwnerToken) -> None:
        with self._lock:
            self.token = token

    def synced(self, epoch: int) -> bool:
        with self._lock:
            return self.reset_epoch >= epoch

    def drained(self) -> bool:
        with self._lock:
            return self.writes_in_flight == 0 and time.monotonic() - self.cut_at >= self.drain_seconds

    def generation(self) -> int:
        """The serving period: bumped by every reset (a request records it before it picks its selector)."""
        with self._lock:
            return self.resets

    def issued(self, resource_version: str, generation: int) -> None:
        """The controller got ``resource_version`` (a list's, or a watch event's) in serving period ``generation``.

        Ignored when a reset came in between: the answer was cut to the range served before it.
        """
        if not resource_version:
            return
        with self._lock:
            if generation != self.resets:
                return
            self._issued[resource_version] = None
            self._issued.move_to_end(resource_version)
            while len(self._issued) > _ISSUED_MAX:
                self._issued.popitem(last=False)

    def fresh(self, resource_version: str) -> bool:
        """Whether a watch from ``resource_version`` resumes state of the range served now.

        A list made before a range change and a watch started after it would
        otherwise miss every object that moved in between (the watch only
        sends changes): such a watch is answered ``410 Expired`` and the
        client relists. ``""`` and ``"0"`` carry no state.
        """
        if resource_version in ("", "0"):
            return True
        with self._lock:
            return resource_version in self._issued

    def reset_watches(self, why: str) -> None:
        with self._lock:
            watches, self._watches = list(self._watches), set()
            self.resets += 1
            self._issued.clear()
        if watches:
            log.info("%s: resetting %s watch(es): %s", self.name, len(watches), why)
        for w in watches:
            w.cut()

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        self._thread = start_thread(
            f"external-{self.name}-endpoint", self.server.serve_forever, what=f"external {self.name}: endpoint"
        )
        log.info("%s: endpoint for the external controller on %s", self.name, self.url)

    def stop(self) -> None:
        self.reset_watches("the manager is stopping")
        if self._thread is not None:  # shutdown() waits for serve_forever: never call it before start()
            self.server.shutdown()
        self.server.server_close()
        self.client.close()

    # -- forwarding -----------------------------------------------------------------
    def served_selector(self, rule: ShardBy) -> str | None:
        """The shardSelector of what the instance serves now by ``rule`` (``None``: nothing)."""
        allowed: HashRange | None = self.shard.allowed
        return range_to_selector(allowed, rule.path) if allowed is not None else None

    def auth_header(self) -> str | None:
        return self.token_file.authorization() if self.token_file is not None else None

    def register(self, watch: _Watch, generation: int) -> None:
        """Track an open watch; one whose request began before the last reset is cut at once.

        A reset between the request's freshness check and this registration
        (e.g. the instance was unlocked: the check saw the locked period's
        empty list as fresh, the selector the new range) would otherwise leave
        a watch that resumes from a list of another range and is never cut.
        """
        with self._lock:
            current = generation == self.resets
            if current:
                self._watches.add(watch)
        if not current:
            log.info("%s: a watch opened across a reset: cut at once (the controller relists)", self.name)
            watch.cut()

    def forget(self, watch: _Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    @contextlib.contextmanager
    def write(self) -> Iterator[OwnerToken | None]:
        with self._lock:
            self.writes_in_flight += 1
            token = self.token
        try:
            yield token
        finally:
            with self._lock:
                self.writes_in_flight -= 1


def _handler(endpoint: Endpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out as separate writes: with Nagle on, the body waits for the
        # client's delayed ACK of the headers (~40 ms per response on Linux).
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s: %s", endpoint.name, format % args)

        def do_GET(self) -> None:
            self._forward()

        do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET  # noqa: N815

        def _status(self, code: int, reason: str, message: str) -> None:
            body = orjson.dumps(status_object(code, reason, message))
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _body(self) -> bytes | None:
            length = self.headers.get("Content-Length")
            if length is not None:
                return self.rfile.read(int(length)) if length.isdigit() else b""
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = bytearray()
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return bytes(out)
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return None

        def _forward(self) -> None:
            split = urlsplit(self.path)
            query = parse_qsl(split.query, keep_blank_values=True)
            params = dict(query)
            info = classify(self.command, split.path, params)
            found = info.path
            rule = endpoint.rules.get(found.gvr.label) if found is not None else None
            sharded = rule is not None
            sharded_get = sharded and found is not None and found.collection and self.command == "GET"
            headers = relay.request_headers(self.headers.items(), authorization=endpoint.auth_header())
            body = self._body()
            watch = False
            generation = -1
            if sharded_get and found is not None:
                if "shardSelector" in params:
                    self._status(400, "BadRequest", "shardSelector is set by rangeshard for this resource")
                    return
                watch = info.is_watch
                generation = endpoint.generation()
                if watch and not endpoint.fresh(params.get("resourceVersion", "")):
                    self._expired()
                    return
                selector = endpoint.served_selector(rule) if rule is not None else None
                if selector is not None:
                    query.append(("shardSelector", selector))
                else:
                    fields = params.get("fieldSelector")
                    query = [(k, v) for k, v in query if k != "fieldSelector"]
                    query.append(("fieldSelector", f"{fields},{_NOTHING}" if fields else _NOTHING))
            target = split.path + ("?" + urlencode(query) if query else "")
            write_rule = relay.write_rule(endpoint.rules, info)
            if write_rule is not None:
                with endpoint.write() as token:
                    if token is not None:
                        headers = relay.declare(headers, token, write_rule)
                    self._relay(target, headers, body, stream=False)
                return
            self._relay(
                target,
                headers,
                body,
                stream=watch or _streaming(params),
                sharded_watch=watch,
                sharded_list=sharded_get and not watch,
                generation=generation,
            )

        def _expired(self) -> None:
            """A watch event stream of one ``ERROR 410 Expired`` (as kube answers a too old resourceVersion)."""
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk(_EXPIRED_EVENT)
            self._chunk(b"")

        def _relay(
            self,
            target: str,
            headers: list[tuple[str, str]],
            body: bytes | None,
            *,
            stream: bool,
            sharded_watch: bool = False,
            sharded_list: bool = False,
            generation: int = -1,
        ) -> None:
            request = endpoint.client.build_request(self.command, target, headers=headers, content=body)
            try:
                response = endpoint.client.send(request, stream=True)
            except httpx.HTTPError as e:
                self._status(503, "ServiceUnavailable", f"the range filter proxy cannot be reached: {e}")
                return
            try:
                chunked = stream and response.status_code == 200
                data = b"" if chunked else response.read()
                if sharded_list and response.status_code == 200:
                    endpoint.issued(_resource_version(data, "metadata"), generation)
                self.send_response(response.status_code)
                for k, v in response.headers.multi_items():
                    if k.lower() not in _NOT_RELAYED:
                        self.send_header(k, v)
                if not chunked:
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if sharded_watch:
                    self._relay_watch(response, generation)
                else:
                    for chunk in response.iter_raw():
                        self._chunk(chunk)
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError):
                log.debug("%s: the client went away", endpoint.name)
            finally:
                response.close()

        def _relay_watch(self, response: httpx.Response, generation: int) -> None:
            watch = _Watch(response)
            endpoint.register(watch, generation)
            try:
                try:
                    for line in response.iter_lines():
                        if watch.reset:  # cut: nothing more of the range served before is relayed
                            break
                        if line:
                            endpoint.issued(_resource_version(line, "object", "metadata"), generation)
                            self._chunk(line.encode() + b"\n")
                except (BrokenPipeError, ConnectionResetError):
                    raise
                except Exception:
                    if not watch.reset:
                        raise
                if watch.reset:
                    self._chunk(_EXPIRED_EVENT)
            except httpx.HTTPError as e:
                log.debug("%s: upstream watch ended: %s", endpoint.name, e)
            finally:
                endpoint.forget(watch)

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


def _resource_version(data: bytes | str, *path: str) -> str:
    """``<path>.resourceVersion`` of a JSON list (path ``metadata``) or watch event (``object, metadata``), or ""."""
    try:
        found = orjson.loads(data)
        for key in (*path, "resourceVersion"):
            found = found.get(key, {})
    except (orjson.JSONDecodeError, AttributeError):
        return ""
    return found if isinstance(found, str) else ""


def _streaming(params: dict[str, str]) -> bool:
    return any(params.get(k, "").lower() in ("true", "1", "t") for k in ("watch", "follow"))


class Child:
    """The external controller's process, restarted with backoff (see module docstring)."""

    def __init__(
        self,
        name: str,
        command: list[str],
        endpoint_url: str,
        *,
        controller_type: str,
        instance_id: str,
        liveness_probe: LivenessProbeSection | None = None,
        on_restart: Callable[[], None] | None = None,
        on_probe: Callable[[ProbeResult], None] | None = None,
    ) -> None:
        self.name = name
        self.command = command
        self.controller_type = controller_type
        self.instance_id = instance_id
        self._dir = Path(tempfile.mkdtemp(prefix=f"rangeshard-external-{name}-"))
        self.kubeconfig = self._dir / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump(_kubeconfig(endpoint_url), sort_keys=False))
        #: The variables the manager sets for the controller (also ``$(NAME)`` in ``command``, see :func:`expand`).
        self.variables = {
            "KUBECONFIG": str(self.kubeconfig),
            "RANGESHARD_INSTANCE_ID": instance_id,
            "RANGESHARD_CONTROLLER_TYPE": controller_type,
        }
        self.prober: Prober | None = None
        if liveness_probe is not None:
            action = liveness_probe.http_get
            port = (action.port or pick_port(action.host)) if action is not None else None
            if port is not None:
                self.variables["RANGESHARD_PROBE_PORT"] = str(port)
            env = {**os.environ, **self.variables}
            self.prober = Prober(name, liveness_probe, port=port, env=env, on_result=on_probe)
        self._on_restart = on_restart
        self.proc: subprocess.Popen[bytes] | None = None
        #: Monotonic time since when the controller has not been running (``None`` while it runs).
        self._down_since: float | None = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def down_for(self) -> float | None:
        """Seconds the controller has not been running (``None``: it runs)."""
        if self.running:
            return None
        since = self._down_since
        return time.monotonic() - since if since is not None else 0.0

    def start(self) -> None:
        if self.prober is not None:
            self.prober.start()
        self._thread = start_thread(f"external-{self.name}-child", self._run, what=f"external {self.name}: child")

    def _run(self) -> None:
        backoff = 1.0
        command = [expand(arg, self.variables) for arg in self.command]
        while not self._stop.is_set():
            env = {**os.environ, **self.variables}
            try:
                self.proc = subprocess.Popen(
                    command,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    preexec_fn=_die_with_parent,  # noqa: PLW1509 (prctl only; no locks taken)
                )
            except OSError as e:
                log.error("%s: cannot start %s: %s", self.name, self.command[0], e)
            else:
                started = time.monotonic()
                self._down_since = None
                proc = self.proc
                log.info("%s: started %s (pid %s)", self.name, " ".join(command), proc.pid)
                if self.prober is not None:
                    self.prober.watch(functools.partial(self._liveness_failed, proc))
                self._copy_output(proc)
                code = proc.wait()
                if self.prober is not None:
                    self.prober.unwatch()
                self._down_since = time.monotonic()
                if self._stop.is_set():
                    return
                if time.monotonic() - started > 60:
                    backoff = 1.0
                log.warning("%s: the controller exited with code %s; restarting in %.0fs", self.name, code, backoff)
                if self._on_restart is not None:
                    self._on_restart()
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)

    def _copy_output(self, proc: subprocess.Popen[bytes]) -> None:
        out = proc.stdout
        if out is None:
            return
        with out:  # closed at the child's end: each restart opens a new pipe
            for raw in out:
                log.info("[%s] %s", self.name, raw.decode("utf-8", "replace").rstrip())

    def _liveness_failed(self, proc: subprocess.Popen[bytes], result: ProbeResult, failures: int) -> None:
        """The prober's failure action (its thread): SIGKILL this run's process; :meth:`_run` restarts it."""
        log.warning(
            "%s: liveness probe failed %d times (%s): killing the controller (SIGKILL)",
            self.name,
            failures,
            result.answer,
        )
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)  # a no-op once the run ended and was reaped

    def stop(self, grace: float = 10.0) -> None:
        self._stop.set()
        if self.prober is not None:
            self.prober.stop()
        if self.proc is not None:
            terminate(self.proc, grace)
        if self._thread is not None:
            self._thread.join(5)


_VARIABLE_RE = re.compile(r"(\$?)\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(arg: str, variables: Mapping[str, str]) -> str:
    """``$(NAME)`` in a command argument replaced by the manager's variable ``NAME``, as the kubelet spells it.

    Only the variables the manager sets for the controller are expanded
    (``KUBECONFIG``, ``RANGESHARD_*``); any other ``$(...)`` stays as written,
    and ``$$(NAME)`` is the escape for a literal ``$(NAME)``. No shell is involved.
    """

    def one(found: re.Match[str]) -> str:
        escaped, name = found.group(1), found.group(2)
        if escaped:
            return found.group(0)[1:]
        return variables.get(name, found.group(0))

    return _VARIABLE_RE.sub(one, arg)


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when the manager dies (Linux ``PR_SET_PDEATHSIG``), no orphans."""
    with contextlib.suppress(Exception):
        import ctypes  # noqa: PLC0415 (only in the forked child)

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


def _kubeconfig(url: str) -> dict[str, Any]:
    """A kubeconfig for the endpoint: plain HTTP on loopback, no credentials.

    ``insecure-skip-tls-verify`` has no meaning for an ``http://`` server, but
    the JavaScript client (``@kubernetes/client-node``) refuses plain HTTP
    without it ("HTTP protocol is not allowed when skipTLSVerify is not set").
    """
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "rangeshard", "cluster": {"server": url, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "rangeshard", "user": {}}],
        "contexts": [{"name": "rangeshard", "context": {"cluster": "rangeshard", "user": "rangeshard"}}],
        "current-context": "rangeshard",
    }


class ExternalRuntime:
    """One external controller type in this process: its shard instance, endpoint and child."""

    workers = 0

    def __init__(
        self,
        name: str,
        section: ExternalSection,
        *,
        controller_type: str,
        proxy_url: str,
        proxy_token_file: str | None,
        proxy_ca_cert: str | None,
        etcd_config: EtcdConfig,
        registry_prefix: str,
        instance_id: str,
        lease_ttl: int,
        reconcile_timeout: float,
        metrics: Metrics,
        host: str | None = None,
        pid: int | None = None,
        rejoin_grace: float = 0.0,
    ) -> None:
        self.name = controller_type
        self.instance_id = instance_id
        self.lease_ttl = lease_ttl
        endpoint: Endpoint | None = None

        def make_shard() -> ShardInstance:
            return ShardInstance(
                etcd_config=etcd_config,
                registry_prefix=registry_prefix,
                controller_type=controller_type,
                instance_id=instance_id,
                lease_ttl=lease_ttl,
                reconcile_timeout=reconcile_timeout,
                synced=lambda epoch: endpoint is not None and endpoint.synced(epoch),
                on_epoch=lambda: endpoint.on_epoch() if endpoint is not None else None,
                on_allowed=lambda: endpoint.on_allowed() if endpoint is not None else None,
                workload=lambda _rng: (0, None),
                on_state=lambda s: metrics.set_state(controller_type, instance_id, s),
                on_token=lambda t: endpoint.on_token(t) if endpoint is not None else None,
                host=host,
                pid=pid,
                on_count=lambda event: metrics.handover.labels(controller_type, event).inc(),
                rejoin_grace=rejoin_grace,
                drained=lambda: endpoint is not None and endpoint.drained(),
            )

        self._make_shard = make_shard
        self.shard = make_shard()
        endpoint = Endpoint(
            controller_type,
            section,
            self.shard,
            proxy_url=proxy_url,
            token_file=proxy_token_file,
            ca_cert=proxy_ca_cert,
        )
        self.endpoint = endpoint
        self.child = (
            Child(
                name,
                list(section.command),
                endpoint.url,
                controller_type=controller_type,
                instance_id=instance_id,
                liveness_probe=section.liveness_probe,
                on_restart=lambda: metrics.external_restarts.labels(controller_type).inc(),
                on_probe=lambda result: metrics.external_probes.labels(
                    controller_type, "successful" if result.ok else "failed"
                ).inc(),
            )
            if section.command
            else None
        )
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._supervisor: threading.Thread | None = None
        metrics.set_state(controller_type, instance_id, "init")

    @property
    def ready(self) -> bool:
        return self.shard.allowed is not None and (self.child is None or self.child.running)

    def not_ready_reason(self) -> str | None:
        if self.ready:
            return None
        if self.shard.fatal is not None:
            return self.shard.fatal
        if self.child is not None and not self.child.running:
            return "the external controller is not running"
        return f"{self.shard.state} (waiting for a handover)"

    def start(self) -> None:
        self.endpoint.start()
        self.shard.start()
        if self.child is not None:
            self.child.start()
            self._supervisor = start_thread(
                f"external-{self.name}-membership", self._supervise, what=f"external {self.name}: membership"
            )

    def _supervise(self) -> None:
        """A controller down longer than ``leaseTTLSeconds`` must not keep its range: leave, rejoin when it runs.

        Transitions (``member`` is whether a :class:`ShardInstance` is registered)::

            member ──(child down > leaseTTLSeconds)──► left (record deleted; neighbours take the range)
            left ──(child running again)──► member (a fresh join: locked if it splits a busy range)
        """
        child = self.child
        if child is None:
            return
        member = True
        while not self._stop.wait(0.2):
            down = child.down_for()
            if member and down is not None and down > self.lease_ttl:
                log.warning(
                    "%s: the external controller has been down for %.1fs (> leaseTTLSeconds %s): "
                    "leaving the registry until it runs again",
                    self.name,
                    down,
                    self.lease_ttl,
                )
                with self._lock:
                    if self._stop.is_set():
                        return
                    self.shard.rejoin_grace = 0.0  # a real leave: the range goes to the neighbours now
                    self.shard.stop(drain_timeout=0.0)
                    member = False
            elif not member and down is None:
                with self._lock:
                    if self._stop.is_set():
                        return
                    shard = self._make_shard()
                    self.shard = shard
                    self.endpoint.shard = shard
                    shard.start()
                    member = True
                log.info("%s: the external controller runs again: joining the registry", self.name)

    def stop(self) -> None:
        """Graceful leave: the instance drains and leaves first, then the child stops, then the endpoint."""
        with self._lock:
            self._stop.set()
            shard = self.shard
        if not shard.leaving:
            shard.stop()
        if self._supervisor is not None:
            self._supervisor.join(5)
        if self.child is not None:
            self.child.stop()
        self.endpoint.stop()
