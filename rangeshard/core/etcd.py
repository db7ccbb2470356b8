"""The edge to etcd: endpoint configuration, client construction, error translation.

Purpose
    Everything that talks to etcd goes through :class:`EtcdClient`, a thin
    wrapper over ``pyetcd`` (the etcd-sdk-python client) that

    * parses endpoints from ``--etcd URL[,URL...]`` or ``RANGESHARD_ETCD``,
    * supports TLS (CA, client cert/key) and username/password,
    * puts a deadline on every unary call,
    * and translates gRPC/pyetcd errors into :mod:`rangeshard.core.errors`
      (``raise RegistryUnavailable(...) from e``).

Invariants
    * pyetcd marks an endpoint "failed" for 300 s after one error by default,
      which would make a client useless long after etcd came back; we build
      endpoints with ``time_retry=0`` so the next call tries again at once.
    * No pyetcd or grpc exception escapes this module's public methods.
    * With username/password, the etcd auth token travels as call metadata,
      so authentication works over plaintext as well as TLS endpoints; a
      token etcd rejects (expired, invalidated) is replaced by
      authenticating again, and the call is retried once
      (:meth:`EtcdClient.call`).

Concurrency model
    A gRPC channel is thread-safe; one :class:`EtcdClient` may be shared by
    threads for unary calls. Long-lived watches should use a client of their
    own (the membership watch of :mod:`registry.watch` does) so a broken watch
    stream cannot disturb other work.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import grpc
import pyetcd
import pyetcd.exceptions as etcd_exc
from pyetcd import etcdrpc
from pyetcd import transactions as etcd_txn
from pyetcd.client import EtcdTokenCallCredentials

from rangeshard.core.errors import CompareFailed, ConfigError, RegistryError, RegistryUnavailable

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


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """Context manager translating pyetcd/gRPC errors raised inside it."""
    try:
        yield
    except (etcd_exc.Etcd3Exception, grpc.RpcError) as e:
        raise translate(e, what) from e
    except ValueError as e:
        if "failed node" in str(e):
            raise translate(e, what) from e
        raise


@dataclass(frozen=True)
class KV:
    """One key-value pair as read from etcd."""

    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    version: int
    lease_id: int


class EtcdClient:
    """A connection to etcd with error translation (see module docstring)."""

    def __init__(self, config: EtcdConfig) -> None:
        self.config = config
        creds = None
        if any(e.secure for e in config.endpoints) or config.ca_cert:
            creds = _channel_credentials(config)
        eps = [
            pyetcd.Endpoint(
                e.host,
                e.port,
                secure=e.secure or config.ca_cert is not None,
                creds=creds,
                time_retry=0.0,
                opts=_GRPC_OPTIONS,
            )
            for e in config.endpoints
        ]
        try:
            self.raw: Any = pyetcd.MultiEndpointEtcd3Client(
                endpoints=eps,
                timeout=config.timeout,
                user=config.username,
                password=config.password,
                failover=True,
            )
        except (etcd_exc.Etcd3Exception, grpc.RpcError) as e:
            raise translate(e, f"connecting to {config.urls}") from e
        if creds is None:
            # gRPC refuses call credentials on a plaintext channel ("insufficient
            # security level"); pyetcd also sends the auth token as metadata on
            # every call, which is all etcd needs.
            self.raw.call_credentials = None
        self.txn = etcd_txn
        self._auth_lock = threading.Lock()
        #: How often etcd rejected the token and this client authenticated again.
        self.reauthentications = 0

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.raw.close()

    def __enter__(self) -> EtcdClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reads -------------------------------------------------------------
    def get_prefix(self, prefix: str) -> tuple[int, list[KV]]:
        """Return ``(revision, kvs)`` for every key under ``prefix``, sorted by key."""
        resp = self.call(
            f"reading {prefix}", self.raw.get_prefix_response, prefix, sort_order="ascend", sort_target="key"
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
            self.raw.get_response,
            start,
            range_end=end,
            limit=limit,
            revision=revision,
            sort_order="ascend",
            sort_target="key",
            keys_only=keys_only,
        )
        return int(resp.header.revision), [_kv(kv) for kv in resp.kvs], bool(resp.more)

    def get(self, key: str) -> tuple[int, KV | None]:
        """Return ``(revision, kv or None)``."""
        resp = self.call(f"reading {key}", self.raw.get_response, key)
        return resp.header.revision, (_kv(resp.kvs[0]) if resp.kvs else None)

    def revision(self) -> int:
        """The current store revision (a cheap read; also a liveness probe)."""
        resp = self.call("reading the revision", self.raw.get_response, "\0rangeshard-probe")
        return int(resp.header.revision)

    # -- writes ------------------------------------------------------------
    def put(self, key: str, value: bytes | str, lease: int = 0) -> int:
        resp = self.call(f"writing {key}", self.raw.put, key, value, lease=lease or None)
        return int(resp.header.revision)

    def delete(self, key: str) -> bool:
        return bool(self.call(f"deleting {key}", self.raw.delete, key))

    def delete_prefix(self, prefix: str) -> None:
        self.call(f"deleting {prefix}", self.raw.delete_prefix, prefix)

    def transaction(
        self,
        compare: list[Any],
        success: list[Any],
        failure: list[Any] | None = None,
        what: str = "transaction",
    ) -> tuple[bool, list[Any]]:
        ok, responses = self.call(what, self.raw.transaction, compare=compare, success=success, failure=failure or [])
        return bool(ok), responses

    def guarded(self, compare: list[Any], success: list[Any], what: str) -> None:
        """Run a transaction; raise :class:`CompareFailed` if its compare fails."""
        ok, _ = self.transaction(compare, success, [], what)
        if not ok:
            raise CompareFailed(f"{what}: the registry changed concurrently (compare failed)")

    # -- leases ------------------------------------------------------------
    def grant_lease(self, ttl: int) -> int:
        lease = self.call("granting a lease", self.raw.lease, ttl)
        return int(lease.id)

    def revoke_lease(self, lease_id: int) -> None:
        self.call(f"revoking lease {lease_id:x}", self.raw.revoke_lease, lease_id)

    def keepalive_once(self, lease_id: int) -> int:
        """Send one keepalive; return the TTL etcd granted (<= 0: the lease is gone)."""
        responses = self.call(f"renewing lease {lease_id:x}", lambda: list(self.raw.refresh_lease(lease_id)))
        if not responses:
            raise RegistryUnavailable(f"renewing lease {lease_id:x}: no response")
        return int(responses[0].TTL)

    def lease_ttl(self, lease_id: int) -> int:
        """Remaining TTL of a lease in seconds (-1 if it does not exist)."""
        return int(self.call(f"reading lease {lease_id:x}", self.raw.get_lease_info, lease_id).TTL)

    # -- maintenance -------------------------------------------------------
    def compact(self, revision: int) -> None:
        self.call(f"compacting to {revision}", self.raw.compact, revision, physical=True)

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run any raw pyetcd call with error translation.

        When etcd rejects the auth token (expired: a simple token after
        ``--auth-token-ttl`` of inactivity, a JWT after its lifetime, or
        invalidated by an auth change) the client authenticates again with its
        username and password and retries the call once; pyetcd would keep
        sending the dead token forever.
        """
        with translated(what):
            try:
                return fn(*args, **kwargs)
            except grpc.RpcError as e:
                if not (self.config.username and _token_rejected(e)):
                    raise
                rejected = e
            self.reauthenticate(rejected)
            return fn(*args, **kwargs)

    def reauthenticate(self, cause: BaseException | None = None) -> None:
        """Get a fresh auth token for unary calls (see :meth:`call`).

        pyetcd's watcher stub keeps the token it was created with: watches
        already open keep running, and every watch loop of ours opens a new
        watch on a fresh client (registry.watch, local_apiserver.watch).
        """
        with self._auth_lock:
            log.info("etcd rejected the auth token (%s); authenticating again", _details(cause) if cause else "asked")
            request = etcdrpc.AuthenticateRequest(name=self.config.username, password=self.config.password)
            with translated("authenticating to etcd"):
                resp = self.raw.authstub.Authenticate(request, self.config.timeout)
            self.raw.metadata = (("token", resp.token),)
            if self.raw.call_credentials is not None:
                self.raw.call_credentials = grpc.metadata_call_credentials(EtcdTokenCallCredentials(resp.token))
            self.reauthentications += 1


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
