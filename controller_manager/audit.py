"""Reconcile audit log and overlap checker: evidence for the handover invariant.

Purpose
    The system promises that *at no instant do two instances of one controller
    type run a reconcile for the same object*. Every controller instance can
    append one :class:`AuditRecord` per reconcile (type, instance, key, start,
    end) to an audit log; :func:`find_overlaps` then looks for two records of
    the same type and key from different instances whose intervals overlap.
    ``python -m controller_manager.audit FILE...`` runs the check from a shell
    (exit 0: no overlap, 1: overlaps, 2: unreadable or malformed input).

    ``--apiserver-audit FILE...`` (several files after one flag, or the flag
    repeated; kube-apiserver's rotated ``audit-<timestamp>.log`` beside a named
    ``audit.log`` are read too, all in time order) adds the write-level check
    (:mod:`controller_manager.write_audit`): from the API server's own audit
    log, no shard key is written by a stale owner token (exit 1 if one is).
    Of the two, the write-level check is the one that states the invariant
    as the cluster sees it (what landed in the API server, independent of
    the managers' records); the reconcile-level check is the managers' own
    account and remains useful to see *when* work overlapped
    (docs/reliability.md).

Invariants
    * One record is one JSON line (camelCase keys), written with a single
      ``os.write`` on an ``O_APPEND`` file descriptor, so records of many
      threads and processes appending to one local file never interleave
      (POSIX appends are atomic with respect to the file offset; this does not
      hold on NFS - keep audit logs on a local file system).
    * Timestamps come from :func:`now` only, i.e. ``time.time()``: see there.
    * Intervals are half-open in effect: ``a.end == b.start`` (one reconcile
      ends exactly when the other begins) is *not* an overlap.
    * Readers ignore unknown fields (writers may add some) and a partially
      written last line (a writer may be appending right now), with a warning.

Concurrency model
    :class:`AuditLog` is thread-safe (a lock guards the file descriptor so
    :meth:`AuditLog.close` cannot race a write onto a reused descriptor) and
    multi-process-safe (``O_APPEND``). The reader and checker are pure
    functions.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from rangeshard.core.entrypoint import reexec_if_shadowed

# Before our imports: from a directory shadowing our packages they break (rangeshard.core.entrypoint).
reexec_if_shadowed("controller_manager.audit")

from controller_manager import write_audit  # noqa: E402
from rangeshard.core.errors import ConfigError  # noqa: E402
from rangeshard.core.timestamps import format_micro_time  # noqa: E402

log = logging.getLogger(__name__)


def now() -> float:
    """The one clock of audit timestamps: ``time.time()`` (seconds since the epoch, CLOCK_REALTIME).

    Records written by *different processes* are compared with each other, so
    the clock must have a common origin across processes. ``time.monotonic()``
    does not promise that (Python documents its reference point as undefined;
    only differences within one process are meaningful), while CLOCK_REALTIME
    is the one clock every process on a host reads alike, and across hosts it
    is at least NTP-disciplined. The price: a clock step (NTP slew is fine, a
    jump is not) during a run can fake or hide an overlap, so run audits on
    hosts with a steadily disciplined clock, and across hosts trust overlaps
    only beyond the clock skew.
    """
    return time.time()


class AuditRecord(BaseModel):
    """One reconcile: which instance of which controller type processed which key, and when."""

    model_config = ConfigDict(
        extra="ignore", alias_generator=to_camel, populate_by_name=True, frozen=True, allow_inf_nan=False
    )

    controller_type: str
    instance_id: str
    key: str
    start: float
    end: float

    @model_validator(mode="after")
    def _end_not_before_start(self) -> AuditRecord:
        if self.end < self.start:
            raise ValueError(f"end ({self.end}) is before start ({self.start})")
        return self


class AuditLog:
    """Append-only audit log file; each :meth:`record` is one atomic ``os.write`` of one JSON line."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def record(self, controller_type: str, instance_id: str, key: str, start: float, end: float) -> None:
        """Append one record. Raises ``OSError`` if the write fails; after :meth:`close` it is dropped."""
        fields = {"controllerType": controller_type, "instanceId": instance_id, "key": key, "start": start, "end": end}
        line = json.dumps({**fields, "pid": self._pid}, separators=(",", ":"), ensure_ascii=False)
        data = (line + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                log.warning("audit log %s is closed; dropping the record of %s %s", self.path, controller_type, key)
                return
            written = os.write(self._fd, data)
        if written != len(data):
            # Only on a full disk or similar: the line is cut and readers will report it.
            raise OSError(f"audit log {self.path}: short write ({written} of {len(data)} bytes)")

    def close(self) -> None:
        """Close the file; idempotent."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def read_records(paths: Iterable[str | Path]) -> list[AuditRecord]:
    """Read every record of every file, in file order.

    Raises :class:`ConfigError` listing ``FILE:LINE: problem`` for every
    malformed line (and ``FILE: problem`` for an unreadable file). Blank lines
    are skipped; a last line without its newline (a write in progress) is
    ignored with a warning.
    """
    records: list[AuditRecord] = []
    problems: list[str] = []
    for p in paths:
        path = Path(p)
        try:
            data = path.read_bytes()
        except OSError as e:
            problems.append(f"{path}: cannot read: {e.strerror or e}")
            continue
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" if the file ends with a newline
        if tail.strip():
            log.warning("%s:%d: ignoring a partially written last line (%d bytes)", path, len(lines) + 1, len(tail))
        for lineno, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                problems.append(f"{where}: invalid JSON: {e}")
                continue
            if not isinstance(obj, dict):
                problems.append(f"{where}: expected a JSON object, got {type(obj).__name__}")
                continue
            try:
                records.append(AuditRecord.model_validate(obj))
            except ValidationError as e:
                for err in e.errors():
                    field = ".".join(str(x) for x in err["loc"])
                    msg = str(err["ctx"]["error"]) if err["type"] == "value_error" and "ctx" in err else err["msg"]
                    problems.append(f"{where}: {field + ': ' if field else ''}{msg}")
    if problems:
        raise ConfigError(f"{len(problems)} problem(s) in the audit log", problems=problems)
    return records


def find_overlaps(records: Iterable[AuditRecord]) -> list[tuple[AuditRecord, AuditRecord]]:
    """Pairs of records of one controller type and key, from different instances, whose intervals overlap.

    ``a`` and ``b`` overlap iff ``a.start < b.end and b.start < a.end``. Each
    pair is reported once, the earlier-starting record first; pairs are
    ordered by (controller type, key, start). Cost: a sort per key plus a
    sweep that only compares records whose intervals are open at the same
    time - ``O(n log n + overlaps)`` for real logs, where one instance never
    overlaps itself on a key.
    """
    groups: dict[tuple[str, str], list[AuditRecord]] = defaultdict(list)
    for r in records:
        groups[(r.controller_type, r.key)].append(r)
    overlaps: list[tuple[AuditRecord, AuditRecord]] = []
    for group_key in sorted(groups):
        group = sorted(groups[group_key], key=lambda r: (r.start, r.end, r.instance_id))
        active: list[tuple[float, int, AuditRecord]] = []  # min-heap by end
        for i, r in enumerate(group):
            while active and active[0][0] <= r.start:
                heapq.heappop(active)
            overlaps.extend(
                (a, r)
                for _, _, a in sorted(active, key=lambda e: e[1])
                if a.instance_id != r.instance_id and a.start < r.end
            )
            heapq.heappush(active, (r.end, i, r))
    return overlaps


def _ts(t: float) -> str:
    return format_micro_time(datetime.fromtimestamp(t, UTC))


def _describe(r: AuditRecord) -> str:
    return f"instance {r.instance_id}: {_ts(r.start)} .. {_ts(r.end)} ({r.end - r.start:.6f} s)"


def main(argv: list[str] | None = None) -> int:
    """``python -m controller_manager.audit FILE...``: 0 no overlap, 1 overlaps, 2 bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m controller_manager.audit",
        description="Check reconcile audit logs: no two instances of one controller type "
        "may reconcile the same key at the same time.",
    )
    parser.add_argument("files", nargs="*", metavar="FILE", help="reconcile audit log files (JSON lines)")
    parser.add_argument(
        "--apiserver-audit",
        action="extend",
        nargs="+",
        default=[],
        metavar="FILE",
        help="API server audit logs (audit.k8s.io/v1 events, JSON lines): check that no shard key is written "
        "by a stale owner token. Several files after one flag; a named audit.log brings its rotated "
        "audit-<timestamp>.log siblings; all read in time order. Put reconcile FILEs before this flag.",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2)
        return e.code if isinstance(e.code, int) else 2
    if not args.files and not args.apiserver_audit:
        print("error: give reconcile audit FILEs and/or --apiserver-audit FILE", file=sys.stderr)
        return 2
    stale = 0
    if args.apiserver_audit:
        try:
            paths = write_audit.audit_files(args.apiserver_audit)
            if len(paths) > 1:
                print(f"reading {len(paths)} API server audit files in time order:", file=sys.stderr)
                for path in paths:
                    print(f"  {path}", file=sys.stderr)
            events, skipped = write_audit.read_events(paths)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        report = write_audit.check(events)
        report.skipped_lines = skipped
        write_audit.print_report(report, sys.stdout)
        stale = len(report.stale)
        if not args.files:
            return 1 if stale else 0
    try:
        records = read_records(args.files)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        for problem in e.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    overlaps = find_overlaps(records)
    for a, b in overlaps:
        shared = min(a.end, b.end) - max(a.start, b.start)
        print(f"OVERLAP {a.controller_type} key={a.key!r} for {shared:.6f} s")
        print(f"  {_describe(a)}")
        print(f"  {_describe(b)}")
    keys = {(r.controller_type, r.key) for r in records}
    instances = {(r.controller_type, r.instance_id) for r in records}
    types = {r.controller_type for r in records}
    print(
        f"{len(records)} records, {len(keys)} keys, {len(instances)} instances, "
        f"{len(types)} controller types: {len(overlaps)} overlap(s)"
    )
    return 1 if overlaps or stale else 0


if __name__ == "__main__":
    sys.exit(main())
