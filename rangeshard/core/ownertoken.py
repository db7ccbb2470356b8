"""Owner tokens: who wrote, for which ownership period, carried in a controller manager's User-Agent.

Purpose
    Every request of a controller manager carries the User-Agent

    ``rangeshard-controller-manager/<version> (<controllerType>/<instanceId>; lease <leaseIdHex>; epoch <n>)``

    :class:`OwnerToken` formats and parses it. The range filter proxy fences
    writes by it (``range_filter_proxy.fencing``), and the write-level audit
    check (``controller_manager.audit --apiserver-audit``) attributes every
    write in an API server audit log to the token that made it.

    A writer may also declare the shard hash of the object its write is for
    in the header :data:`SHARD_HASH_HEADER` (``0x`` + hex), and the shard
    rule (:class:`hashing.ShardBy`) it places the written resource by in
    :data:`SHARD_BY_HEADER` (``uid``, ``owner``, ``namespace``). The rule is
    also appended to the User-Agent as the product token
    ``rangeshard-shard-by/<rule>`` (:func:`shard_by_agent`), because an API
    server's audit log records the User-Agent but no other header: the
    write-level audit check reads it there. See docs/reliability.md for how
    the proxy checks both. A write under ``label`` also names the label key,
    in :data:`SHARD_LABEL_HEADER` and as the product token
    ``rangeshard-shard-label/<key, percent-encoded>`` (a key may hold ``/``).

Invariants
    * ``epoch`` names the registry revision at which the instance's current
      range and lock state took effect (the revision of the registry view in
      which the instance first saw them): a token identifies one ownership
      period of one lease of one instance.
    * ``parse(format(t)) == t``; a User-Agent that is not a token parses to
      ``None`` (it passes the proxy unfenced, as any other client's).

Concurrency model
    Immutable values and pure functions.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from hashing import ShardBy, check_label_key
from rangeshard import __version__
from rangeshard.core.kubeapi import status_object

PRODUCT = "rangeshard-controller-manager"
SHARD_HASH_HEADER = "X-Rangeshard-Shard-Hash"
#: The header a writer declares its shard rule of the written resource in (``uid``, ``owner``, ``namespace``).
SHARD_BY_HEADER = "X-Rangeshard-Shard-By"
#: The User-Agent product token that repeats the declared rule for the audit log.
SHARD_BY_PRODUCT = "rangeshard-shard-by"
_SHARD_BY_RE = re.compile(r"(?:^|\s)rangeshard-shard-by/(?P<rule>[A-Za-z]+)(?:\s|$)")
#: The header a ``by: label`` writer names its label key in.
SHARD_LABEL_HEADER = "X-Rangeshard-Shard-Label"
#: The User-Agent product token that repeats the label key for the audit log (percent-encoded).
SHARD_LABEL_PRODUCT = "rangeshard-shard-label"
_SHARD_LABEL_RE = re.compile(r"(?:^|\s)rangeshard-shard-label/(?P<key>[^\s()]+)(?:\s|$)")

_TOKEN_RE = re.compile(
    r"rangeshard-controller-manager/(?P<version>[^ ()]+) "
    r"\((?P<type>[^/;() ]+)/(?P<instance>[^;() ]+); lease (?:0x)?(?P<lease>[0-9a-fA-F]+); epoch (?P<epoch>[0-9]+)\)"
)


@dataclass(frozen=True, slots=True)
class OwnerToken:
    """One ownership period of one controller instance (see module docstring)."""

    controller_type: str
    instance_id: str
    lease_id: int
    epoch: int
    version: str = __version__

    @property
    def owner(self) -> str:
        """``<controllerType>/<instanceId>``."""
        return f"{self.controller_type}/{self.instance_id}"

    def user_agent(self) -> str:
        return f"{PRODUCT}/{self.version} ({self.owner}; lease {self.lease_id:x}; epoch {self.epoch})"

    def __str__(self) -> str:
        return f"{self.owner} lease {self.lease_id:x} epoch {self.epoch}"

    @classmethod
    def parse(cls, user_agent: str | None) -> OwnerToken | None:
        """The token in a User-Agent, or ``None`` if it carries none."""
        if not user_agent or PRODUCT not in user_agent:
            return None
        m = _TOKEN_RE.search(user_agent)
        if m is None:
            return None
        return cls(m["type"], m["instance"], int(m["lease"], 16), int(m["epoch"]), m["version"])


def plain_user_agent() -> str:
    """The User-Agent of a manager that holds no lease yet (no token: never fenced, never writes)."""
    return f"{PRODUCT}/{__version__}"


def shard_by_agent(rule: ShardBy, label: str | None = None) -> str:
    """The User-Agent product token declaring ``rule`` (``rangeshard-shard-by/<rule>``).

    ``label`` (``by: label``): followed by ``rangeshard-shard-label/<key>`` (percent-encoded).
    """
    agent = f"{SHARD_BY_PRODUCT}/{rule.value}"
    if rule is ShardBy.LABEL and label:
        agent += f" {SHARD_LABEL_PRODUCT}/{urllib.parse.quote(label, safe='')}"
    return agent


def declared_shard_label(header: str | None, user_agent: str | None = None) -> str | None:
    """The label key a ``by: label`` write declares: its :data:`SHARD_LABEL_HEADER`, else its User-Agent's.

    ``None`` when neither names one; ``ValueError`` for a value that is not a label key.
    """
    if header is not None and header.strip():
        return check_label_key(header.strip())
    if user_agent:
        found = _SHARD_LABEL_RE.search(user_agent)
        if found is not None:
            return check_label_key(urllib.parse.unquote(found["key"]))
    return None


def declared_shard_by(header: str | None, user_agent: str | None = None) -> ShardBy | None:
    """The shard rule a write declares: its :data:`SHARD_BY_HEADER`, else its User-Agent's product token.

    ``None`` when neither declares one; ``ValueError`` (naming the rules)
    for a declaration that names no rule.
    """
    if header is not None and header.strip():
        return ShardBy.parse(header)
    if user_agent:
        found = _SHARD_BY_RE.search(user_agent)
        if found is not None:
            return ShardBy.parse(found["rule"])
    return None


def format_shard_hash(value: int) -> str:
    return f"0x{value:x}"


def parse_shard_hash(value: str | None) -> int | None:
    """A declared shard hash (``0x`` + hex, or decimal); ``None`` if absent or malformed."""
    if not value:
        return None
    try:
        return int(value, 16) if value.lower().startswith("0x") else int(value)
    except ValueError:
        return None


#: ``details.group`` of a fenced write's 409 Status (with ``details.kind`` :data:`FENCED_KIND`).
FENCED_GROUP = "rangeshard.io"
FENCED_KIND = "WriteFencing"
#: Response header of a fenced write (value: the reason), so a client can tell it from an ordinary conflict cheaply.
FENCED_HEADER = "X-Rangeshard-Fenced"
#: ``details.causes[].reason`` values of a fenced write.
FENCE_REASONS = (
    "NotRegistered",
    "LeaseMismatch",
    "Parked",
    "Locked",
    "StaleEpoch",
    "OutOfRange",
    "ShardHashMismatch",
)


def fenced_status(token: OwnerToken, reason: str, why: str) -> dict[str, object]:
    """The ``409 Conflict`` Status answered for a fenced write (see docs/reliability.md)."""
    message = f"write fenced: {token} may not write now: {why}"
    details = {
        "group": FENCED_GROUP,
        "kind": FENCED_KIND,
        "name": token.owner,
        "causes": [{"reason": reason, "message": why, "field": "userAgent"}],
    }
    return status_object(409, "Conflict", message, details)


def fence_reason(status: object) -> str | None:
    """The fencing reason of a 409 Status body (parsed JSON), or ``None`` for an ordinary conflict."""
    if not isinstance(status, dict) or status.get("code") != 409:
        return None
    details = status.get("details")
    if not isinstance(details, dict) or details.get("group") != FENCED_GROUP or details.get("kind") != FENCED_KIND:
        return None
    reasons = (c.get("reason") for c in details.get("causes") or [] if isinstance(c, dict))
    return next((r for r in reasons if isinstance(r, str)), "Fenced")
