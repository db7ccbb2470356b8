"""Our values for etcd's key space: key-value pairs and transactions.

Purpose
    :class:`KV` is a key as read; a transaction is guards (:class:`Compare`) and operations (:class:`Put`,
    :class:`Delete`) answered by a :class:`TxnResult`. Their protobuf messages are built here, so no
    pyetcd type reaches a caller.

Invariants
    Frozen values; keys are ``str`` (UTF-8 in etcd).

Concurrency model
    Immutable values and pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pyetcd import etcdrpc
from pyetcd.utils import prefix_range_end


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


def kv_from(kv: Any) -> KV:
    """Our :class:`KV` of an ``mvccpb.KeyValue`` message."""
    return KV(
        key=kv.key.decode("utf-8", "replace"),
        value=bytes(kv.value),
        mod_revision=int(kv.mod_revision),
        create_revision=int(kv.create_revision),
        version=int(kv.version),
        lease_id=int(kv.lease),
    )


CompareOp = Literal["==", "!=", "<", ">"]
_C = etcdrpc.Compare
_OPS = {"==": _C.EQUAL, "!=": _C.NOT_EQUAL, "<": _C.LESS, ">": _C.GREATER}
_TARGETS = {
    "create": (_C.CREATE, "create_revision"),
    "mod": (_C.MOD, "mod_revision"),
    "version": (_C.VERSION, "version"),
}


@dataclass(frozen=True)
class Compare:
    """One guard: ``target(key) op value``; with ``prefix``, of every key under ``key`` (etcd's range compare).

    Built with :meth:`mod`, :meth:`create` or :meth:`version`; a key that
    does not exist has create revision and version 0.
    """

    target: Literal["create", "mod", "version"]
    key: str
    op: CompareOp
    value: int
    prefix: bool = False

    @classmethod
    def mod(cls, key: str, op: CompareOp, revision: int, *, prefix: bool = False) -> Compare:
        return cls("mod", key, op, revision, prefix)

    @classmethod
    def create(cls, key: str, op: CompareOp, revision: int) -> Compare:
        return cls("create", key, op, revision)

    @classmethod
    def version(cls, key: str, op: CompareOp, version: int) -> Compare:
        return cls("version", key, op, version)


@dataclass(frozen=True)
class Put:
    """Write ``value`` at ``key``, attached to ``lease`` (0: none)."""

    key: str
    value: bytes | str
    lease: int = 0


@dataclass(frozen=True)
class Delete:
    """Delete ``key``."""

    key: str


Op = Put | Delete


@dataclass(frozen=True)
class TxnResult:
    """Whether the guards held (the success branch ran), and the store revision after the transaction.

    When the transaction wrote, ``revision`` is the mod revision of every key it wrote.
    """

    succeeded: bool
    revision: int


def txn_request(compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> Any:
    """The ``TxnRequest`` message of a transaction."""
    ops = {"success": [_op(o) for o in success], "failure": [_op(o) for o in failure]}
    return etcdrpc.TxnRequest(compare=[_compare(c) for c in compare], **ops)


def _compare(c: Compare) -> Any:
    target, field = _TARGETS[c.target]
    message = _C(key=c.key.encode(), result=_OPS[c.op], target=target, **{field: c.value})
    if c.prefix:
        message.range_end = prefix_end(c.key)
    return message


def _op(op: Op) -> Any:
    if isinstance(op, Put):
        value = op.value.encode() if isinstance(op.value, str) else op.value
        return etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=op.key.encode(), value=value, lease=op.lease))
    return etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=op.key.encode()))
