"""Write-level audit check: from an API server's audit log, no shard key is written by a stale owner.

Purpose
    The reconcile audit (:mod:`controller_manager.audit`) is the managers'
    own account of when they reconciled; this check trusts nothing of the
    managers. It reads the ``audit.k8s.io/v1`` events an API server wrote
    (kube-apiserver, or the local API server's ``--audit-log-path``),
    attributes every successful write (create, update, patch, delete,
    subresources included) to the owner token in its User-Agent
    (:class:`rangeshard.core.ownertoken.OwnerToken`) and to a shard key,
    and reports every shard key written by a token *after another token
    wrote it in between* (``A, B, A``): the first token's ownership period
    had ended when it wrote again, so it wrote as a stale owner.

    The shard key of a write (per controller type) follows the shard rule
    the writer declared (:class:`hashing.ShardBy`, read from the
    ``rangeshard-shard-by/<rule>`` product token of its User-Agent, which the
    external endpoint and the in-process controllers' client add to every
    write to a sharded resource, through the one function
    :func:`rangeshard.core.relay.declare`): ``uid`` the object's own
    uid, ``owner`` its controller ownerReference's uid (its own uid when it
    has none), ``namespace`` its namespace, ``root`` the top of its chain of
    controller ownerReferences as the log's objects show it (every owner the
    log saw is followed, at most ``hashing.MAX_CHAIN``; the proxy follows only
    the ``via`` kinds, so a chain through a kind outside them is keyed higher
    here than there: a conservative check) *as of the write's receipt*: with
    ``requestReceivedTimestamp`` in the log, the owners above the object are
    those the successful writes received up to then gave them (in log order,
    also when such a write completed after this one); a re-parenting the API
    server received after the write is concurrent with it and does not key it
    (the fence, in front of the API server, decided before the write got
    there: no fence could have seen it), ``label`` the value of the label
    it names (``rangeshard-shard-label/<key>``) as the log's objects show it,
    else its own uid. A write that declares no rule (a resource its writer
    does not shard) is keyed by the uid of the object's controller
    ownerReference, else its own uid. Owners are
    read from ``requestObject``/``responseObject`` (level ``Request`` or
    ``RequestResponse``) and remembered per object uid, so deletes (whose
    bodies are DeleteOptions) are attributed too; an event naming no uid
    takes the uid last seen for the same resource, namespace and name, and
    failing that the object's name is its key. Writes naming no object at
    all are counted and reported as unattributed.

Invariants
    * Only successful writes (2xx) with an owner token count: failed writes
      changed nothing, and writes of other clients (kubectl, garbage
      collection) have no owner.
    * Events are taken in file order (the order the server completed them);
      several files are concatenated in argument order.
    * Unreadable lines (a partially written last line) are skipped with a
      count, not fatal.

Concurrency model
    Pure functions over the parsed events.
"""

from __future__ import annotations

import bisect
import glob
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from hashing import MAX_CHAIN, ShardBy, controller_owner_uid
from rangeshard.core.errors import ConfigError
from rangeshard.core.ownertoken import OwnerToken, declared_shard_by, declared_shard_label

WRITE_VERBS = frozenset({"create", "update", "patch", "delete"})


@dataclass(frozen=True)
class Write:
    """One successful write with an owner token."""

    token: OwnerToken
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    uid: str | None
    timestamp: str

    def describe(self) -> str:
        sub = f"/{self.subresource}" if self.subresource else ""
        return f"{self.timestamp} {self.verb} {self.resource}{sub} {self.namespace}/{self.name} by {self.token}"


@dataclass(frozen=True)
class StaleWrite:
    """A write by ``write.token`` after ``between`` wrote the same shard key."""

    controller_type: str
    shard_key: str
    write: Write
    between: Write


@dataclass
class Report:
    """What :func:`check` found."""

    writes: int = 0
    shard_keys: int = 0
    tokens: int = 0
    unattributed: list[Write] = field(default_factory=list)
    stale: list[StaleWrite] = field(default_factory=list)
    skipped_lines: int = 0


