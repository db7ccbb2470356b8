"""The edge to etcd: endpoint configuration, client construction, error translation.

Purpose
    Everything that talks to etcd goes through :class:`EtcdClient`, a thin
    wrapper over ``pyetcd`` (the etcd-sdk-python client) that

    * parses endpoints from ``--etcd URL[,URL...]`` or ``RANGESHARD_ETCD``,
    * supports TLS (CA, client cert/key) and username/password,
    * puts a deadline on every unary call,
    * fails over between the members of an etcd cluster within that deadline
      (:meth:`EtcdClient.call`),
    * opens prefix watches (:meth:`EtcdClient.watch_prefix`) that deliver our
      own :class:`WatchBatch` values, so no pyetcd type leaves this module,
    * and translates gRPC/pyetcd errors into :mod:`rangeshard.core.errors`
      (``raise RegistryUnavailable(...) from e``).

Invariants
    * pyetcd and grpc are imported here only (import-linter contract).
    * One pyetcd client (channel) per member; pyetcd's own failover (which
      marks an endpoint failed for 300 s, or with ``time_retry=0`` retries the
      same one first) is not used. A member that could not answer is tried
      *last* for a back-off (1 s doubling to 30 s), shared by every client of
      the process, and first again once it answers.
    * A call that may have been applied (a timeout, a reset connection) is
      retried on another member only when it is idempotent (reads,
      keepalives, lease grants, read-only transactions); one that cannot have
      been sent (connection refused, no leader) always is. Each attempt gets
      a third of the deadline (at least 0.25 s) so a hung member cannot use
      all of it.
    * No pyetcd or grpc exception escapes this module's public methods.
    * With username/password, the etcd auth token travels as call metadata,
      so authentication works over plaintext as well as TLS endpoints; a
      token etcd rejects (expired, invalidated) is replaced by
      authenticating again, and the call is retried once
      (:meth:`EtcdClient.call`).

Concurrency model
    A gRPC channel is thread-safe; one :class:`EtcdClient` may be shared by
    threads for unary calls (member health is guarded by a lock; the
    preferred member is a plain attribute, last writer wins). A watch needs a
    client of its own (one watch per client; the membership watch of
    :mod:`registry.watch` opens one per attempt) so a broken watch
    stream cannot disturb other work.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

# Before gRPC loads: our processes fork only to exec a child at once (a
# subprocess with a ``preexec_fn``: every child started by
# ``rangeshard.core.process.popen`` sets PR_SET_PDEATHSIG). gRPC's fork
# handlers, on by default in its wheels, then restart its event engine in
# the forked child, which aborts it now and then
# (SIGABRT in about 4 % of such forks while a watch and writes run; measured
# 6 of 150, and 0 of 150 with the handlers off). No forked child of ours uses
# gRPC, so the handlers are turned off unless the user chose otherwise.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # after the environment above
import pyetcd
import pyetcd.events as etcd_events
import pyetcd.exceptions as etcd_exc
from pyetcd import etcdrpc
from pyetcd import transactions as etcd_txn
from pyetcd.utils import prefix_range_end

from rangeshard.core.errors import ConfigError, RegistryError, RegistryUnavailable, WatchCompacted

log = logging.getLogger(__name__)

ENV_ENDPOINTS = "RANGESHARD_ETCD"
DEFAULT_ENDPOINT = "http://127.0.0.1:2379"
DEFAULT_TIMEOUT = 5.0

T = TypeVar("T")

# Keep the HTTP/2 connection honest during partitions: a silent peer is
# detected by pings on active streams (etcd's default minimum ping interval is 5 s).
_GRPC_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


@dataclass(frozen=True)
class EtcdEndpoint:
    """One etcd endpoint: ``host:port`` and whether it speaks TLS."""

    host: str
    port: int
    secure: bool

    @property
    def url(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.host}:{self.port}"


@dataclass(frozen=True)
class EtcdConfig:
    """How to reach etcd. Secrets (``password``) are never logged or printed."""

    endpoints: tuple[EtcdEndpoint, ...]
    ca_cert: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT

    @classmethod
    def from_urls(
        cls,
        urls: str | Sequence[str] | None = None,
        *,
        ca_cert: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        username: str | None = None,
        password: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> EtcdConfig:
        """Build a config from ``URL[,URL...]`` (or a list); fall back to ``$RANGESHARD_ETCD``.

        Raises :class:`ConfigError` naming the bad URL.
        """
        if not urls:
            urls = os.environ.get(ENV_ENDPOINTS) or DEFAULT_ENDPOINT
        items = [u.strip() for u in urls.split(",")] if isinstance(urls, str) else [u.strip() for u in urls]
        items = [u for u in items if u]
        if not items:
            raise ConfigError("etcd: no endpoint given")
        endpoints = tuple(parse_endpoint(u) for u in items)
        if (cert_file is None) != (key_file is None):
            raise ConfigError("etcd: a client certificate needs both cert and key files")
        if (username is None) != (password is None):
            raise ConfigError("etcd: authentication needs both username and password")
        if timeout <= 0:
            raise ConfigError(f"etcd: timeout must be positive, got {timeout}")
        return cls(endpoints, ca_cert, cert_file, key_file, username, password, timeout)

    @property
    def urls(self) -> str:
        """The endpoints as a comma-separated URL list (no secrets)."""
        return ",".join(e.url for e in self.endpoints)


def parse_endpoint(url: str) -> EtcdEndpoint:
    """Parse ``http://host[:port]``, ``https://host[:port]`` or ``host:port`` (ConfigError otherwise)."""
    want = "want http://HOST:PORT, https://HOST:PORT or HOST:PORT"
    text = url if "://" in url else f"http://{url}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:
        raise ConfigError(f"etcd endpoint {url!r}: invalid URL ({e}); {want}") from e
    if any(c.isspace() for c in url):
        raise ConfigError(f"etcd endpoint {url!r}: a URL has no spaces; {want}")
    if "://" not in url and port is None:
        # A bare word such as "foo" is a typo far more often than a host on the default port.
        raise ConfigError(f"etcd endpoint {url!r}: not a valid URL; {want}")
    if port == 0:
        raise ConfigError(f"etcd endpoint {url!r}: port must be 1-65535")
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"etcd endpoint {url!r}: scheme must be http or https")
    if not parts.hostname:
        raise ConfigError(f"etcd endpoint {url!r}: no host")
    if parts.path not in ("", "/") or parts.query:
        raise ConfigError(f"etcd endpoint {url!r}: expected scheme://host:port and nothing else")
    return EtcdEndpoint(parts.hostname, port or 2379, parts.scheme == "https")


