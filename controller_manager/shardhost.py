"""What one shard instance is given: its plain settings and the runtime it calls (its host).

Purpose
    :class:`ShardSettings` holds the values of one controller type's instance
    (what the manager's config says); :class:`ShardHost` is what the
    instance (:class:`controller_manager.sharding.ShardInstance`) asks of the
    runtime it serves: the in-process controller framework
    (``ControllerRuntime``) or an external controller's endpoint
    (``ExternalRuntime``). Subclasses inherit the defaults.
    :func:`held_elsewhere` tells whether the record holding an instance id
    belongs to a live process (a second process with one id must never run).

Invariants
    * The host is called only from the instance's state-machine thread, but
      :meth:`ShardHost.on_leaving` and :meth:`ShardHost.drained` during a
      graceful stop (from the thread calling ``stop``).

Concurrency model
    None here: plain values and a protocol.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

from hashing import HashRange
from rangeshard.core.etcd import EtcdConfig
from rangeshard.core.ownertoken import OwnerToken
from registry import ChildInfo, MainResource, Member


@dataclass(frozen=True)
class ShardSettings:
    """The plain values of one shard instance (what the manager's config says for this controller type)."""

    etcd_config: EtcdConfig
    registry_prefix: str
    controller_type: str
    instance_id: str
    lease_ttl: int
    reconcile_timeout: float
    #: Published in the record: where the process runs (a live predecessor is told from a crashed one by it).
    hostname: str | None = None
    pid: int | None = None
    tick: float = 0.1
    #: ``rejoinGraceSeconds``: > 0 parks the record on a graceful stop instead of leaving.
    rejoin_grace: float = 0.0
    #: Published in the record at every join: the proxy it uses (the CLI finds a hand-started manager's proxy).
    proxy_url: str | None = None
    #: Published in the record at every join: the proxy measures this type's progress on it.
    main_resource: MainResource | None = None
    stuck_after_seconds: float | None = None


class ShardHost(Protocol):
    """What the instance asks of its runtime (see Concurrency model); subclasses inherit the defaults."""

    def synced(self, epoch: int) -> bool:
        """Whether every cache has been listed at ``epoch`` (processing resumes only then)."""

    def on_epoch(self) -> None:
        """A new epoch: the range or lock state changed; relist every cache."""

    def on_allowed(self) -> None:
        """Processing resumed: look at every key in range again (keys seen while paused were skipped)."""

    def workload(self, rng: HashRange) -> tuple[int, dict[str, Any] | None]:
        """The object count and histogram over ``rng``, published with each heartbeat."""

    def on_state(self, state: str) -> None:
        """The instance's state changed (``init``, ``locked``, ``wait``, ``active``, ``fenced``, ``parked``)."""

    def on_token(self, token: OwnerToken) -> None:
        """A new owner token: send it with every request from now on."""

    def on_count(self, event: str) -> None:
        """One of :attr:`ShardInstance.counters` went up."""

    def drained(self) -> bool:
        """An extra drain condition of a giver (an external controller: no write in flight, drainSeconds passed)."""
        return True

    def on_fenced(self) -> None:
        """Processing stopped (the fencing deadline passed or the record is gone): stop serving the range."""
        return None

    def on_leaving(self) -> None:
        """A graceful stop began: stop serving the range (then :meth:`drained` is awaited before the lease goes)."""
        return None

    def written_versions(self) -> dict[str, int]:
        """Per shard resource label, the highest resourceVersion of the controller's successful writes (published:
        ``handoverResourceVersions``, :mod:`controller_manager.freshness`)."""
        return {}

    def child_info(self) -> ChildInfo | None:
        """An external controller's process as its manager runs it, published with every heartbeat."""
        return None


def held_elsewhere(member: Member | None, hostname: str | None, seen: float | None) -> tuple[bool, float | None]:
    """Whether ``member`` (the record holding our instance id) belongs to a live process, not a crashed
    predecessor; and the heartbeat time to compare with next time (``seen``: the one seen before).

    Live: on this host with a running pid that is not ours, or its heartbeat
    moved since we first saw it (a live owner heartbeats every TTL/3; a
    crashed one's record only waits for its lease to expire). A parked record is nobody's.
    """
    if member is None or member.record.is_parked:
        return False, seen
    rec = member.record
    if rec.host is not None and rec.host == hostname and rec.pid and rec.pid != os.getpid():
        try:
            os.kill(rec.pid, 0)
        except ProcessLookupError:
            pass
        except PermissionError:
            return True, seen
        else:
            return True, seen
    return seen is not None and rec.heartbeat_at is not None and rec.heartbeat_at != seen, rec.heartbeat_at