#: kube-apiserver's rotated audit logs (lumberjack): ``audit-2026-11-28T07-00-00.000.log`` beside ``audit.log``.
_ROTATED = re.compile(r"^(?P<stem>.+)-(?P<stamp>\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?)(?P<ext>\.[^.]+)?$")


def audit_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files to read, in time order: each given file plus its rotated siblings, each file once.

    kube-apiserver rotates ``audit.log`` into ``audit-<timestamp>.log`` in the same
    directory (``--audit-log-maxsize``); naming ``audit.log`` reads the rotated ones
    too, oldest first, the current file last. A rotated file named on its own is
    placed by its timestamp. Files that are neither keep the order given, after the
    rotation groups they belong to.
    """
    chosen: dict[Path, None] = {}
    for given in map(Path, paths):
        if given.is_file() and _ROTATED.match(given.name) is None:
            stem, ext = given.stem, given.suffix
            for sibling in given.parent.glob(f"{glob.escape(stem)}-*{glob.escape(ext)}"):
                found = _ROTATED.match(sibling.name)
                if found is not None and found["stem"] == stem and (found["ext"] or "") == ext:
                    chosen.setdefault(sibling.resolve(), None)
        chosen.setdefault(given.resolve() if given.exists() else given, None)

    def key(path: Path) -> tuple[str, str, int, str]:
        found = _ROTATED.match(path.name)
        if found is not None:  # a rotated file: its group (the current file's name), then its time
            return (str(path.parent), found["stem"] + (found["ext"] or ""), 0, found["stamp"])
        return (str(path.parent), path.name, 1, "")

    order = {p: i for i, p in enumerate(chosen)}
    groups: dict[tuple[str, str], int] = {}
    for p in chosen:
        k = key(p)
        groups.setdefault((k[0], k[1]), order[p])
    return sorted(chosen, key=lambda p: (groups[key(p)[:2]], key(p)[2], key(p)[3], order[p]))


def read_events(paths: Iterable[str | Path]) -> tuple[list[dict[str, Any]], int]:
    """The audit events of ``paths`` in order, and how many lines were unreadable."""
    events: list[dict[str, Any]] = []
    skipped = 0
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise ConfigError(f"{path}: cannot read: {e.strerror}") from e
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                ev = orjson.loads(line)
            except orjson.JSONDecodeError:
                skipped += 1
                continue
            if isinstance(ev, dict) and ev.get("kind") == "Event":
                events.append(ev)
            else:
                skipped += 1
    return events, skipped


def _controller_uid(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return controller_owner_uid(meta) if isinstance(meta, Mapping) else None


def _own_uid(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) and uid else None


def _shard_key(
    ev: Mapping[str, Any],
    namespace: str,
    uid: str | None,
    owner_of: Mapping[str, str | None],
    labels_of: Mapping[str, Mapping[str, Any]] | None = None,
    chain: Mapping[str, str | None] | None = None,
) -> str | None:
    """The shard key of one write by the writer's declared rule, else by its owner (module docstring).

    ``chain``: the owners of the objects above it (``root``), as of the write's receipt; default ``owner_of``.
    """
    try:
        rule = declared_shard_by(None, ev.get("userAgent"))
    except ValueError:
        rule = None
    if rule is ShardBy.LABEL:
        try:
            key = declared_shard_label(None, ev.get("userAgent"))
        except ValueError:
            key = None
        value = (labels_of or {}).get(uid or "", {}).get(key) if key is not None else None
        return f"label/{key}={value}" if isinstance(value, str) else uid
    if rule is ShardBy.NAMESPACE:
        return f"namespace/{namespace}" if namespace else None
    if rule is ShardBy.UID:
        return uid
    owner = owner_of.get(uid) if uid is not None else None
    if rule is ShardBy.ROOT and owner:
        return _root(owner, owner_of if chain is None else chain)
    return owner or uid


def _root(uid: str, owner_of: Mapping[str, str | None]) -> str:
    """The top of ``uid``'s chain of controller owners as the log shows it (at most ``MAX_CHAIN`` steps)."""
    seen = {uid}
    for _ in range(MAX_CHAIN - 1):  # ``uid`` (an owner) is the first of at most MAX_CHAIN
        above = owner_of.get(uid)
        if not above or above in seen:
            return uid
        seen.add(above)
        uid = above
    return uid


