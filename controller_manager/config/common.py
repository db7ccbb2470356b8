"""Shared pieces of the config models: the frozen section base, URL and name checks, defaults.

Invariants
    Every section forbids unknown keys and is frozen; numbers are not coerced.

Concurrency model
    Pure functions and immutable models.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
)
from pydantic_core import PydanticCustomError

from rangeshard.core.errors import ConfigError
from rangeshard.core.etcd import parse_endpoint

KNOWN_CONTROLLERS: tuple[str, ...] = ("replicaset", "deployment")
"""Controller types a manager can run, in the order they are documented."""

MAX_WORKERS = 64
DEFAULT_ETCD = "http://127.0.0.1:2379"
DEFAULT_PROXY = "http://127.0.0.1:8001"

# Registry names are lowercase DNS-ish (see registry.models.NAME_RE); a prefix may end in "-", "." or "_".
INSTANCE_PREFIX_RE = re.compile(r"^[a-z0-9][-a-z0-9_.]{0,199}$")
REGISTRY_PREFIX_RE = re.compile(r"^(/[A-Za-z0-9._-]+)+$")

# Error type for cross-field problems raised from model validators; ctx["field"] names the
# field (alias) the problem belongs to, so it is reported at that path.
FIELD_ERROR = "rangeshard_field"


def field_error(field: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(FIELD_ERROR, message, {"field": field})


def check_proxy_url(value: str) -> str:
    """Validate an ``http(s)://host[:port][/path]`` URL; return it without a trailing slash.

    Raises ``ValueError`` with a message that does not repeat credentials.
    """
    text = value.strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"invalid URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("URL scheme must be http or https")
    if parts.username is not None or parts.password is not None:
        raise ValueError("URL must not contain credentials (use proxy.tokenFile)")
    if not parts.hostname:
        raise ValueError("URL has no host")
    if port == 0:
        raise ValueError("URL port must be 1..65535")
    if parts.query or parts.fragment:
        raise ValueError("URL must not have a query or fragment")
    return text.rstrip("/")


def check_etcd_url(value: str) -> str:
    try:
        return parse_endpoint(value).url
    except ConfigError as e:
        raise ValueError(str(e)) from e


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
