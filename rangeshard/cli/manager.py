"""``rangeshard controller-manager``: run the controllers of a config file.

Purpose
    Loads and validates the config file (exit 2, one ``FILE: field.path:
    problem`` line per problem) and runs the manager until SIGTERM/SIGINT.
    The CLI registers this command alone when it is the one asked for
    (:func:`rangeshard.cli.main._register_subcommands`): a manager, often a
    sidecar beside every replica of a controller, loads none of the other
    servers' code.

Concurrency model
    Main thread; the manager runs its own threads.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
from pathlib import Path
from typing import Annotated

import orjson
import typer

from controller_manager.config import load_config, with_overrides
from controller_manager.manager import ControllerManager
from rangeshard.cli.common import fail
from rangeshard.core.errors import RangeshardError
from rangeshard.core.process import end_process, process_start_time


def controller_manager_command(
    config: Annotated[Path, typer.Option("--config", "-c", help="Manager config file (YAML).")],
    audit_log: Annotated[
        Path | None, typer.Option("--audit-log", help="Append one JSON line per reconcile to this file.")
    ] = None,
    etcd: Annotated[
        str | None, typer.Option("--etcd", help="Override etcd endpoints of the config (URL[,URL...]).")
    ] = None,
    proxy: Annotated[str | None, typer.Option("--proxy", help="Override the proxy URL of the config.")] = None,
    instance_prefix: Annotated[
        str | None,
        typer.Option(
            "--instance-prefix",
            help="This manager's stable identity (its instance ids are <prefix>-<controller type>): in "
            "Kubernetes the StatefulSet pod name ($(POD_NAME)); by hand, any name a restarted process reuses. "
            "With rejoinGraceSeconds > 0 a restart with the same prefix takes its range back (no split, no "
            "handover). Overrides instanceIdPrefix of the config; default: host-pid-random, a new identity per "
            "process.",
        ),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            help="Record this manager in a rangeshard up state directory (DIR/managers/<name>.json), so "
            "`rangeshard status --state-dir DIR` lists it beside what `up` started; removed when it stops.",
        ),
    ] = None,
) -> None:
    """Run the controllers of a config file, each as one sharded instance."""
    try:
        cfg = with_overrides(load_config(config), etcd=etcd, proxy=proxy)
        manager = ControllerManager(
            cfg, audit_path=str(audit_log) if audit_log else None, instance_prefix=instance_prefix
        )
    except RangeshardError as e:
        fail(e)
    # A crash of the process (SIGSEGV, SIGABRT, ...) prints every thread's Python stack to stderr
    # (the manager's log), so a rare crash at exit can be told apart from the rest.
    with contextlib.suppress(ValueError, OSError, AttributeError):  # stderr without a file descriptor
        faulthandler.enable()
    record = _record(state_dir, instance_prefix, manager) if state_dir is not None else None
    try:
        code = manager.run_until_signal()
    finally:
        if record is not None:
            record.unlink(missing_ok=True)
    if code != 0:
        typer.echo(f"error: {manager.fatal()}", err=True)
    # Stopped and flushed: leave without interpreter finalization (see end_process).
    end_process(1 if code else 0)


def _record(state_dir: Path, name: str | None, manager: ControllerManager) -> Path:
    """Write ``DIR/managers/<name>.json`` (the fields of ``rangeshard.cli.statefile.Component``) for ``status``."""
    pid = os.getpid()
    url = manager.status.url if manager.status is not None else None
    doc = {
        "name": f"manager {name or pid} (by hand)",
        "kind": "manager",
        "pid": pid,
        "startTime": process_start_time(pid),
        "port": manager.status.port if manager.status is not None else None,
        "url": url,
        "healthUrl": f"{url}/readyz" if url else None,
        # What `status`, `registry list` and the dashboard need to find without flags.
        "proxyUrl": manager.config.proxy.url,
        "etcd": ",".join(manager.config.etcd.endpoints),
    }
    path = state_dir / "managers" / f"{name or pid}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps(doc))
    tmp.replace(path)
    return path
