"""``rangeshard registry``: inspect the instance registry in etcd.

Purpose
    ``list`` shows, per controller type, every instance with its state (``, pinned``
    when ``rangeshard rebalance pin`` pinned it; ``pinned`` in JSON), lock,
    derived range, share of the hash space, workloadNum, lease TTL left and
    age (``--json`` for machines, ``--watch`` to redraw on every change);
    ``-o wide`` adds host, pid, lease and each instance's *progress* as the
    range filter proxy measures it (``STUCK: 13 unanswered, oldest 84s``, see
    :mod:`rangeshard.cli.progress`; the proxy is ``--proxy URL``, by default
    the one a ``rangeshard up`` recorded in ``--state-dir``), and ``-o json``
    adds it as ``progress`` when a proxy is known; ``dump`` prints the raw
    keys and values.

Invariants
    * Records written by hand (no lease, missing optional fields) display:
      TTL shows ``-``/``null``, age ``-``/``null``.
    * Ranges shown are derived exactly as the controllers derive them.

Concurrency model
    Main thread; ``--watch`` receives views from a :class:`MembershipWatch`
    thread through a queue and redraws on the main thread.
"""

from __future__ import annotations

import queue
import signal
import sys
import threading
import time
from typing import Annotated, Any

import orjson
import typer
from rich.console import Group, JustifyMethod
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rangeshard.cli import progress as progress_mod
from rangeshard.cli.common import (
    EtcdOptions,
    KubeconfigOpt,
    ProxyOpt,
    ProxyTokenFileOpt,
    unknown_type,
    with_etcd_options,
)
from rangeshard.cli.progress import Progress, ProgressUnavailable, ProxyAccess
from rangeshard.cli.state import find_proxy
from rangeshard.cli.tables import Output, OutputOpt, table_console
from rangeshard.core.errors import RangeshardError
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from registry import ChildInfo, MembershipWatch, Registry, RegistryView, Snapshot
from registry.models import check_name

app = typer.Typer(help="Inspect the instance registry in etcd.", no_args_is_help=True)

STATE_STYLE = {"init": "cyan", "locked": "yellow", "wait": "magenta", "active": "green", "parked": "blue"}

ProgressView = dict[tuple[str, str], Progress]


def read_progress(proxy: ProxyAccess | str | None) -> tuple[ProgressView | None, str | None]:
    """Every instance's progress from ``proxy``, or ``None`` and why not (a caption line)."""
    if proxy is None:
        return None, "progress: no proxy known (give --proxy URL, or run in a rangeshard up state dir)"
    try:
        return progress_mod.fetch(proxy), None
    except ProgressUnavailable as e:
        return None, f"progress: unknown: {e}"


def rows(
    snapshots: dict[str, Snapshot], client: EtcdClient | None, progress: ProgressView | None = None
) -> list[dict[str, Any]]:
    """One JSON-able dict per instance, in (type, hash key) order (``progress``: each gets its ``progress``)."""
    out: list[dict[str, Any]] = []
    now = time.time()
    ttl_cache: dict[int, int | None] = {}
    for ctype, snap in sorted(snapshots.items()):
        for m in snap.members:
            rec = m.record
            ttl: int | None = None
            if m.lease_id and client is not None:
                if m.lease_id not in ttl_cache:
                    try:
                        left = client.lease_ttl(m.lease_id)
                        ttl_cache[m.lease_id] = left if left >= 0 else None
                    except RangeshardError:
                        ttl_cache[m.lease_id] = None
                ttl = ttl_cache[m.lease_id]
            out.append(
                {
                    "controllerType": ctype,
                    **m.summary(),
                    "share": round(m.range.share * 100, 4) if m.range else 0.0,
                    "ttlSeconds": ttl,
                    "leaseId": m.lease_id or None,
                    "ageSeconds": round(now - rec.started_at, 1) if rec.started_at else None,
                    # An external controller's process (pid, running/restarting, restarts, last exit).
                    "child": rec.child.model_dump(mode="json", by_alias=True) if rec.child is not None else None,
                    # Parked: seconds left of its rejoin grace (its lease's TTL when known).
                    "parkedSecondsLeft": (
                        (ttl if ttl is not None else max(0, round((rec.parked_until or now) - now)))
                        if rec.is_parked
                        else None
                    ),
                }
            )
            if progress is not None:
                found = progress.get((ctype, rec.instance_id))
                out[-1]["progress"] = found.to_json() if found is not None else None
    return out


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(seconds, 0))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h"