def _received(ev: Mapping[str, Any]) -> float | None:
    """When the API server received the request of ``ev`` (``requestReceivedTimestamp``), in seconds."""
    value = ev.get("requestReceivedTimestamp")
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class _OwnerHistory:
    """The owners the log's successful writes gave each object, to read a chain *as of* a write's receipt.

    An observation is ``(received, order, owner)``: the write's receipt, its commit order
    (the ``resourceVersion`` it answered with when every write of the object has one, else its
    place in the log, which is completion order) and the owner it left the object with. Built
    once over all events; objects no timed write shows are read as the log shows them so far
    (``now``).
    """

    def __init__(self) -> None:
        self._seen: dict[str, list[tuple[float, int, int | None, str | None]]] = {}
        self._created: dict[str, float] = {}
        self._index: dict[str, tuple[list[float], list[tuple[int, str | None]]]] = {}

    def add(
        self, uid: str, received: float, position: int, version: int | None, owner: str | None, created: bool
    ) -> None:
        self._seen.setdefault(uid, []).append((received, position, version, owner))
        if created:
            self._created[uid] = min(received, self._created.get(uid, received))

    def as_of(self, received: float, now: Mapping[str, str | None]) -> Mapping[str, str | None]:
        """``uid -> controller owner`` as of ``received`` (see :class:`_AsOf`)."""
        return _AsOf(self, received, now)

    def owner(self, uid: str, received: float) -> tuple[str, str | None]:
        """``("known", owner)`` of the last write (in log order) received up to ``received``; ``("absent", None)``
        if the object was created after it; ``("unknown", None)`` if no timed write says."""
        index = self._index.get(uid)
        if index is None:
            seen = self._seen.get(uid, [])
            by_version = all(v is not None for _, _, v, _ in seen)
            ordered = sorted((r, v if by_version and v is not None else p, o) for r, p, v, o in seen)
            best: list[tuple[int, str | None]] = []
            for _, order, owner in ordered:
                best.append((order, owner) if not best or order > best[-1][0] else best[-1])
            index = self._index[uid] = ([r for r, _, _ in ordered], best)
        times, best = index
        k = bisect.bisect_right(times, received)
        if k:
            return "known", best[k - 1][1]
        created = self._created.get(uid)
        return ("absent", None) if created is not None and created > received else ("unknown", None)


class _AsOf(Mapping[str, "str | None"]):
    """The controller owners of the objects above a write as of its receipt by the API server.

    A chain change the API server received after the write cannot have been seen by any
    fence in front of it (the fence decided before the write reached the API server), so
    it does not key that write; one received before does, even if it completed later.
    """

    def __init__(self, history: _OwnerHistory, received: float, now: Mapping[str, str | None]) -> None:
        self._history = history
        self._received = received
        self._now = now

    def __getitem__(self, uid: str) -> str | None:
        state, owner = self._history.owner(uid, self._received)
        if state == "known":
            return owner
        if state == "absent":
            raise KeyError(uid)
        return self._now[uid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._now)

    def __len__(self) -> int:
        return len(self._now)


def _version(obj: Mapping[str, Any]) -> int | None:
    """The object's ``resourceVersion`` as a number (etcd's revision: commit order), if it is one."""
    meta = obj.get("metadata")
    value = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else None


def _succeeded(ev: Mapping[str, Any]) -> bool:
    status = ev.get("responseStatus")
    code = status.get("code") if isinstance(status, Mapping) else None
    return isinstance(code, int) and 200 <= code < 300


