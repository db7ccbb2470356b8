"""The state directory's record of a running ``rangeshard up``, and ``rangeshard status`` / ``rangeshard down``.

Purpose
    ``up`` writes ``DIR/up.json`` (:class:`UpState`): its own pid, whether it
    detached, and every component it started (kind, pid, port, URL, health
    URL). ``status`` reads it and probes each component (process alive and
    its health endpoint: etcd ``/health``, the API server's, the proxy's and
    each manager's ``/readyz``), then shows each controller instance's
    progress as the proxy measures it (:mod:`rangeshard.cli.progress`): an
    instance whose oldest unanswered change is older than its
    ``stuckAfterSeconds`` is STUCK, with its count. ``down`` stops what it lists: managers first
    (graceful leave), then the proxy, the API server and etcd; SIGTERM, then
    SIGKILL after a grace period.

    The record itself (``up.json``, ``managers/*.json``) and its readers are
    :mod:`rangeshard.cli.statefile`.

Invariants
    * A pid is only signalled while it is still the process ``up`` started
      (same ``/proc/PID/stat`` start time), so a reused pid is never killed.
    * ``down`` is idempotent: nothing running (or no ``up.json``) is success.
    * ``status`` exit codes: 0 every component healthy and no instance stuck,
      1 at least one component is down or unhealthy, an instance is stuck or
      an external controller is not running, 3 nothing to report (no
      ``up.json``).

Concurrency model
    Main thread; health probes and reads are sequential blocking calls with
    timeouts of :data:`STATUS_TIMEOUT` (10 s: a loaded machine answers late,
    and late is not down).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import httpx
import orjson
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rangeshard.cli.common import DEFAULT_STATE_DIR, KubeconfigOpt, ProxyOpt, ProxyTokenFileOpt, StateDirOpt
from rangeshard.cli.progress import Progress, ProgressUnavailable, ProxyAccess, describe, fetch, style
from rangeshard.cli.statefile import (
    STATE_FILE,
    Component,
    UpState,
    alive,
    hand_managers,
    proxy_from_state,
    read_state,
    remove_state,
)
from rangeshard.cli.tables import Output, OutputOpt, table_console
from rangeshard.core.errors import ConfigError, RangeshardError
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from registry import DEFAULT_PREFIX, ChildInfo, Registry, Snapshot

#: Seconds ``down`` waits after SIGTERM before SIGKILL, per kind (a manager's graceful leave drains first).
GRACE: dict[str, float] = {"manager": 20.0, "proxy": 10.0, "apiserver": 10.0, "etcd": 10.0, "up": 60.0}


def probe(url: str | None, kind: str, timeout: float = 10.0) -> tuple[bool, str]:
    """(healthy, detail) of one health endpoint; etcd's ``/health`` must also say ``"health":"true"``."""
    if url is None:
        return True, "no health endpoint"
    try:
        with httpx.Client(timeout=timeout, verify=False) as client:  # noqa: S501 (loopback probe of our own child)
            resp = client.get(url)
    except httpx.HTTPError as e:
        return False, f"no answer ({type(e).__name__})"
    if resp.status_code != 200:
        return False, f"{resp.status_code} {resp.text.strip()[:300]}"
    if kind == "etcd":
        try:
            ok = str(resp.json().get("health")) == "true"
        except (ValueError, AttributeError):
            ok = False
        return ok, "healthy" if ok else f"unhealthy: {resp.text.strip()[:80]}"
    return True, "healthy"


def component_health(c: Component) -> tuple[bool, str]:
    if not alive(c.pid, c.start_time):
        return False, "not running"
    return probe(c.health_url, c.kind)


def running_components(state: UpState) -> list[Component]:
    return [c for c in state.components if alive(c.pid, c.start_time)]


def stop_pids(targets: list[tuple[int, int | None]], grace: float) -> list[int]:
    """SIGTERM every (pid, start time) at once, wait up to ``grace`` seconds, SIGKILL the rest.

    Returns the pids that were running.
    """
    running = [(pid, st) for pid, st in targets if alive(pid, st)]
    for pid, _ in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(pid, st) for pid, st in running) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling foreign processes: no event to wait on
    for pid, st in running:
        if alive(pid, st):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(alive(pid, st) for pid, st in running) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid, _ in running]


def proxy_from_records(snapshots: Mapping[str, Snapshot]) -> str | None:
    """The proxy most instances publish in their records (``proxyUrl``), or None."""
    urls = Counter(m.record.proxy_url for s in snapshots.values() for m in s.members if m.record.proxy_url)
    return urls.most_common(1)[0][0] if urls else None


