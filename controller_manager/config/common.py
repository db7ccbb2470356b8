"""Shared pieces of the config models: the frozen section base, name checks, defaults.

The field types the components share (port, key prefix, API URL, etcd endpoints) are
:mod:`rangeshard.core.settings`'s.

Invariants
    Every section forbids unknown keys and is frozen; numbers are not coerced.

Concurrency model
    Pure functions and immutable models.
"""

from __future__ import annotations

import re

from pydantic import (
    BaseModel,
    ConfigDict,
)

BUILTIN_CONTROLLERS: dict[str, str] = {
    "replicaset": "controller_manager.controllers.replicaset:ReplicaSetController",
    "deployment": "controller_manager.controllers.deployment:DeploymentController",
}
"""The one list of the built-in controllers: name -> ``module:Class`` (imported only when a manager runs one)."""
KNOWN_CONTROLLERS: tuple[str, ...] = tuple(BUILTIN_CONTROLLERS)
"""Built-in controller types, in the order they are documented."""

MAX_WORKERS = 64
DEFAULT_ETCD = "http://127.0.0.1:2379"
DEFAULT_PROXY = "http://127.0.0.1:8001"

# Registry names are lowercase DNS-ish (see registry.models.NAME_RE); a prefix may end in "-", "." or "_".
INSTANCE_PREFIX_RE = re.compile(r"^[a-z0-9][-a-z0-9_.]{0,199}$")


_CONTROLLER_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$")


def check_controller_name(name: str) -> str:
    # Which class runs it is decided by controller_manager.plugins (built-ins, `class:`, entry points).
    if not _CONTROLLER_NAME_RE.match(name):
        raise ValueError(
            f"controller name {name!r} must be 1..63 lowercase letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return name


def none_to_empty_mapping(value: object) -> object:
    return {} if value is None else value


DEFAULT_RECONCILE_TIMEOUT = 3.0


def derived_reconcile_timeout(lease_ttl_seconds: int) -> float:
    """The default ``reconcileTimeoutSeconds`` for a TTL: ``min(3, 0.3 * TTL)``, below ``TTL / 2`` for any TTL."""
    return min(DEFAULT_RECONCILE_TIMEOUT, round(0.3 * lease_ttl_seconds, 3))


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
