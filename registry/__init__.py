"""The etcd instance registry of rangeshard.

Purpose
    Records of controller instances in etcd (one per instance, bound to its
    lease), the guarded transactions that change membership (join = split the
    largest range, leave, lock/unlock, key moves), a lease keepalive loop, and
    a membership watch that survives etcd restarts. See
    :mod:`registry.registry` for the invariants and :mod:`registry.models` for
    the handover state machine.

Dependency direction
    registry -> hashing (and rangeshard.errors). Never imports the proxy, the
    controller manager or the local API server.

Concurrency model
    Synchronous (pyetcd is a blocking gRPC client); background loops are named
    threads (:class:`LeaseKeeper`, :class:`MembershipWatch`).
"""

from registry.etcd import ENV_ENDPOINTS, KV, EtcdClient, EtcdConfig
from registry.lease import LeaseKeeper
from registry.models import HashHistogram, InstanceRecord, Member, Snapshot, State
from registry.registry import DEFAULT_PREFIX, Layout, Registry
from registry.server import EtcdServer, find_etcd_binary, free_port
from registry.watch import MembershipWatch, RegistryView

__all__ = [
    "DEFAULT_PREFIX",
    "ENV_ENDPOINTS",
    "KV",
    "EtcdClient",
    "EtcdConfig",
    "EtcdServer",
    "HashHistogram",
    "InstanceRecord",
    "Layout",
    "LeaseKeeper",
    "Member",
    "MembershipWatch",
    "Registry",
    "RegistryView",
    "Snapshot",
    "State",
    "find_etcd_binary",
    "free_port",
]