def find_proxy(
    proxy: str | None,
    token_file: str | None,
    kubeconfig: str | None,
    state_dir: Path,
    snapshots: Mapping[str, Snapshot] | None = None,
) -> ProxyAccess | None:
    """The proxy to ask for progress: ``--proxy``; else the one ``up`` (or a manager by hand) recorded in
    ``state_dir``; else the one the instances publish. With the credentials given (ConfigError for both)."""
    if token_file is not None and kubeconfig is not None:
        raise ConfigError("--token-file and --kubeconfig: give one of them")
    url, source = proxy, "--proxy"
    if url is None:
        url, source = proxy_from_state(state_dir), f"{state_dir / STATE_FILE}"
    if url is None:
        url, source = next((c.proxy_url for c in hand_managers(state_dir) if c.proxy_url), None), str(state_dir)
    if url is None and snapshots is not None:
        url, source = proxy_from_records(snapshots), "the instances' records"
    return ProxyAccess(url, token_file, kubeconfig, source) if url else None


#: Seconds ``status`` gives each health probe and read: generous, so a loaded machine is not "down".
STATUS_TIMEOUT = 10.0


def _progress(
    state: UpState, access: ProxyAccess | None, timeout: float = STATUS_TIMEOUT
) -> tuple[list[tuple[str, str, Progress]], str | None]:
    """``[(type, instance, Progress)]`` from the proxy's metrics, or why there is none."""
    if access is None:
        return [], "no proxy recorded or published: give --proxy URL"
    recorded = next((c for c in state.components if c.kind == "proxy" and c.url == access.url), None)
    if recorded is not None and not alive(recorded.pid, recorded.start_time):
        return [], "the proxy is not running"
    try:
        found = fetch(access, timeout=timeout)
    except ProgressUnavailable as e:
        return [], str(e)
    return [(t, i, p) for (t, i), p in sorted(found.items())], None


def _snapshots(state: UpState, etcd: str | None) -> tuple[dict[str, Snapshot], str | None]:
    """Every type's registry snapshot from the etcd given, recorded by ``up`` or by a manager, or why not."""
    if etcd is None:
        recorded = next((c for c in state.components if c.kind == "etcd" and c.url), None)
        if recorded is not None and not alive(recorded.pid, recorded.start_time):
            return {}, "no running etcd recorded"
        etcd = recorded.url if recorded is not None else None
    if etcd is None:
        etcd = next((c.etcd for c in state.components if c.kind == "manager" and c.etcd), None)
    if etcd is None:
        return {}, "no etcd recorded"
    try:
        with EtcdClient(EtcdConfig.from_urls(etcd, timeout=STATUS_TIMEOUT)) as client:
            _rev, snaps = Registry(client, DEFAULT_PREFIX).snapshots()
    except RangeshardError as e:
        return {}, f"the registry cannot be read: {e}"
    return snaps, None


def _children(snaps: Mapping[str, Snapshot]) -> list[tuple[str, str, ChildInfo]]:
    """``[(type, instance, child)]``: the external controllers the managers run, from the registry records."""
    return [
        (ctype, m.instance_id, m.record.child)
        for ctype, snap in sorted(snaps.items())
        for m in snap.members
        if m.record.child is not None
    ]


