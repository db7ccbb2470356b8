"""Where the registry's records and pins live in etcd, and how stored records are grouped by type.

Purpose
    :class:`Layout` maps ``(controller type, instance id)`` to
    ``<prefix>/controllers/<type>/<instance-id>`` (and pins to
    ``<prefix>/pins/<type>/<instance-id>``) and back; :func:`parse_members`
    turns the key-values of a prefix read into records per controller type.

Invariants
    * The prefix starts with ``/`` (:class:`~rangeshard.core.errors.ConfigError`
      otherwise) and never ends with one.
    * A key that is not a record (or a value that does not parse) is skipped,
      never fatal: an unreadable record is logged and left out.

Concurrency model
    Immutable values and pure functions.
"""

from __future__ import annotations

import logging

from rangeshard.core.errors import ConfigError
from rangeshard.core.etcd import KV
from registry.models import InstanceRecord

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/rangeshard"


class Layout:
    """Where records live: ``<prefix>/controllers/<type>/<instance-id>``."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        prefix = prefix.rstrip("/")
        if not prefix.startswith("/"):
            raise ConfigError(f"registry prefix {prefix!r} must start with '/'")
        self.prefix = prefix

    @property
    def controllers(self) -> str:
        return f"{self.prefix}/controllers/"

    @property
    def pins(self) -> str:
        """``<prefix>/pins/``: one key per pinned instance, ``<prefix>/pins/<type>/<instance-id>``."""
        return f"{self.prefix}/pins/"

    def pin_prefix(self, controller_type: str) -> str:
        return f"{self.pins}{controller_type}/"

    def pin_key(self, controller_type: str, instance_id: str) -> str:
        return f"{self.pin_prefix(controller_type)}{instance_id}"

    def parse_pin_key(self, key: str) -> tuple[str, str] | None:
        """``(controller_type, instance_id)`` of a pin key, or ``None``."""
        return _type_and_id(key, self.pins)

    def type_prefix(self, controller_type: str) -> str:
        return f"{self.controllers}{controller_type}/"

    def record_key(self, controller_type: str, instance_id: str) -> str:
        return f"{self.type_prefix(controller_type)}{instance_id}"

    def parse_key(self, key: str) -> tuple[str, str] | None:
        """``(controller_type, instance_id)`` of a record key, or ``None``."""
        return _type_and_id(key, self.controllers)


def _type_and_id(key: str, base: str) -> tuple[str, str] | None:
    """``<base><type>/<instance-id>`` as ``(type, instance-id)``; ``None`` for any other key."""
    if not key.startswith(base):
        return None
    rest = key[len(base) :].split("/")
    if len(rest) != 2 or not rest[0] or not rest[1]:
        return None
    return rest[0], rest[1]


def parse_members(layout: Layout, kvs: list[KV]) -> dict[str, list[tuple[InstanceRecord, str, int, int, int]]]:
    """Group parseable records by controller type; log and skip anything else."""
    out: dict[str, list[tuple[InstanceRecord, str, int, int, int]]] = {}
    for kv in kvs:
        parsed = layout.parse_key(kv.key)
        if parsed is None:
            continue
        ctype, iid = parsed
        try:
            rec = InstanceRecord.from_kv(ctype, iid, kv.value)
        except ValueError as e:
            log.warning("ignoring malformed registry record %s: %s", kv.key, e)
            continue
        out.setdefault(ctype, []).append((rec, kv.key, kv.mod_revision, kv.create_revision, kv.lease_id))
    return out
