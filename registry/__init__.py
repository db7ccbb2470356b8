"""The etcd instance registry of rangeshard.

Purpose
    Records of controller instances in etcd (one per instance, bound to its
    lease), the guarded transactions that change membership (join = split the
    largest range, leave, lock/unlock, key moves), a lease keepalive loop, and
    a membership watch that survives etcd restarts. See
    :mod:`registry.registry` for the invariants and :mod:`registry.models` for
    the handover state machine.

Owns
    The instance registry only: records (:mod:`registry.models`), where they
    live in etcd (:mod:`registry.layout`), the guarded
    membership transactions (:mod:`registry.registry`), the lease keeper
    (:mod:`registry.lease`), the membership watch (:mod:`registry.watch`),
    pinned instances (:mod:`registry.pins`: a key per pin, outside the lease),
    ownership periods for write fencing (:mod:`registry.epochs`), the
    workload histograms managers publish (:mod:`registry.histogram`),
    rebalance planning (:mod:`registry.rebalance`) and applying a plan
    through the handover protocol (:mod:`registry.apply`). The etcd client and the
    etcd child process are foundation (:mod:`rangeshard.core.etcd`,
    :mod:`rangeshard.core.process`), not registry.

May import
    ``rangeshard.core`` and ``hashing``. Never the proxy, the controller
    manager, the local API server or the CLI (import-linter contract).

Concurrency model
    Synchronous (pyetcd is a blocking gRPC client); background loops are named
    threads (:class:`LeaseKeeper`, :class:`MembershipWatch`).
"""

from registry.layout import DEFAULT_PREFIX, Layout
from registry.lease import LeaseKeeper
from registry.models import (
    DEFAULT_STUCK_AFTER_SECONDS,
    ChildInfo,
    HashHistogram,
    InstanceRecord,
    MainResource,
    Member,
    Snapshot,
    State,
)
from registry.registry import Registry
from registry.watch import MembershipWatch, RegistryView

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_STUCK_AFTER_SECONDS",
    "ChildInfo",
    "HashHistogram",
    "InstanceRecord",
    "Layout",
    "LeaseKeeper",
    "MainResource",
    "Member",
    "MembershipWatch",
    "Registry",
    "RegistryView",
    "Snapshot",
    "State",
]
