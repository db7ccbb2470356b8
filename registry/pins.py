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
from typing import TYPE_CHECKING

import orjson

from rangeshard.core.errors import ConfigError, NoSplittableRange
from rangeshard.core.etcd import KV, Compare, Put
from registry.models import Snapshot, check_name, now

if TYPE_CHECKING:
    from registry.registry import Layout, Registry

log = logging.getLogger(__name__)


def parse_pins(layout: Layout, kvs: list[KV]) -> dict[str, set[str]]:
    """Pinned instance ids by controller type (keys that are not pins are skipped)."""
    out: dict[str, set[str]] = {}
    for kv in kvs:
        parsed = layout.parse_pin_key(kv.key)
        if parsed is not None:
            out.setdefault(parsed[0], set()).add(parsed[1])
    return out


def pin(registry: Registry, controller_type: str, instance_id: str) -> bool:
    """Pin a registered instance; ``False`` when it already was (see the module docstring)."""
    check_name("controller type", controller_type)
    check_name("instance id", instance_id)
    snap = registry.snapshot(controller_type)
    if snap.get(instance_id) is None:
        known = ", ".join(m.instance_id for m in snap.members) or "none"
        raise ConfigError(
            f"--instance: {instance_id!r} is not a registered instance of {controller_type} (known: {known})"
        )
    key = registry.layout.pin_key(controller_type, instance_id)
    created = registry.client.transaction(
        compare=[Compare.version(key, "==", 0)],
        success=[Put(key, orjson.dumps({"pinnedAt": now()}))],
        what=f"pinning {key}",
    ).succeeded
    if created:
        log.info("pinned %s/%s", controller_type, instance_id)
    return created


def unpin(registry: Registry, controller_type: str, instance_id: str) -> bool:
    """Remove a pin; ``False`` when there was none."""
    check_name("controller type", controller_type)
    check_name("instance id", instance_id)
    removed = registry.client.delete(registry.layout.pin_key(controller_type, instance_id))
    if removed:
        log.info("unpinned %s/%s", controller_type, instance_id)
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