def _observed(ev: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(uid, object)`` of the objects an event shows: its response's, else its request's (of the named uid)."""
    raw_ref = ev.get("objectRef")
    ref: Mapping[str, Any] = raw_ref if isinstance(raw_ref, Mapping) else {}
    uid = ref.get("uid") if isinstance(ref.get("uid"), str) and ref.get("uid") else None
    out: list[tuple[str, Mapping[str, Any]]] = []
    for obj in (ev.get("responseObject"), ev.get("requestObject")):
        own = _own_uid(obj)
        if own is not None and (uid is None or own == uid) and isinstance(obj, Mapping):
            uid = own
            out.append((own, obj))
    return out


def check(events: Iterable[Mapping[str, Any]]) -> Report:
    """Attribute writes and find stale-owner writes (see module docstring)."""
    report = Report()
    owner_of: dict[str, str | None] = {}  # object uid -> controller owner uid (None: known to have none)
    labels_of: dict[str, Mapping[str, Any]] = {}  # object uid -> its labels as last seen (by: label)
    uid_of: dict[tuple[str, str, str], str] = {}  # (resource, namespace, name) -> uid, for events naming no uid
    last: dict[tuple[str, str], Write] = {}  # (type, shard key) -> the last write
    seen: dict[tuple[str, str], set[OwnerToken]] = {}
    tokens: set[OwnerToken] = set()
    events = list(events)
    history = _OwnerHistory()
    for position, ev in enumerate(events):
        received = _received(ev)
        if received is None or ev.get("verb") not in WRITE_VERBS or not _succeeded(ev):
            continue
        for own, obj in _observed(ev)[:1]:  # what the write left: its answer (else its request)
            history.add(own, received, position, _version(obj), _controller_uid(obj), ev.get("verb") == "create")
    for ev in events:
        raw_ref = ev.get("objectRef")
        ref: Mapping[str, Any] = raw_ref if isinstance(raw_ref, Mapping) else {}
        uid = ref.get("uid") if isinstance(ref.get("uid"), str) and ref.get("uid") else None
        for own, obj in _observed(ev):
            uid = own
            owner_of[own] = _controller_uid(obj)
            meta = obj.get("metadata")
            labels = meta.get("labels") if isinstance(meta, Mapping) else None
            labels_of[own] = labels if isinstance(labels, Mapping) else {}
        ident = (str(ref.get("resource") or ""), str(ref.get("namespace") or ""), str(ref.get("name") or ""))
        if uid is not None and ident[2]:
            uid_of[ident] = uid
        elif uid is None:
            uid = uid_of.get(ident)
        verb = ev.get("verb")
        token = OwnerToken.parse(ev.get("userAgent"))
        if token is None or verb not in WRITE_VERBS or not _succeeded(ev):
            continue
        resource, namespace, name = ident
        subresource = str(ref.get("subresource") or "")
        write = Write(
            token, str(verb), resource, subresource, namespace, name, uid, str(ev.get("stageTimestamp") or "")
        )
        report.writes += 1
        tokens.add(token)
        received = _received(ev)
        chain = owner_of if received is None else history.as_of(received, owner_of)
        shard_key = _shard_key(ev, namespace, uid, owner_of, labels_of, chain)
        if shard_key is None and write.name:
            # Nothing says which object (a Metadata-level log without uids): the object's name is the key.
            shard_key = f"{resource}/{write.namespace}/{write.name}"
        if shard_key is None:
            report.unattributed.append(write)
            continue
        k = (token.controller_type, shard_key)
        prev = last.get(k)
        writers = seen.setdefault(k, set())
        if prev is not None and prev.token != token and token in writers:
            report.stale.append(StaleWrite(token.controller_type, shard_key, write, prev))
        writers.add(token)
        last[k] = write
    report.shard_keys = len(last)
    report.tokens = len(tokens)
    return report


def print_report(report: Report, out: Any) -> None:
    for s in report.stale:
        print(f"STALE OWNER {s.controller_type} shard key {s.shard_key}:", file=out)
        print(f"  {s.write.describe()}", file=out)
        print(f"  after {s.between.describe()}", file=out)
    for w in report.unattributed[:20]:
        print(f"UNATTRIBUTED {w.describe()} (no uid/owner known: audit level Request or RequestResponse)", file=out)
    print(
        f"{report.writes} token writes, {report.shard_keys} shard keys, {report.tokens} owner tokens, "
        f"{len(report.unattributed)} unattributed, {report.skipped_lines} unreadable line(s): "
        f"{len(report.stale)} stale-owner write(s)",
        file=out,
    )