def translate(e: BaseException, what: str) -> RegistryError:
    """Map a pyetcd/gRPC error to our tree (the caller raises it ``from e``)."""
    if isinstance(
        e,
        etcd_exc.ConnectionFailedError | etcd_exc.ConnectionTimeoutError | etcd_exc.NoServerAvailableError,
    ):
        return RegistryUnavailable(f"{what}: etcd unreachable ({e})")
    if isinstance(e, etcd_exc.WatchTimedOut):
        return RegistryUnavailable(f"{what}: etcd did not confirm the watch in time")
    if isinstance(e, grpc.RpcError):
        code = e.code() if hasattr(e, "code") else None
        details = e.details() if hasattr(e, "details") else str(e)
        if code in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.CANCELLED,
        ):
            return RegistryUnavailable(f"{what}: etcd unreachable ({details})")
        return RegistryError(f"{what}: etcd error {code}: {details}")
    if isinstance(e, ValueError) and "failed node" in str(e):
        return RegistryUnavailable(f"{what}: etcd endpoint marked failed")
    return RegistryError(f"{what}: {type(e).__name__}: {e}")


#: Transaction building blocks (compares ``txn.Mod(key) == rev``, operations ``txn.Put``/``txn.Delete``).
txn = etcd_txn


def prefix_end(prefix: str) -> bytes:
    """The range end that makes ``[prefix, end)`` cover every key under ``prefix``."""
    return bytes(prefix_range_end(prefix.encode()))