def render(
    snapshots: dict[str, Snapshot],
    client: EtcdClient | None,
    revision: int,
    *,
    wide: bool = False,
    progress: ProgressView | None = None,
    progress_note: str | None = None,
) -> Group:
    """Rich tables, one per controller type (``wide``: also host, pid, lease and progress)."""
    data = rows(snapshots, client)
    if not data:
        return Group(Text(f"no controller instances registered (etcd revision {revision})"))
    tables = []
    caption = f"etcd revision {revision}" + (f"; {progress_note}" if wide and progress_note else "")
    for ctype in sorted({r["controllerType"] for r in data}):
        table = Table(title=f"{ctype}", title_justify="left", caption=caption, caption_justify="left")
        columns: list[tuple[str, JustifyMethod]] = [
            ("INSTANCE", "left"),
            ("STATE", "left"),
            ("LOCKED", "left"),
            ("RANGE START", "right"),
            ("RANGE END", "right"),
            ("SHARE", "right"),
            ("WORKLOAD", "right"),
            ("TTL", "right"),
            ("AGE", "right"),
        ]
        if wide:
            columns += [
                ("HOST", "left"),
                ("PID", "right"),
                ("LEASE", "right"),
                ("CHILD", "left"),
                ("PROGRESS", "left"),
            ]
        for col, justify in columns:
            table.add_column(col, justify=justify)
        for r in (r for r in data if r["controllerType"] == ctype):
            locked = f"yes (by {r['giver']})" if r["isLocked"] and r["giver"] else ("yes" if r["isLocked"] else "no")
            table.add_row(
                r["instanceId"],
                Text(
                    (f"PARKED ({r['parkedSecondsLeft']}s left)" if r["state"] == "parked" else r["state"])
                    + (", pinned" if r.get("pinned") else ""),
                    style=STATE_STYLE.get(r["state"], ""),
                ),
                locked,
                "-" if r["rangeStart"] is None else str(r["rangeStart"]),
                "-" if r["rangeEnd"] is None else str(r["rangeEnd"]),
                f"{r['share']:.2f}%",
                str(r["workloadNum"]),
                "-" if r["ttlSeconds"] is None else f"{r['ttlSeconds']}s",
                _age(r["ageSeconds"]),
                *(
                    (
                        r["host"] or "-",
                        str(r["pid"] or "-"),
                        f"{r['leaseId']:x}" if r["leaseId"] else "-",
                        ChildInfo.model_validate(r["child"]).describe() if r["child"] else "-",
                        _progress_cell(progress, ctype, r["instanceId"]),
                    )
                    if wide
                    else ()
                ),
            )
        tables.append(table)
    return Group(*tables)


def _progress_cell(progress: ProgressView | None, ctype: str, instance: str) -> Text:
    found = progress.get((ctype, instance)) if progress is not None else None
    return Text(progress_mod.describe(found), style=progress_mod.style(found))


def _filter(snapshots: dict[str, Snapshot], controller_type: str | None) -> dict[str, Snapshot]:
    if controller_type is None:
        return snapshots
    return {controller_type: snapshots.get(controller_type) or Snapshot(controller_type, 0, ())}


@app.command("list")
@with_etcd_options
def list_command(
    controller_type: Annotated[str | None, typer.Option("--type", "-t", help="Only this controller type.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of instances (same as -o json).")] = False,
    output: OutputOpt = Output.table,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Redraw on every registry change.")] = False,
    proxy: ProxyOpt = None,
    token_file: ProxyTokenFileOpt = None,
    kubeconfig: KubeconfigOpt = None,
    *,
    etcd_options: EtcdOptions,
) -> None:
    """Show instances per controller type: state, lock, range, share, workload, TTL, age.

    Ids are never cut: when stdout is not a terminal the table is as wide as
    it needs to be. `-o wide` adds host, pid, lease and progress (from the
    proxy's metrics: an instance whose oldest unanswered change is older than
    its stuckAfterSeconds shows as STUCK with its count); `-o json` prints
    JSON (with `progress` when a proxy is known).
    """
    as_json = as_json or output is Output.json
    wide = output is Output.wide
    if controller_type is not None:
        check_name("--type", controller_type)
    config = etcd_options.config()
    access = find_proxy(proxy, token_file, kubeconfig, etcd_options.state_dir)
    if watch:
        _watch(config, etcd_options.prefix, controller_type, as_json, wide, access)
        return
    with EtcdClient(config) as client:
        rev, snaps = Registry(client, etcd_options.prefix).snapshots()
        access = access or find_proxy(None, token_file, kubeconfig, etcd_options.state_dir, snaps)
        proxy = access.url if access is not None else None
        if controller_type is not None and not snaps.get(controller_type):
            raise unknown_type(controller_type, snaps)
        snaps = _filter(snaps, controller_type)
        progress, note = read_progress(access) if wide or (as_json and proxy) else (None, None)
        if as_json:
            doc = rows(snaps, client, progress if proxy else None)
            sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        else:
            table_console().print(render(snaps, client, rev, wide=wide, progress=progress, progress_note=note))


