"""etcd failures become typed errors once, at the edge (rangeshard.core.etcd.errors), never by substring in callers.

gRPC errors are built here as etcd sends them (status code + etcd's exact description,
api/v3rpc/rpctypes/error.go); pyetcd's wrappers keep the gRPC error as context. The same
types against a real etcd: tests/registry/test_etcd_txn.py.
"""

from __future__ import annotations

import grpc
import pyetcd.exceptions as etcd_exc
import pytest

from rangeshard.core.errors import (
    EtcdAuthFailed,
    EtcdRequestTooLarge,
    FutureRevision,
    RegistryError,
    RegistryUnavailable,
    RevisionCompacted,
    WatchCompacted,
)
from rangeshard.core.etcd.errors import retry_kind, token_rejected, translate

Code = grpc.StatusCode


class Rpc(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def wrapped(rpc: Rpc, cls: type[Exception]) -> Exception:
    """What pyetcd raises for some codes: its own class, raised while handling the gRPC error."""
    error = cls()
    error.__context__ = rpc
    return error


@pytest.mark.parametrize(
    ("code", "details", "cls"),
    [
        (Code.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted", RevisionCompacted),
        (Code.OUT_OF_RANGE, "etcdserver: mvcc: required revision is a future revision", FutureRevision),
        (Code.OUT_OF_RANGE, "etcdserver: too large lease TTL", RegistryError),
        (Code.INVALID_ARGUMENT, "etcdserver: request is too large", EtcdRequestTooLarge),
        (Code.RESOURCE_EXHAUSTED, "grpc: received message larger than max (3000000 vs. 2097152)", EtcdRequestTooLarge),
        (Code.RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space exceeded", RegistryError),
        (Code.RESOURCE_EXHAUSTED, "etcdserver: too many requests", RegistryUnavailable),
        (Code.INVALID_ARGUMENT, "etcdserver: authentication failed, invalid user ID or password", EtcdAuthFailed),
        (Code.PERMISSION_DENIED, "etcdserver: permission denied", EtcdAuthFailed),
        (Code.UNAUTHENTICATED, "etcdserver: invalid auth token", EtcdAuthFailed),
        (Code.UNAVAILABLE, "etcdserver: no leader", RegistryUnavailable),
        (Code.DEADLINE_EXCEEDED, "Deadline Exceeded", RegistryUnavailable),
        (Code.NOT_FOUND, "etcdserver: requested lease not found", RegistryError),
    ],
)
def test_grpc_errors_map_to_one_type_each(code: grpc.StatusCode, details: str, cls: type[RegistryError]) -> None:
    error = translate(Rpc(code, details), "reading /x")
    assert type(error) is cls
    assert str(error).startswith("reading /x: ") and details in str(error)


def test_pyetcd_wrappers_are_unwrapped_to_the_grpc_status() -> None:
    refused = wrapped(Rpc(Code.UNAVAILABLE, "failed to connect to all addresses"), etcd_exc.ConnectionFailedError)
    assert type(translate(refused, "w")) is RegistryUnavailable
    assert "failed to connect" in str(translate(refused, "w"))
    timed_out = wrapped(Rpc(Code.DEADLINE_EXCEEDED, "Deadline Exceeded"), etcd_exc.ConnectionTimeoutError)
    assert type(translate(timed_out, "w")) is RegistryUnavailable
    assert type(translate(etcd_exc.ConnectionFailedError(), "w")) is RegistryUnavailable  # no context at all
    compacted = translate(etcd_exc.RevisionCompactedError(42), "watching /p")
    assert isinstance(compacted, WatchCompacted) and isinstance(compacted, RevisionCompacted)
    assert compacted.compacted_revision == 42
    assert type(translate(etcd_exc.WatchTimedOut(), "w")) is RegistryUnavailable


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (Rpc(Code.UNAVAILABLE, "failed to connect to all addresses; last error: Connection refused"), "unsent"),
        (Rpc(Code.UNAVAILABLE, "etcdserver: no leader"), "unsent"),
        (Rpc(Code.UNAVAILABLE, "Socket closed"), "unknown"),
        (Rpc(Code.DEADLINE_EXCEEDED, "Deadline Exceeded"), "unknown"),
        (wrapped(Rpc(Code.UNAVAILABLE, "Connection reset by peer"), etcd_exc.ConnectionFailedError), "unknown"),
        (etcd_exc.NoServerAvailableError(), "unsent"),
        (etcd_exc.WatchTimedOut(), "unknown"),
        (Rpc(Code.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted"), None),
        (Rpc(Code.PERMISSION_DENIED, "etcdserver: permission denied"), None),
    ],
)
def test_which_failures_another_member_may_answer(error: Exception, kind: str | None) -> None:
    assert retry_kind(error) == kind


def test_only_a_stale_token_asks_for_authentication() -> None:
    assert token_rejected(Rpc(Code.UNAUTHENTICATED, "etcdserver: invalid auth token"))
    assert not token_rejected(
        Rpc(Code.INVALID_ARGUMENT, "etcdserver: authentication failed, invalid user ID or password")
    )
    assert not token_rejected(Rpc(Code.PERMISSION_DENIED, "etcdserver: permission denied"))
