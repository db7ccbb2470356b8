"""The etcd client: reads, writes, transactions and leases with member failover.

Purpose
    :class:`EtcdClient` puts a deadline on every call, fails over between the members within it,
    authenticates (again, when etcd rejects the token: pyetcd would send the dead one forever), opens
    prefix watches and answers with our values (:mod:`.kv`) or errors (:mod:`.errors`).

Invariants
    * A call that may have been applied (a timeout, a reset connection) is retried on another member
      only when idempotent (reads, keepalives, lease grants, guard-only transactions); one that cannot
      have been sent (connection refused, no leader) always is.
    * No pyetcd or grpc value or exception leaves a public method.

Concurrency model
    Threads may share a client for unary calls (member health is locked; the preferred member is a
    plain attribute, last writer wins). A watch needs a client of its own (one watch per client).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc
import pyetcd.exceptions as etcd_exc
from pyetcd import etcdrpc

from rangeshard.core.errors import RegistryError, RegistryUnavailable
from rangeshard.core.etcd import members as _members
from rangeshard.core.etcd.config import EtcdConfig
from rangeshard.core.etcd.errors import details, retry_kind, token_rejected, translate
from rangeshard.core.etcd.kv import KV, Compare, Op, TxnResult, kv_from, txn_request
from rangeshard.core.etcd.members import PROBE_KEY, Member
from rangeshard.core.etcd.watch import PrefixWatch, WatchCallback

log = logging.getLogger(__name__)

T = TypeVar("T")
_ERRORS = (etcd_exc.Etcd3Exception, grpc.RpcError)


class EtcdClient:
    """A connection to an etcd cluster with member failover and error translation (see module docstring)."""

    def __init__(self, config: EtcdConfig) -> None:
        self.config = config
        try:
            self._members = _members.connect(config)
        except _ERRORS as e:
            raise translate(e, f"connecting to {config.urls}") from e
        # Spread clients over the members; a member that works stays preferred.
        self._preferred = random.randrange(len(self._members))
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

    def close(self) -> None:
        _members.close(self._members)

    def __enter__(self) -> EtcdClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_member(self, what: str, op: Callable[[Member], T], *, idempotent: bool = True) -> T:
        """Run ``op`` on one member after another until one answers, within the overall deadline."""
        deadline = time.monotonic() + self.config.timeout
        last: BaseException | None = None
        for member in _members.order(self._members, self._preferred):
            if last is not None and time.monotonic() >= deadline:
                break
            try:
                result = op(member)
            except _ERRORS as e:
                kind = retry_kind(e)
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

    def _call(self, what: str, op: Callable[[Any], T], *, idempotent: bool = True) -> T:
        """Run ``op(pyetcd client)`` with member failover, re-authentication and error translation."""

        def attempt(member: Member) -> T:
            try:
                return op(member.raw)
            except grpc.RpcError as e:
                if not (self.config.username and token_rejected(e)):
                    raise
                rejected = e
            self.reauthenticate(rejected)
            return op(member.raw)

        return self._on_member(what, attempt, idempotent=idempotent)

    # -- reads -------------------------------------------------------------
    def get_prefix(self, prefix: str) -> tuple[int, list[KV]]:
        """Return ``(revision, kvs)`` for every key under ``prefix``, sorted by key."""
        resp = self._call(
            f"reading {prefix}", lambda raw: raw.get_prefix_response(prefix, sort_order="ascend", sort_target="key")
        )
        return resp.header.revision, [kv_from(kv) for kv in resp.kvs]

    def get_range(
        self, start: str | bytes, end: str | bytes, *, limit: int | None = None, revision: int | None = None
    ) -> tuple[int, list[KV], bool]:
        """Read ``[start, end)`` in key order; return ``(revision, kvs, more)``.

        ``revision`` reads a past state (:class:`RevisionCompacted` if etcd
        compacted it, :class:`FutureRevision` if it is not there yet).
        """
        opts = {"range_end": end, "limit": limit, "revision": revision, "sort_order": "ascend", "sort_target": "key"}
        resp = self._call(f"reading {start!r}..{end!r}", lambda raw: raw.get_response(start, **opts))
        return int(resp.header.revision), [kv_from(kv) for kv in resp.kvs], bool(resp.more)

    def get(self, key: str) -> tuple[int, KV | None]:
        """Return ``(revision, kv or None)``."""
        resp = self._call(f"reading {key}", lambda raw: raw.get_response(key))
        return resp.header.revision, (kv_from(resp.kvs[0]) if resp.kvs else None)

    def revision(self) -> int:
        """The current store revision (a cheap read; also a liveness probe)."""
        return int(self._call("reading the revision", lambda raw: raw.get_response(PROBE_KEY)).header.revision)

    # -- writes (not retried on another member once they may have been applied) --
    def put(self, key: str, value: bytes | str, lease: int = 0) -> int:
        resp = self._call(f"writing {key}", lambda raw: raw.put(key, value, lease=lease or None), idempotent=False)
        return int(resp.header.revision)

    def delete(self, key: str) -> bool:
        return bool(self._call(f"deleting {key}", lambda raw: raw.delete(key), idempotent=False))

    def delete_prefix(self, prefix: str) -> None:
        self._call(f"deleting {prefix}", lambda raw: raw.delete_prefix(prefix), idempotent=False)

    def transaction(
        self,
        compare: Sequence[Compare],
        success: Sequence[Op],
        failure: Sequence[Op] = (),
        what: str = "transaction",
    ) -> TxnResult:
        """If every guard of ``compare`` holds, apply ``success``, else ``failure``, atomically."""
        request = txn_request(compare, success, failure)
        resp = self._call(
            what,
            lambda raw: raw.kvstub.Txn(request, raw.timeout, metadata=raw.metadata),
            idempotent=not (success or failure),
        )
        return TxnResult(bool(resp.succeeded), int(resp.header.revision))

    # -- leases ------------------------------------------------------------
    def grant_lease(self, ttl: int) -> int:
        # Retried freely: a lease granted by an attempt whose answer was lost just expires.
        return int(self._call("granting a lease", lambda raw: raw.lease(ttl)).id)

    def revoke_lease(self, lease_id: int) -> None:
        self._call(f"revoking lease {lease_id:x}", lambda raw: raw.revoke_lease(lease_id), idempotent=False)

    def keepalive_once(self, lease_id: int) -> int:
        """Send one keepalive; return the TTL etcd granted (<= 0: the lease is gone)."""
        responses = self._call(f"renewing lease {lease_id:x}", lambda raw: list(raw.refresh_lease(lease_id)))
        if not responses:
            raise RegistryUnavailable(f"renewing lease {lease_id:x}: no response")
        return int(responses[0].TTL)

    def lease_ttl(self, lease_id: int) -> int:
        """Remaining TTL of a lease in seconds (-1 if it does not exist)."""
        return int(self._call(f"reading lease {lease_id:x}", lambda raw: raw.get_lease_info(lease_id)).TTL)

    # -- maintenance -------------------------------------------------------
    def member_status(self) -> tuple[int, int]:
        """``(member id, leader id)`` from the first member that answers (0 as leader: none known)."""
        resp = self._call(
            "reading the member status",
            lambda raw: raw.maintenancestub.Status(etcdrpc.StatusRequest(), raw.timeout, metadata=raw.metadata),
        )
        return int(resp.header.member_id), int(resp.leader)

    def compact(self, revision: int) -> None:
        self._call(f"compacting to {revision}", lambda raw: raw.compact(revision, physical=True))

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

        def open_on(member: Member) -> PrefixWatch:
            watch = PrefixWatch(member, prefix, callback)
            watch.open(start_revision, prev_kv)
            return watch

        watch = self._on_member(f"watching {prefix} from revision {start_revision}", open_on)
        self._watching = True
        return watch

    # -- authentication ----------------------------------------------------
    def _authenticate(self) -> None:
        request = etcdrpc.AuthenticateRequest(name=self.config.username, password=self.config.password)
        resp = self._on_member(
            "authenticating to etcd", lambda m: m.raw.authstub.Authenticate(request, m.attempt_timeout)
        )
        for m in self._members:
            m.raw.metadata = (("token", resp.token),)

    def reauthenticate(self, cause: BaseException | None = None) -> None:
        """Get a fresh auth token for unary calls (see module docstring).

        pyetcd's watcher stub keeps the token it was created with: watches
        already open keep running, and every watch loop of ours opens a new
        watch on a fresh client (registry.watch, local_apiserver.watch).
        """
        with self._auth_lock:
            log.info("etcd rejected the auth token (%s); authenticating again", details(cause) if cause else "asked")
            self._authenticate()
            self.reauthentications += 1
