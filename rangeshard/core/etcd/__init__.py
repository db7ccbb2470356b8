"""The edge to etcd: every etcd call of rangeshard goes through this package.

Owns
    * :mod:`rangeshard.core.etcd.config` - the one endpoint grammar, TLS, credentials (``EtcdConfig``).
    * :mod:`rangeshard.core.etcd.errors` - gRPC/pyetcd failures mapped once, by type, onto our error tree.
    * :mod:`rangeshard.core.etcd.members` - one channel per member; the member health behind failover.
    * :mod:`rangeshard.core.etcd.kv` - ``KV`` and our transaction type (``Compare``, ``Put``, ``Delete``).
    * :mod:`rangeshard.core.etcd.client` - ``EtcdClient``: reads, writes, transactions, leases.
    * :mod:`rangeshard.core.etcd.watch` - prefix watches delivering ``WatchBatch`` values.

Invariants
    * pyetcd and grpc are imported in this package only (import-linter); none of their values or
      exceptions leaves it.
    * gRPC's fork handlers are off unless the user chose otherwise (set before gRPC loads): our
      processes fork only to exec a child at once (every child of ``rangeshard.core.process.popen``
      sets PR_SET_PDEATHSIG in a ``preexec_fn``), and the handlers then restart gRPC's event engine
      in the child, which aborted
      6 of 150 such forks while a watch and writes ran (0 of 150 with them off).

Concurrency model
    See :mod:`rangeshard.core.etcd.client` and :mod:`rangeshard.core.etcd.watch`.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from rangeshard.core.etcd.client import EtcdClient
from rangeshard.core.etcd.config import (
    DEFAULT_ENDPOINT,
    DEFAULT_TIMEOUT,
    ENV_ENDPOINTS,
    EtcdConfig,
    EtcdEndpoint,
    parse_endpoint,
    parse_endpoints,
)
from rangeshard.core.etcd.kv import KV, Compare, Delete, Op, Put, TxnResult, prefix_end
from rangeshard.core.etcd.watch import PrefixWatch, WatchBatch, WatchCallback, WatchEvent

__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_TIMEOUT",
    "ENV_ENDPOINTS",
    "KV",
    "Compare",
    "Delete",
    "EtcdClient",
    "EtcdConfig",
    "EtcdEndpoint",
    "Op",
    "PrefixWatch",
    "Put",
    "TxnResult",
    "WatchBatch",
    "WatchCallback",
    "WatchEvent",
    "parse_endpoint",
    "parse_endpoints",
    "prefix_end",
]
