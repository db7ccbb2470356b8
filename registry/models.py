"""Registry records and snapshots: what is stored in etcd and what readers derive from it.

Purpose
    :class:`InstanceRecord` is the JSON value (camelCase) stored at
    ``<prefix>/controllers/<controller-type>/<instance-id>``, bound to the
    instance's lease. :class:`Snapshot` is a consistent view of one controller
    type at one etcd revision, with each member's range derived from the keys.

Invariants
    * Ranges are derived, never stored: sorted by ``hashKey``, member *i* owns
      ``[key(i-1) + 1, key(i)]``, the first from 0, the last up to ``MAX_HASH``.
    * The etcd key is authoritative for ``instanceId`` and ``controllerType``:
      a record written by hand without them still reads correctly.
    * Records are parsed with ``extra="ignore"`` so newer writers may add fields.

State machine of one instance (the ``state`` field; transitions are made by the
controller manager, the registry only stores them)::

    init ──(first instance, caches synced)──────────────────────► active
    init ──(joined by splitting a busy range: isLocked=true)────► locked
    locked ──(giver unlocked it, or the giver's record vanished)─► active
    active ──(its range shrank: a receiver names it as giver)───► wait
    wait ──(in-flight reconciles outside its range drained,
            receivers unlocked)────────────────────────────────► active
    active|wait|locked ──(graceful stop with rejoinGraceSeconds > 0:
            drained, receivers unlocked; the record moves to a
            lease of the grace)─────────────────────────────────► parked
    parked ──(the same instance id registers within the grace:
            same hashKey, no split, no handover)────────────────► active (locked if it was)
    parked ──(the grace runs out: the lease expires, the record
            is deleted, the neighbour absorbs the range)────────► (gone, as after a crash)

A parked record keeps its ``hashKey`` and so its range, which nobody owns
meanwhile: no newcomer splits it and no neighbour absorbs it, and write fencing
refuses every token for it (the record's lease is the grace lease).

Pins (issue 50): ``rangeshard rebalance pin`` writes ``<prefix>/pins/<type>/<instance-id>``, a key
of its own bound to no lease, so it outlives the record (a restart, a parked grace, a crash and a
rejoin under the same id). :attr:`Member.pinned` says whether a member is pinned: no rebalance
moves its key or its predecessor's, and no joiner splits its range.

Progress fields (issue 38): a record may name its type's main resource
(``mainResource: {group, version, resource, by}``, :class:`MainResource`) and
the age past which an unanswered change of it means the instance is stuck
(``stuckAfterSeconds``). The range filter proxy reads both to measure each
instance's progress from outside (``range_filter_proxy.progress``). Both are
parsed leniently: a malformed value reads as absent, never makes the record
unreadable (an unreadable record would change every derived range).

Handover versions (issue 46): ``handoverResourceVersions: {"pods": "1234", ...}``, per shard
resource the highest resourceVersion of the instance's successful writes, published with its
heartbeats and in the transaction that unlocks its receivers; a taker lists "not older than" it
(:mod:`controller_manager.freshness`). Entries that are not a decimal string are dropped.

Concurrency model
    Immutable values; safe to share between threads.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from hashing import MAX_HASH, HashRange, ShardBy, derive_ranges
from rangeshard.core.errors import ConfigError

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,251}[a-z0-9])?$")


def check_name(kind: str, value: str) -> str:
    """Validate a controller type or instance id (lowercase DNS-like, no '/')."""
    if not NAME_RE.match(value):
        raise ConfigError(
            f"{kind} {value!r}: must be 1-253 lowercase letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return value


class State(StrEnum):
    """Handover state of an instance (see the module docstring for transitions)."""

    INIT = "init"
    LOCKED = "locked"
    WAIT = "wait"
    ACTIVE = "active"
    PARKED = "parked"


class HashHistogram(BaseModel):
    """Counts of owned objects per bucket of ``[lo, hi]`` (for rebalancing).

    Two layouts (``registry.rebalance.segments`` reads both):

    * **cut at gaps** (written by current managers): ``[lo, hi]`` is cut into
      ``cells`` equal-width cells (integer-exact, like the buckets below);
      bucket ``j`` covers cells ``[ends[j-1], ends[j])`` (the first starts at
      0, the last ends at ``cells``) and holds ``objects[j]`` objects. Bucket
      edges lie in gaps between owned objects, so a boundary can be placed
      between any two of them (at most ``HISTOGRAM_BUCKETS`` buckets; more
      objects share buckets of about equal counts).
    * **equal-width**: ``counts``, ``len(counts)`` buckets of equal width
      (256). Earlier versions published only this; current managers publish
      it next to the gap layout, so readers of earlier versions keep working.
      When both are present the gap layout is read.

    Current managers also publish ``cost``: the measured reconcile seconds of
    the keys in each gap bucket, decayed over ``costWindowSeconds`` (for
    ``rangeshard rebalance --by cost``). Readers that do not know it ignore it.

    Validation is lenient on purpose: an inconsistent histogram is ignored by
    the planner (whole range, ``workloadNum``), it never makes the record unreadable.
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    lo: int = Field(ge=0, le=MAX_HASH)
    hi: int = Field(ge=0, le=MAX_HASH)
    counts: list[int] = Field(default_factory=list)
    cells: int | None = None
    ends: list[int] | None = None
    objects: list[int] | None = None
    #: Measured reconcile seconds per gap bucket (aligned with ``objects``), decayed over
    #: ``costWindowSeconds``; ``None`` from managers that do not measure. Ignored when malformed.
    cost: Any = None
    cost_window_seconds: Any = Field(default=None, alias="costWindowSeconds")


