"""The members of an etcd cluster: one channel each, and how each has fared lately.

Purpose
    :class:`Member` is one member: its own pyetcd client (channel, stubs) and its :class:`Health`,
    shared by every client of the process; :func:`order` asks healthy members first.

Invariants
    * pyetcd's own failover (an endpoint marked failed for 300 s) is not used. A member that could not
      answer is tried *last* for a back-off (1 s doubling to 30 s), first again once it answers.
    * The auth token travels as call metadata (gRPC refuses call credentials on a plaintext channel).

Concurrency model
    Health records are guarded by one process-wide lock; a gRPC channel is thread-safe.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import grpc
import pyetcd

from rangeshard.core.backoff import Backoff
from rangeshard.core.etcd.config import EtcdConfig, EtcdEndpoint
from rangeshard.core.etcd.errors import details

log = logging.getLogger(__name__)

#: A member that failed is tried last for this long, doubling per consecutive failure up to the cap.
MEMBER_BACKOFF_INITIAL = 1.0
MEMBER_BACKOFF_MAX = 30.0
#: The shortest time one attempt on one member may take before the next member is tried.
MIN_ATTEMPT_TIMEOUT = 0.25
#: A key nobody writes: reading it returns the store revision (a cheap liveness probe).
PROBE_KEY = "\0rangeshard-probe"

# Keep the HTTP/2 connection honest during partitions: a silent peer is
# detected by pings on active streams (etcd's default minimum ping interval is 5 s).
_GRPC_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


class Health:
    """How one member has fared lately (see module docstring)."""

    def __init__(self) -> None:
        self.backoff = Backoff(MEMBER_BACKOFF_INITIAL, MEMBER_BACKOFF_MAX)
        self.retry_after = 0.0

    def in_backoff(self, now: float) -> bool:
        return now < self.retry_after


_health: dict[str, Health] = {}
_health_lock = threading.Lock()


class Member:
    """One etcd member: its own pyetcd client (channel and stubs) and its shared health."""

    def __init__(self, endpoint: EtcdEndpoint, raw: Any, attempt_timeout: float) -> None:
        self.endpoint = endpoint
        self.raw = raw
        self.attempt_timeout = attempt_timeout
        with _health_lock:
            self.health = _health.setdefault(endpoint.address, Health())

    def failed(self, e: BaseException) -> None:
        with _health_lock:
            backoff = self.health.backoff.next_delay()
            self.health.retry_after = time.monotonic() + backoff
        log.debug("etcd member %s failed (%s); tried last for %.0fs", self.endpoint.url, details(e), backoff)

    def succeeded(self) -> None:
        if self.health.backoff.failures:
            with _health_lock:
                self.health.backoff.reset()
                self.health.retry_after = 0.0


def connect(config: EtcdConfig) -> list[Member]:
    """One :class:`Member` per endpoint; an attempt on one may use a third of the deadline (at least 0.25 s)."""
    creds = grpc.ssl_channel_credentials(*config.tls_files()) if config.tls else None
    n = len(config.endpoints)
    attempt = config.timeout if n == 1 else max(MIN_ATTEMPT_TIMEOUT, config.timeout / min(n, 3))
    members: list[Member] = []
    try:
        for e in config.endpoints:
            host = e.address.rpartition(":")[0]  # an IPv6 host keeps its brackets
            ep = pyetcd.Endpoint(
                host,
                e.port,
                secure=e.secure or config.ca_cert is not None,
                creds=creds,
                time_retry=0.0,
                opts=_GRPC_OPTIONS,
            )
            raw = pyetcd.MultiEndpointEtcd3Client(endpoints=[ep], timeout=attempt, failover=False)
            raw.call_credentials = None  # the token travels as metadata (see module docstring)
            members.append(Member(e, raw, attempt))
    except BaseException:
        close(members)
        raise
    return members


def order(members: list[Member], preferred: int) -> list[Member]:
    """Members to try, in order: the preferred one, the others, then those in back-off (oldest first)."""
    now = time.monotonic()
    n = len(members)
    ranked = [members[(preferred + i) % n] for i in range(n)]
    healthy = [m for m in ranked if not m.health.in_backoff(now)]
    backing_off = sorted((m for m in ranked if m.health.in_backoff(now)), key=lambda m: m.health.retry_after)
    return healthy + backing_off


def close(members: list[Member]) -> None:
    for m in members:
        with contextlib.suppress(Exception):
            m.raw.close()