@dataclass(frozen=True)
class KV:
    """One key-value pair as read from etcd."""

    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    version: int
    lease_id: int


#: A member that failed is tried last for this long, doubling per consecutive failure up to the cap.
MEMBER_BACKOFF_INITIAL = 1.0
MEMBER_BACKOFF_MAX = 30.0
#: The shortest time one attempt on one member may take before the next member is tried.
MIN_ATTEMPT_TIMEOUT = 0.25


class _Health:
    """How one member has fared lately, shared by every client of this process (see module docstring)."""

    def __init__(self) -> None:
        self.failures = 0
        self.retry_after = 0.0

    def in_backoff(self, now: float) -> bool:
        return now < self.retry_after


_health: dict[str, _Health] = {}
_health_lock = threading.Lock()


class _Member:
    """One etcd member: its own pyetcd client (channel and stubs) and its shared health."""

    def __init__(self, endpoint: EtcdEndpoint, raw: Any, attempt_timeout: float) -> None:
        self.endpoint = endpoint
        self.raw = raw
        self.attempt_timeout = attempt_timeout
        with _health_lock:
            self.health = _health.setdefault(f"{endpoint.host}:{endpoint.port}", _Health())

    def failed(self, e: BaseException) -> None:
        with _health_lock:
            h = self.health
            h.failures += 1
            backoff = min(MEMBER_BACKOFF_MAX, MEMBER_BACKOFF_INITIAL * 2 ** min(h.failures - 1, 10))
            h.retry_after = time.monotonic() + backoff
        log.debug("etcd member %s failed (%s); tried last for %.0fs", self.endpoint.url, _details(e), backoff)

    def succeeded(self) -> None:
        if self.health.failures:
            with _health_lock:
                self.health.failures = 0
                self.health.retry_after = 0.0


def _retry_kind(e: BaseException) -> str | None:
    """Whether another member may answer what failed here.

    ``"unsent"``: the request never reached a member that could act on it
    (connection refused, no leader): any call may be retried. ``"unknown"``:
    it may have been applied (a reset connection, a timeout, a leader change
    mid-request): only idempotent calls are retried. ``None``: an answer
    (a compare failure, a permission error...), not retried.
    """
    if isinstance(e, etcd_exc.NoServerAvailableError):
        return "unsent"
    if isinstance(e, etcd_exc.WatchTimedOut):
        return "unknown"
    rpc = e if isinstance(e, grpc.RpcError) else e.__context__
    code = rpc.code() if isinstance(rpc, grpc.RpcError) and hasattr(rpc, "code") else None
    if code is None:
        return "unknown" if isinstance(e, etcd_exc.ConnectionFailedError | etcd_exc.ConnectionTimeoutError) else None
    if code == grpc.StatusCode.UNAVAILABLE:
        details = _details(rpc).lower() if rpc is not None else ""
        if any(s in details for s in _UNSENT):
            return "unsent"
        return "unknown"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "unknown"
    return None


_UNSENT = ("failed to connect", "connection refused", "no leader", "name resolution", "dns", "no route to host")