#: ``stuckAfterSeconds`` of a record that does not publish one (the manager config's default).
DEFAULT_STUCK_AFTER_SECONDS = 120.0


class ChildInfo(BaseModel):
    """The process of an external controller its manager runs (``external.command``), heartbeated with the record."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    name: str = ""
    pid: int | None = None
    #: ``running`` or ``restarting`` (between an exit and the next start, in the restart backoff).
    state: str = "running"
    restarts: int = 0
    last_exit: int | None = Field(default=None, alias="lastExit")
    #: Why it is not running: ``cannot start 'kopf': not found ...`` or ``'kopf' exited with code 1 after 0s: ...``.
    error: str | None = None

    def describe(self) -> str:
        """``running pid 123, 2 restarts, last exit -9`` (one cell of ``registry list -o wide``).

        ``stopped pid 123`` (SIGSTOP) and ``zombie pid 123`` as ``/proc`` says; the error of a child
        that is not running follows its state.
        """
        head = f"{self.state} pid {self.pid}" if self.pid and self.state != "restarting" else self.state
        parts = [head, f"{self.restarts} restart{'s' if self.restarts != 1 else ''}"]
        if self.last_exit is not None:
            parts.append(f"last exit {self.last_exit}")
        if self.error and self.state == "restarting":
            parts.append(self.error)
        return ", ".join(parts)


class MainResource(BaseModel):
    """The main resource of a controller type and the shard rule that places its objects.

    ``version`` is ``None`` when the manager does not know it (an external
    controller's ``shard`` entry names ``plural.group`` only): readers take the
    API server's preferred version.
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    group: str = ""
    version: str | None = None
    resource: str = Field(min_length=1)
    by: ShardBy = ShardBy.UID
    #: ``by: label`` only: the label key whose value places an object (without it: its uid).
    label_key: str | None = Field(default=None, alias="labelKey")

    @property
    def label(self) -> str:
        """``plural.group`` (``plural`` for the core group)."""
        return f"{self.resource}.{self.group}" if self.group else self.resource


def _lenient_main(value: object) -> object:
    """A malformed ``mainResource`` reads as absent (see the module docstring)."""
    if value is None or isinstance(value, MainResource):
        return value
    try:
        return MainResource.model_validate(value)
    except ValidationError:
        return None


def _lenient_versions(value: object) -> object:
    """``handoverResourceVersions``: the entries that are a label and a decimal resourceVersion; else absent."""
    if not isinstance(value, dict):
        return None
    kept = {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str) and v.isascii() and v.isdigit()}
    return kept or None


