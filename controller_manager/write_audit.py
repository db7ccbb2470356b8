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
    here than there: a conservative check), ``label`` the value of the label
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

import glob
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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
) -> str | None:
    """The shard key of one write by the writer's declared rule, else by its owner (module docstring)."""
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
        return _root(owner, owner_of)
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


def check(events: Iterable[Mapping[str, Any]]) -> Report:
    """Attribute writes and find stale-owner writes (see module docstring)."""
    report = Report()
    owner_of: dict[str, str | None] = {}  # object uid -> controller owner uid (None: known to have none)
    labels_of: dict[str, Mapping[str, Any]] = {}  # object uid -> its labels as last seen (by: label)
    uid_of: dict[tuple[str, str, str], str] = {}  # (resource, namespace, name) -> uid, for events naming no uid
    last: dict[tuple[str, str], Write] = {}  # (type, shard key) -> the last write
    seen: dict[tuple[str, str], set[OwnerToken]] = {}
    tokens: set[OwnerToken] = set()
    for ev in events:
        raw_ref = ev.get("objectRef")
        ref: Mapping[str, Any] = raw_ref if isinstance(raw_ref, Mapping) else {}
        objects = [ev.get("responseObject"), ev.get("requestObject")]
        uid = ref.get("uid") if isinstance(ref.get("uid"), str) and ref.get("uid") else None
        for obj in objects:
            own = _own_uid(obj)
            if own is not None and (uid is None or own == uid):
                uid = own
                owner_of[own] = _controller_uid(obj)
                meta = obj.get("metadata") if isinstance(obj, Mapping) else None
                labels = meta.get("labels") if isinstance(meta, Mapping) else None
                labels_of[own] = labels if isinstance(labels, Mapping) else {}
        ident = (str(ref.get("resource") or ""), str(ref.get("namespace") or ""), str(ref.get("name") or ""))
        if uid is not None and ident[2]:
            uid_of[ident] = uid
        elif uid is None:
            uid = uid_of.get(ident)
        code = (ev.get("responseStatus") or {}).get("code")
        verb = ev.get("verb")
        token = OwnerToken.parse(ev.get("userAgent"))
        if token is None or verb not in WRITE_VERBS or not isinstance(code, int) or not 200 <= code < 300:
            continue
        resource, namespace, name = ident
        subresource = str(ref.get("subresource") or "")
        write = Write(
            token, str(verb), resource, subresource, namespace, name, uid, str(ev.get("stageTimestamp") or "")
        )
        report.writes += 1
        tokens.add(token)
        shard_key = _shard_key(ev, namespace, uid, owner_of, labels_of)
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