class EtcdClient:
    """A connection to an etcd cluster with member failover and error translation (see module docstring)."""

    def __init__(self, config: EtcdConfig) -> None:
        self.config = config
        creds = None
        if any(e.secure for e in config.endpoints) or config.ca_cert:
            creds = _channel_credentials(config)
        n = len(config.endpoints)
        # One attempt per member fits in the overall deadline (a hung member costs a third of it).
        attempt = config.timeout if n == 1 else max(MIN_ATTEMPT_TIMEOUT, config.timeout / min(n, 3))
        self._members: list[_Member] = []
        try:
            for e in config.endpoints:
                ep = pyetcd.Endpoint(
                    e.host,
                    e.port,
                    secure=e.secure or config.ca_cert is not None,
                    creds=creds,
                    time_retry=0.0,
                    opts=_GRPC_OPTIONS,
                )
                raw = pyetcd.MultiEndpointEtcd3Client(endpoints=[ep], timeout=attempt, failover=False)
                # gRPC refuses call credentials on a plaintext channel ("insufficient security level");
                # the auth token travels as call metadata on every call, which is all etcd needs.
                raw.call_credentials = None
                self._members.append(_Member(e, raw, attempt))
        except (etcd_exc.Etcd3Exception, grpc.RpcError) as e:
            self.close()
            raise translate(e, f"connecting to {config.urls}") from e
        # Spread clients over the members; a member that works stays preferred.
        self._preferred = random.randrange(n)
        self.txn = etcd_txn
        self._auth_lock = threading.Lock()
        self._watching = False
        #: How often etcd rejected the token and this client authenticated again.
        self.reauthentications = 0
        if config.username:
            try:
                self._authenticate()
            except RegistryError:
                self.close()
                raise

    @property
    def raw(self) -> Any:
        """The pyetcd client of the preferred member (tests and diagnostics only)."""
        return self._members[self._preferred].raw

    def close(self) -> None:
        for m in self._members:
            with contextlib.suppress(Exception):
                m.raw.close()

    def __enter__(self) -> EtcdClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- member choice -----------------------------------------------------
    def _order(self) -> list[_Member]:
        """Members to try, in order: the preferred one, the others, then those in back-off (oldest first)."""
        now = time.monotonic()
        n = len(self._members)
        ranked = [self._members[(self._preferred + i) % n] for i in range(n)]
        healthy = [m for m in ranked if not m.health.in_backoff(now)]
        backing_off = sorted((m for m in ranked if m.health.in_backoff(now)), key=lambda m: m.health.retry_after)
        return healthy + backing_off

    def _on_member(self, what: str, op: Callable[[_Member], T], *, idempotent: bool = True) -> T:
        """Run ``op`` on one member after another until one answers, within the overall deadline."""
        deadline = time.monotonic() + self.config.timeout
        last: BaseException | None = None
        for member in self._order():
            if last is not None and time.monotonic() >= deadline:
                break
            try:
                result = op(member)
            except (etcd_exc.Etcd3Exception, grpc.RpcError) as e:
                kind = _retry_kind(e)
                if kind is None:
                    raise translate(e, what) from e
                member.failed(e)
                last = e
                if kind == "unknown" and not idempotent:
                    break  # it may have been applied: the caller decides (re-read, retry)
                continue
            member.succeeded()
            self._preferred = self._members.index(member)
            return result
        if last is None:
            raise RegistryUnavailable(f"{what}: no etcd member to ask")
        raise translate(last, what) from last

    # -- reads -------------------------------------------------------------
    def get_prefix(self, prefix: str) -> tuple[int, list[KV]]:
        """Return ``(revision, kvs)`` for every key under ``prefix``, sorted by key."""
        resp = self.call(
            f"reading {prefix}", lambda raw: raw.get_prefix_response(prefix, sort_order="ascend", sort_target="key")
        )
        return resp.header.revision, [_kv(kv) for kv in resp.kvs]

    def get_range(
        self,
        start: str | bytes,
        end: str | bytes,
        *,
        limit: int | None = None,
        revision: int | None = None,
        keys_only: bool = False,
    ) -> tuple[int, list[KV], bool]:
        """Read ``[start, end)`` in key order; return ``(revision, kvs, more)``.

        ``revision`` reads a past state (``RevisionCompacted`` surfaces as
        :class:`RegistryError` whose message says "compacted").
        """
        resp = self.call(
            f"reading {start!r}..{end!r}",
            lambda raw: raw.get_response(
                start,
                range_end=end,
                limit=limit,
                revision=revision,
                sort_order="ascend",
                sort_target="key",
                keys_only=keys_only,
            ),
        )
        return int(resp.header.revision), [_kv(kv) for kv in resp.kvs], bool(resp.more)

    def get(self, key: str) -> tuple[int, KV | None]:
        """Return ``(revision, kv or None)``."""
        resp = self.call(f"reading {key}", lambda raw: raw.get_response(key))
        return resp.header.revision, (_kv(resp.kvs[0]) if resp.kvs else None)

    def revision(self) -> int:
        """The current store revision (a cheap read; also a liveness probe)."""
        resp = self.call("reading the revision", lambda raw: raw.get_response(_PROBE_KEY))
        return int(resp.header.revision)

    # -- writes (not retried on another member once they may have been applied) --
    def put(self, key: str, value: bytes | str, lease: int = 0) -> int:
        resp = self.call(f"writing {key}", lambda raw: raw.put(key, value, lease=lease or None), idempotent=False)
        return int(resp.header.revision)

    def delete(self, key: str) -> bool:
        return bool(self.call(f"deleting {key}", lambda raw: raw.delete(key), idempotent=False))

    def delete_prefix(self, prefix: str) -> None:
        self.call(f"deleting {prefix}", lambda raw: raw.delete_prefix(prefix), idempotent=False)

    def transaction(
        self,
        compare: list[Any],
        success: list[Any],
        failure: list[Any] | None = None,
        what: str = "transaction",
    ) -> tuple[bool, list[Any]]:
        ok, responses = self.call(
            what,
            lambda raw: raw.transaction(compare=compare, success=success, failure=failure or []),
            idempotent=not any(_writes(op) for op in [*success, *(failure or [])]),
        )
        return bool(ok), responses

    # -- leases ------------------------------------------------------------
    def grant_lease(self, ttl: int) -> int:
        # Retried freely: a lease granted by an attempt whose answer was lost just expires.
        lease = self.call("granting a lease", lambda raw: raw.lease(ttl))
        return int(lease.id)

    def revoke_lease(self, lease_id: int) -> None:
        self.call(f"revoking lease {lease_id:x}", lambda raw: raw.revoke_lease(lease_id), idempotent=False)

    def keepalive_once(self, lease_id: int) -> int:
        """Send one keepalive; return the TTL etcd granted (<= 0: the lease is gone)."""
        responses = self.call(f"renewing lease {lease_id:x}", lambda raw: list(raw.refresh_lease(lease_id)))
        if not responses:
            raise RegistryUnavailable(f"renewing lease {lease_id:x}: no response")
        return int(responses[0].TTL)

    def lease_ttl(self, lease_id: int) -> int:
        """Remaining TTL of a lease in seconds (-1 if it does not exist)."""
        return int(self.call(f"reading lease {lease_id:x}", lambda raw: raw.get_lease_info(lease_id)).TTL)

    # -- maintenance -------------------------------------------------------
    def member_status(self) -> tuple[int, int]:
        """``(member id, leader id)`` from the first member that answers (0 as leader: none known)."""
        resp = self.call(
            "reading the member status",
            lambda raw: raw.maintenancestub.Status(etcdrpc.StatusRequest(), raw.timeout, metadata=raw.metadata),
        )
        return int(resp.header.member_id), int(resp.leader)

    def compact(self, revision: int) -> None:
        self.call(f"compacting to {revision}", lambda raw: raw.compact(revision, physical=True))

    def call(self, what: str, op: Callable[[Any], T], *, idempotent: bool = True) -> T:
        """Run ``op(pyetcd client)`` with member failover and error translation.

        A member that cannot answer (down, hung, no leader) is marked failed
        and the next one is asked, within ``config.timeout`` overall; a call
        that may have been applied is only retried when ``idempotent``.

        When etcd rejects the auth token (expired: a simple token after
        ``--auth-token-ttl`` of inactivity, a JWT after its lifetime, or
        invalidated by an auth change) the client authenticates again with its
        username and password and retries the call once; pyetcd would keep
        sending the dead token forever.
        """

        def attempt(member: _Member) -> T:
            try:
                return op(member.raw)
            except grpc.RpcError as e:
                if not (self.config.username and _token_rejected(e)):
                    raise
                rejected = e
            self.reauthenticate(rejected)
            return op(member.raw)

        return self._on_member(what, attempt, idempotent=idempotent)

    def watch_prefix(
        self, prefix: str, callback: WatchCallback, *, start_revision: int, prev_kv: bool = False
    ) -> PrefixWatch:
        """Watch every key under ``prefix`` from ``start_revision`` (see :class:`PrefixWatch`).

        The watch is opened on the first member that accepts it within the
        client's deadline. One watch per client: progress notifications are
        per stream. Raises :class:`WatchCompacted` at once if
        ``start_revision`` is compacted, :class:`RegistryUnavailable` if no
        member accepts the watch.
        """
        if self._watching:
            raise RuntimeError("an EtcdClient carries one watch; open another client for another watch")

        def open_on(member: _Member) -> PrefixWatch:
            watch = PrefixWatch(member, prefix, callback)
            watch._open(start_revision, prev_kv)
            return watch

        try:
            watch = self._on_member(f"watching {prefix}", open_on)
        except RegistryError as e:
            compacted = e.__cause__
            if isinstance(compacted, etcd_exc.RevisionCompactedError):
                rev = int(compacted.compacted_revision)
                raise WatchCompacted(f"watching {prefix}: revision {start_revision} compacted (at {rev})", rev) from e
            raise
        self._watching = True
        return watch

    def _authenticate(self) -> None:
        request = etcdrpc.AuthenticateRequest(name=self.config.username, password=self.config.password)
        resp = self._on_member(
            "authenticating to etcd", lambda m: m.raw.authstub.Authenticate(request, m.attempt_timeout)
        )
        for m in self._members:
            m.raw.metadata = (("token", resp.token),)

    def reauthenticate(self, cause: BaseException | None = None) -> None:
        """Get a fresh auth token for unary calls (see :meth:`call`).

        pyetcd's watcher stub keeps the token it was created with: watches
        already open keep running, and every watch loop of ours opens a new
        watch on a fresh client (registry.watch, local_apiserver.watch).
        """
        with self._auth_lock:
            log.info("etcd rejected the auth token (%s); authenticating again", _details(cause) if cause else "asked")
            self._authenticate()
            self.reauthentications += 1