def status_command(
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    output: OutputOpt = Output.table,
    proxy: ProxyOpt = None,
    token_file: ProxyTokenFileOpt = None,
    kubeconfig: KubeconfigOpt = None,
    etcd: Annotated[
        str | None,
        typer.Option(
            "--etcd",
            envvar="RANGESHARD_ETCD",
            help="etcd of the registry (default: the one recorded in --state-dir).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Show each component ``up`` started in the state dir (pid, port, healthy or not) and each instance's progress.

    Progress is measured by the proxy: an instance whose oldest unanswered
    change of a main object is older than its stuckAfterSeconds is STUCK,
    with its count; a controller that never writes status.observedGeneration
    is "not measurable". The proxy is --proxy, else the one recorded in the
    state dir, else the one the instances publish; --token-file or --kubeconfig
    authenticate to a secured one. Exit code: 0 all healthy; 1 a component is
    down or unhealthy, an instance is stuck or an external controller is not
    running; 3 no ``up`` recorded in the state dir.
    """
    state = read_state(state_dir)
    by_hand = hand_managers(state_dir)
    if state is None and by_hand:  # managers started by hand only: no up recorded
        state = UpState(up_pid=0, detached=True, components=[])
    if state is not None:
        state = state.model_copy(update={"components": [*state.components, *by_hand]})
    if state is None:
        if output is Output.json:
            sys.stdout.write(orjson.dumps({"stateDir": str(state_dir), "components": []}).decode() + "\n")
        else:
            typer.echo(f"nothing running: no {state_dir / STATE_FILE} (start one with rangeshard up --detach)")
        raise typer.Exit(3)
    rows = [(c, *component_health(c)) for c in state.components]
    snaps, _registry_error = _snapshots(state, etcd)
    try:
        access = find_proxy(proxy, token_file, kubeconfig, state_dir, snaps)
    except ConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    progress, progress_error = _progress(state, access)
    children = _children(snaps)
    stuck = [(t, i) for t, i, p in progress if p.stuck]
    # An external controller that is not running (cannot start, exited, SIGSTOPped, zombie) fails the status.
    broken = [(t, i) for t, i, child in children if child.state != "running"]
    if output is Output.json:
        doc = _status_json(state_dir, state, rows, progress, children, progress_error)
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print_tables(state_dir, output, rows, children)
        _print_progress(progress, progress_error)
    if not all(h for _, h, _ in rows) or stuck or broken:
        raise typer.Exit(1)


Row = tuple[Component, bool, str]
Child = tuple[str, str, ChildInfo]


def _status_json(
    state_dir: Path,
    state: UpState,
    rows: list[Row],
    progress: list[tuple[str, str, Progress]],
    children: list[Child],
    progress_error: str | None,
) -> dict[str, Any]:
    return {
        "stateDir": str(state_dir),
        "upPid": state.up_pid,
        "detached": state.detached,
        "components": [
            {"name": c.name, "kind": c.kind, "pid": c.pid, "port": c.port, "url": c.url, "healthy": h, "detail": d}
            for c, h, d in rows
        ],
        "progress": [{"controllerType": t, "instanceId": i, **p.to_json()} for t, i, p in progress],
        "children": [
            {"controllerType": ctype, "instanceId": instance, **child.model_dump(mode="json", by_alias=True)}
            for ctype, instance, child in children
        ],
        "progressError": progress_error,
        "stuck": [f"{t}/{i}" for t, i, p in progress if p.stuck],
    }


def _print_tables(state_dir: Path, output: Output, rows: list[Row], children: list[Child]) -> None:
    table = Table(title=f"rangeshard up in {state_dir}", title_justify="left")
    for col in ("COMPONENT", "PID", "PORT", "HEALTHY", "DETAIL") + (("URL",) if output is Output.wide else ()):
        table.add_column(col)
    for c, healthy, detail in rows:
        cells = [c.name, str(c.pid or "-"), str(c.port or "-"), "yes" if healthy else "no", detail]
        table.add_row(*cells, *((c.url or "-",) if output is Output.wide else ()))
    table_console().print(table)
    if children:
        kids = Table(title="external controllers", title_justify="left")
        for col in ("TYPE", "INSTANCE", "CHILD"):
            kids.add_column(col)
        for ctype, instance, child in children:
            kids.add_row(ctype, instance, child.describe())
        table_console().print(kids)


def _print_progress(progress: list[tuple[str, str, Progress]], error: str | None) -> None:
    if error is not None:
        typer.echo(f"progress: unknown ({error})")
        return
    if not progress:
        return
    table = Table(title="progress (measured by the proxy)", title_justify="left")
    for col in ("TYPE", "INSTANCE", "PROGRESS"):
        table.add_column(col)
    for ctype, instance, p in progress:
        table.add_row(ctype, instance, Text(describe(p), style=style(p)))
    table_console().print(table)


def down_command(state_dir: StateDirOpt = DEFAULT_STATE_DIR) -> None:
    """Stop everything ``up`` started in the state dir (managers first); data stays. Idempotent."""
    console = Console(stderr=False)
    state = read_state(state_dir)
    if state is None:
        typer.echo(f"nothing to stop: no {state_dir / STATE_FILE}")
        return
    if not state.detached and stop_pids([(state.up_pid, state.up_start_time)], GRACE["up"]):
        # A foreground `up` stops its own children on SIGTERM; whatever is left is stopped below.
        typer.echo(f"stopped up (pid {state.up_pid})")
    # Managers first (graceful leave, all at once), then the proxy, the API server, etcd.
    for kind in ("manager", "proxy", "apiserver", "etcd"):
        group = [c for c in state.components if c.kind == kind and c.pid is not None]
        stopped = set(stop_pids([(c.pid, c.start_time) for c in group if c.pid is not None], GRACE[kind]))
        for c in group:
            if c.pid in stopped:
                console.print(f"stopped {c.name} (pid {c.pid})")
    remove_state(state_dir)
    typer.echo("stopped")