def _watch(
    config: EtcdConfig,
    prefix: str,
    controller_type: str | None,
    as_json: bool,
    wide: bool,
    proxy: ProxyAccess | None,
) -> None:
    def measured() -> tuple[ProgressView | None, str | None]:
        return read_progress(proxy) if wide or (as_json and proxy) else (None, None)

    views: queue.Queue[RegistryView] = queue.Queue()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    watch = MembershipWatch(config, views.put, controller_type=controller_type, prefix=prefix, name="cli", pins=True)
    watch.start()
    console = table_console()
    try:
        with EtcdClient(config) as client:
            if as_json or not console.is_terminal:
                # One complete listing per change: easy to pipe and to test.
                while not stop.is_set():
                    try:
                        view = views.get(timeout=0.2)
                    except queue.Empty:
                        continue
                    snaps = _filter(view.snapshots, controller_type)
                    progress, note = measured()
                    if as_json:
                        doc = {"revision": view.revision, "instances": rows(snaps, client, progress if proxy else None)}
                        sys.stdout.write(orjson.dumps(doc).decode() + "\n")
                    else:
                        console.print(
                            render(snaps, client, view.revision, wide=wide, progress=progress, progress_note=note)
                        )
                        console.print("---")
                    sys.stdout.flush()
            else:
                with Live(Text("waiting for etcd..."), console=console, auto_refresh=False) as live:
                    last: RegistryView | None = None
                    while not stop.is_set():
                        try:
                            last = views.get(timeout=1.0)
                        except queue.Empty:
                            if last is None:
                                continue
                        # Redraw on every change, and once a second for TTL/age (and progress) columns.
                        progress, note = measured()
                        snaps = _filter(last.snapshots, controller_type)
                        live.update(
                            render(snaps, client, last.revision, wide=wide, progress=progress, progress_note=note),
                            refresh=True,
                        )
    except KeyboardInterrupt:
        pass
    finally:
        watch.stop()


@app.command("release")
@with_etcd_options
def release_command(
    controller_type: Annotated[str, typer.Option("--type", "-t", help="The controller type.", show_default=False)],
    instance: Annotated[str, typer.Option("--instance", "-i", help="The parked instance id.", show_default=False)],
    *,
    etcd_options: EtcdOptions,
) -> None:
    """End a parked instance's rejoin grace now: its record is deleted and the neighbour absorbs its range.

    For a pod that will not come back (a StatefulSet scaled in): without this its
    range waits out `rejoinGraceSeconds`, served by nobody. Refused (exit 2) for
    an instance that is not parked.
    """
    check_name("--type", controller_type)
    check_name("--instance", instance)
    with EtcdClient(etcd_options.config()) as client:
        member = Registry(client, etcd_options.prefix).release(controller_type, instance)
    typer.echo(f"released {controller_type}/{instance}: range {member.range} goes to its neighbour")


@app.command("dump")
@with_etcd_options
def dump_command(
    *,
    etcd_options: EtcdOptions,
) -> None:
    """Print every raw key and value under the registry prefix (with lease and revisions)."""
    config = etcd_options.config()
    with EtcdClient(config) as client:
        rev, kvs = Registry(client, etcd_options.prefix).raw()
    typer.echo(f"# etcd revision {rev}, {len(kvs)} key(s) under {etcd_options.prefix.rstrip('/')}/")
    for kv in kvs:
        lease = f"{kv.lease_id:x}" if kv.lease_id else "none"
        typer.echo(f"{kv.key}  (lease {lease}, mod {kv.mod_revision}, create {kv.create_revision})")
        typer.echo(f"  {kv.value.decode('utf-8', 'replace')}")