_PROBE_KEY = "\0rangeshard-probe"

# -- watches -----------------------------------------------------------------


@dataclass(frozen=True)
class WatchEvent:
    """One change seen by a watch: the key's new state (for a delete, its key and revision)."""

    deleted: bool
    kv: KV
    #: The value before the change (only when the watch asked for ``prev_kv`` and there was one).
    prev_value: bytes | None = None


@dataclass(frozen=True)
class WatchBatch:
    """One watch response: its events (all of one or more whole revisions), or none (a progress notification)."""

    revision: int
    events: tuple[WatchEvent, ...]


#: What a watch callback receives: a batch, or the error that ended the watch (then nothing more).
WatchCallback = Callable[[WatchBatch | RegistryError], None]


class PrefixWatch:
    """One etcd prefix watch on one member (see :meth:`EtcdClient.watch_prefix`).

    The callback runs on pyetcd's watch thread: it receives every
    :class:`WatchBatch`, then at most one :class:`RegistryError` that ends the
    watch (:class:`WatchCompacted`, or :class:`RegistryUnavailable` when the
    stream broke, ended or was cancelled by etcd). The watch never resumes by
    itself: its owner opens a new one from the last revision it applied, on a
    new client, which asks the healthiest member first.
    """

    def __init__(self, member: _Member, prefix: str, callback: WatchCallback) -> None:
        self.member = member
        self.prefix = prefix
        self._callback = callback
        self._watch_id: int | None = None
        self._ended = False
        self._lock = threading.Lock()

    def _open(self, start_revision: int, prev_kv: bool) -> None:
        watcher = self.member.raw.watcher
        original = watcher._handle_response

        def handle(rs: Any) -> None:
            # A progress notification asked for by request_progress has watch id -1 (pyetcd drops it);
            # this stream carries this watch only (one watch per client), so it is ours.
            if rs.watch_id == -1 and not rs.events and not rs.created and not rs.canceled:
                self._deliver(rs)
                return
            if rs.canceled and not rs.compact_revision and rs.watch_id == self._watch_id:
                # pyetcd drops cancellations other than compaction; end the watch instead of hanging.
                reason = rs.cancel_reason or "no reason given"
                self._end(RegistryUnavailable(f"watching {self.prefix}: etcd canceled the watch: {reason}"))
                return
            original(rs)

        watcher._handle_response = handle
        self._watch_id = self.member.raw.add_watch_prefix_callback(
            self.prefix, self._deliver, start_revision=start_revision, prev_kv=prev_kv
        )

    def _deliver(self, response: Any) -> None:
        """Runs on pyetcd's watch thread."""
        if self._ended:
            return
        if response is None:
            self._end(RegistryUnavailable(f"watching {self.prefix}: etcd ended the watch stream"))
            return
        if isinstance(response, etcd_exc.RevisionCompactedError):
            rev = int(response.compacted_revision)
            self._end(WatchCompacted(f"watching {self.prefix}: revision compacted (at {rev})", rev))
            return
        if isinstance(response, BaseException):
            error = translate(response, f"watching {self.prefix}")
            if isinstance(error, RegistryUnavailable):
                self.member.failed(response)
            self._end(error)
            return
        self._callback(WatchBatch(int(response.header.revision), tuple(_watch_event(ev) for ev in response.events)))

    def _end(self, error: RegistryError) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._callback(error)

    def request_progress(self) -> None:
        """Ask etcd for a progress notification (an empty batch at the current revision); best effort."""
        if self._ended:
            return
        try:
            watcher = self.member.raw.watcher
            watcher._request_queue.put_nowait(etcdrpc.WatchRequest(progress_request=etcdrpc.WatchProgressRequest()))
        except Exception:  # no notification this time
            log.debug("progress request failed for %s", self.prefix, exc_info=True)

    def probe(self) -> int:
        """Read the revision from the watch's own member: raises if *that* member stopped answering.

        A hung member keeps its watch stream open and silent; asking any other
        member would not notice.
        """
        try:
            return int(self.member.raw.get_response(_PROBE_KEY).header.revision)
        except (etcd_exc.Etcd3Exception, grpc.RpcError) as e:
            self.member.failed(e)
            raise translate(e, f"probing {self.member.endpoint.url} for the watch on {self.prefix}") from e

    def cancel(self) -> None:
        """Stop the watch (idempotent; no callback after it returns, except one already running)."""
        self._ended = True
        if self._watch_id is not None:
            with contextlib.suppress(Exception):
                self.member.raw.cancel_watch(self._watch_id)


