"""Pinned instances: a key per pinned instance, outside its lease (``rangeshard rebalance pin|unpin``).

Purpose
    ``<prefix>/pins/<type>/<instance-id>`` (JSON ``{"pinnedAt": <wall seconds>}``)
    says that an instance's range stays as it is: no joiner splits it
    (:mod:`registry.registry`'s join reads the pins with the records and
    guards both in its transaction) and no rebalance plan moves it
    (:func:`registry.rebalance.movable_runs`). The key is bound to no lease, so
    a pin outlives the record: a restart under the same id (parked record,
    ``rejoinGraceSeconds``), a crash and a rejoin.

Invariants
    * Only a registered (running or parked) instance is pinned
      (:class:`ConfigError` otherwise); pinning twice or unpinning what is not
      pinned changes nothing and says so (``False``).

Concurrency model
    Stateless functions over an :class:`~rangeshard.core.etcd.EtcdClient`; any thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import orjson

from rangeshard.core.errors import ConfigError, NoSplittableRange
from rangeshard.core.etcd import KV, Compare, EtcdClient, Put
from registry.models import Snapshot, now

log = logging.getLogger(__name__)


def parse_pins(kvs: list[KV], parse_key: Callable[[str], tuple[str, str] | None]) -> dict[str, set[str]]:
    """Pinned instance ids by controller type (``parse_key``: ``Layout.parse_pin_key``; other keys are skipped)."""
    out: dict[str, set[str]] = {}
    for kv in kvs:
        parsed = parse_key(kv.key)
        if parsed is not None:
            out.setdefault(parsed[0], set()).add(parsed[1])
    return out


def pin(client: EtcdClient, key: str, snap: Snapshot, instance_id: str) -> bool:
    """Pin ``instance_id`` (registered in ``snap``) at ``key``; ``False`` when it already was (module docstring)."""
    if snap.get(instance_id) is None:
        known = ", ".join(m.instance_id for m in snap.members) or "none"
        raise ConfigError(
            f"--instance: {instance_id!r} is not a registered instance of {snap.controller_type} (known: {known})"
        )
    created = client.transaction(
        compare=[Compare.version(key, "==", 0)],
        success=[Put(key, orjson.dumps({"pinnedAt": now()}))],
        what=f"pinning {key}",
    ).succeeded
    if created:
        log.info("pinned %s/%s", snap.controller_type, instance_id)
    return created


def unpin(client: EtcdClient, key: str) -> bool:
    """Remove the pin at ``key``; ``False`` when there was none."""
    removed = client.delete(key)
    if removed:
        log.info("unpinned %s", key)
    return removed


def nothing_to_split(snap: Snapshot) -> NoSplittableRange:
    """Why a joiner cannot join ``snap``'s type: every range is pinned or parked (the manager logs it and retries)."""
    pinned = sorted(m.instance_id for m in snap.members if m.pinned)
    parked = sorted(m.instance_id for m in snap.members if m.record.is_parked and not m.pinned)
    parts = [f"pinned: {', '.join(pinned)} (rangeshard rebalance unpin frees one)"] if pinned else []
    parts += [f"parked (waiting for its instance to rejoin): {', '.join(parked)}"] if parked else []
    why = "; ".join(parts)
    if not parked:
        return NoSplittableRange(
            f"{snap.controller_type}: only pinned ranges exist, a joiner never splits one ({why}); "
            "waiting for an unpinned range"
        )
    return NoSplittableRange(
        f"{snap.controller_type}: every range is parked or pinned ({why}); "
        "a newcomer joins after one rejoined, its grace ran out, or one was unpinned"
    )