def _lenient_seconds(value: object) -> object:
    """A ``stuckAfterSeconds`` that is not a positive number reads as absent."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


class InstanceRecord(BaseModel):
    """One controller instance as stored in etcd (JSON, camelCase)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True, use_enum_values=False)

    instance_id: str = Field(alias="instanceId")
    controller_type: str = Field(alias="controllerType")
    hash_key: int = Field(alias="hashKey", ge=0, le=MAX_HASH)
    workload_num: int = Field(default=0, alias="workloadNum", ge=0)
    is_locked: bool = Field(default=False, alias="isLocked")
    state: State = State.ACTIVE
    giver: str | None = Field(default=None, description="instance that must unlock this one")
    host: str | None = None
    pid: int | None = None
    started_at: float | None = Field(default=None, alias="startedAt")
    heartbeat_at: float | None = Field(default=None, alias="heartbeatAt")
    histogram: HashHistogram | None = None
    parked_until: float | None = Field(
        default=None, alias="parkedUntil", description="wall-clock time the grace of a parked record ends"
    )
    main_resource: Annotated[MainResource | None, BeforeValidator(_lenient_main)] = Field(
        default=None, alias="mainResource", description="the type's main resource (progress is measured on it)"
    )
    child: ChildInfo | None = Field(
        default=None, description="an external controller's process, as its manager runs it (`command`)"
    )
    proxy_url: str | None = Field(
        default=None,
        alias="proxyUrl",
        description="the range filter proxy the instance lists and watches through (found by `status`, "
        "`registry list` and the dashboard when no proxy is given or recorded)",
    )
    handover_resource_versions: Annotated[dict[str, str] | None, BeforeValidator(_lenient_versions)] = Field(
        default=None,
        alias="handoverResourceVersions",
        description="per shard resource (`plural.group`), the highest resourceVersion of the instance's successful "
        "writes: a taker lists not older than it (controller_manager.freshness)",
    )
    stuck_after_seconds: Annotated[float | None, BeforeValidator(_lenient_seconds)] = Field(
        default=None,
        alias="stuckAfterSeconds",
        description="an unanswered change of the main resource older than this means the instance is stuck",
    )

    @property
    def is_parked(self) -> bool:
        return self.state is State.PARKED

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump(by_alias=True, exclude_none=True, mode="json"))

    @classmethod
    def from_kv(cls, controller_type: str, instance_id: str, value: bytes) -> InstanceRecord:
        """Parse a stored value; the key supplies ``controllerType``/``instanceId``.

        Raises ``ValueError`` (with the reason) for a value that is not a record.
        """
        try:
            data = orjson.loads(value)
        except orjson.JSONDecodeError as e:
            raise ValueError(f"not JSON: {e}") from e
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        data["instanceId"] = instance_id
        data["controllerType"] = controller_type
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
            raise ValueError(problems) from e

    def evolve(self, **changes: object) -> InstanceRecord:
        """A copy with fields changed (python names) and re-validated."""
        return InstanceRecord.model_validate({**self.model_dump(), **changes})


@dataclass(frozen=True)
class Member:
    """A record as read at some revision, with its derived range (``None``: owns nothing)."""

    record: InstanceRecord
    range: HashRange | None
    key: str
    mod_revision: int
    create_revision: int
    lease_id: int
    #: Pinned by ``rangeshard rebalance pin`` (a key of its own, ``<prefix>/pins/<type>/<id>``): no
    #: rebalance moves its range and no joiner splits it.
    pinned: bool = False

    @property
    def instance_id(self) -> str:
        return self.record.instance_id

    def summary(self) -> dict[str, Any]:
        """The JSON view every reader shows of an instance (``registry list -o json``, the dashboard's ring)."""
        rec, rng = self.record, self.range
        return {
            "instanceId": rec.instance_id,
            "state": rec.state.value,
            "isLocked": rec.is_locked,
            "giver": rec.giver,
            "hashKey": rec.hash_key,
            "rangeStart": rng.lo if rng else None,
            "rangeEnd": rng.hi if rng else None,
            "workloadNum": rec.workload_num,
            "host": rec.host,
            "pid": rec.pid,
            "pinned": self.pinned,
        }


@dataclass(frozen=True)
class Snapshot:
    """All instances of one controller type at one etcd revision, ordered by hash key."""

    controller_type: str
    revision: int
    members: tuple[Member, ...]

    def __iter__(self) -> Iterator[Member]:
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    def get(self, instance_id: str) -> Member | None:
        return next((m for m in self.members if m.instance_id == instance_id), None)

    def owner_of(self, key: int) -> Member | None:
        """The member whose range contains ``key``."""
        return next((m for m in self.members if m.range is not None and m.range.contains(key)), None)

    @property
    def pinned(self) -> frozenset[str]:
        """The instance ids of the pinned members."""
        return frozenset(m.instance_id for m in self.members if m.pinned)

    def receivers_of(self, giver: str) -> list[Member]:
        """Locked members waiting for ``giver`` to unlock them."""
        return [m for m in self.members if m.record.is_locked and m.record.giver == giver]

    @classmethod
    def build(
        cls,
        controller_type: str,
        revision: int,
        items: list[tuple[InstanceRecord, str, int, int, int]],
        pinned: frozenset[str] | set[str] = frozenset(),
    ) -> Snapshot:
        """Derive ranges from ``(record, key, mod_revision, create_revision, lease_id)`` items.

        ``pinned``: the instance ids pinned at that revision (``<prefix>/pins/<type>/``).
        """
        derived = derive_ranges((item, item[0].hash_key) for item in items)
        members = tuple(
            Member(
                record=rec,
                range=rng,
                key=key,
                mod_revision=mod,
                create_revision=create,
                lease_id=lease,
                pinned=rec.instance_id in pinned,
            )
            for (rec, key, mod, create, lease), rng in derived
        )
        return cls(controller_type, revision, members)


def now() -> float:
    """Wall-clock seconds (records carry wall time so any reader can show ages)."""
    return time.time()