def _writes(op: Any) -> bool:
    """Whether a transaction operation may change the store (anything but a read)."""
    return not isinstance(op, etcd_txn.Get)


def _details(e: BaseException) -> str:
    details = e.details() if isinstance(e, grpc.RpcError) and hasattr(e, "details") else None
    return str(details or type(e).__name__)


def _token_rejected(e: grpc.RpcError) -> bool:
    """etcd's answer to a stale token: UNAUTHENTICATED "etcdserver: invalid auth token"."""
    code = e.code() if hasattr(e, "code") else None
    return code == grpc.StatusCode.UNAUTHENTICATED and "auth token" in _details(e)


def _kv(kv: Any) -> KV:
    return KV(
        key=kv.key.decode("utf-8", "replace"),
        value=bytes(kv.value),
        mod_revision=int(kv.mod_revision),
        create_revision=int(kv.create_revision),
        version=int(kv.version),
        lease_id=int(kv.lease),
    )


def _watch_event(ev: Any) -> WatchEvent:
    raw = ev._event
    has_prev = raw.HasField("prev_kv") and raw.prev_kv.version > 0
    prev_value = bytes(raw.prev_kv.value) if has_prev else None
    return WatchEvent(deleted=isinstance(ev, etcd_events.DeleteEvent), kv=_kv(raw.kv), prev_value=prev_value)


def _channel_credentials(config: EtcdConfig) -> Any:
    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise ConfigError(f"etcd TLS file {path}: {e.strerror}") from e

    return grpc.ssl_channel_credentials(read(config.ca_cert), read(config.key_file), read(config.cert_file))
