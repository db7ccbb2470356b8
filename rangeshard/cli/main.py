"""The ``rangeshard`` command line (Typer).

Purpose
    One entry point for every component: ``hash``, ``registry list|dump``,
    ``etcd`` (a local etcd for development), ``up`` (the whole system locally),
    ``deploy rbac`` (manifests derived from a manager config),
    ``status``/``down`` (what ``up`` started in a state dir) and the component
    servers. This is the only place that
    configures logging handlers.

Invariants
    * Expected failures (:class:`~rangeshard.core.errors.RangeshardError`) print one
      clear line per problem on stderr and exit 2 (bad input) or 1 (runtime,
      e.g. etcd unreachable); never a traceback.
    * Dependency direction: the CLI may import every package; none imports it.

Concurrency model
    Commands run on the main thread; long-running ones stop on SIGINT/SIGTERM.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rangeshard.core.entrypoint import reexec_if_shadowed

# Before our imports: from a directory shadowing our packages they break (rangeshard.core.entrypoint).
reexec_if_shadowed("rangeshard.cli.main")

from hashing import hash_key  # noqa: E402
from rangeshard import __version__  # noqa: E402
from rangeshard.cli.common import EtcdOptions, configure_logging, fail, with_etcd_options  # noqa: E402
from rangeshard.core.errors import RangeshardError  # noqa: E402

app = typer.Typer(
    name="rangeshard",
    help="Run many instances of a Kubernetes controller at once, each owning a slice of a 63-bit hash space.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rangeshard {__version__}")
        raise typer.Exit(0)


#: Long-running commands whose INFO lines (joins, handovers, state changes) are their output.
INFO_BY_DEFAULT = {"controller-manager"}


@app.callback()
def root(
    ctx: typer.Context,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            help="debug, info, warning or error (default: info for controller-manager, whose state changes "
            "an operator wants to see; warning for the rest).",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """rangeshard: hash-range sharding for Kubernetes controllers."""
    if log_level is None:
        log_level = "info" if ctx.invoked_subcommand in INFO_BY_DEFAULT else "warning"
    configure_logging(log_level)


@app.command("hash")
@with_etcd_options
def hash_command(
    values: Annotated[list[str], typer.Argument(help="Strings to hash (usually object uids).", show_default=False)],
    controller_type: Annotated[
        str | None,
        typer.Option("--type", "-t", help="Also name the instance of this controller type owning each key."),
    ] = None,
    *,
    etcd_options: EtcdOptions,
) -> None:
    """Print the 63-bit key (FNV-1a 64 >> 1) of each VALUE, one decimal per line.

    With --type T each line is `KEY INSTANCE`: the instance of T whose range
    holds the key, read from the registry (`-` when no instance owns it now).
    """
    keys = [hash_key(value) for value in values]
    if controller_type is None:
        for key in keys:
            typer.echo(str(key))
        return
    from rangeshard.cli.rebalance_cmds import known_snapshot  # noqa: PLC0415 (registry only when asked)
    from rangeshard.core.etcd import EtcdClient  # noqa: PLC0415
    from registry import Registry  # noqa: PLC0415

    with EtcdClient(etcd_options.config()) as client:
        snap = known_snapshot(Registry(client, etcd_options.prefix), controller_type)
    for key in keys:
        owner = snap.owner_of(key)
        typer.echo(f"{key} {owner.instance_id if owner else '-'}")


LIGHT_COMMANDS = {"hash", "registry", "rebalance", "etcd", "status", "down", "deploy"}


def _requested_command(argv: list[str]) -> str | None:
    """The subcommand named on the command line (skipping root options and their values)."""
    args = iter(argv)
    for arg in args:
        if arg == "--log-level":
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


def _register_subcommands(argv: list[str]) -> None:
    """Register the commands; the component servers only when they may be needed.

    Importing the servers (FastAPI, the kubernetes client) costs about a second,
    so ``rangeshard registry list`` and friends skip it; ``--help`` without a
    command still lists everything. ``controller-manager`` registers itself
    alone: a manager (a sidecar beside every replica of a controller, issue
    39) loads no other command's code (tables, the other servers).
    """
    if _requested_command(argv) == "controller-manager":
        from rangeshard.cli.manager import controller_manager_command  # noqa: PLC0415

        app.command("controller-manager")(controller_manager_command)
        return
    from rangeshard.cli import deploy_cmds, rebalance_cmds, registry_cmds, state, up  # noqa: PLC0415

    app.add_typer(registry_cmds.app, name="registry")
    app.add_typer(rebalance_cmds.app, name="rebalance")
    app.add_typer(deploy_cmds.app, name="deploy")
    app.command("etcd")(up.etcd_command)
    app.command("status")(state.status_command)
    app.command("down")(state.down_command)
    if _requested_command(argv) in LIGHT_COMMANDS:
        return
    from rangeshard.cli import components  # noqa: PLC0415
    from rangeshard.dashboard import dashboard_command  # noqa: PLC0415

    components.register(app)
    app.command("up")(up.up_command)
    app.command("dashboard")(dashboard_command)


_register_subcommands(sys.argv[1:])


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except RangeshardError as e:  # a command forgot to translate: still no traceback
        try:
            fail(e)
        except typer.Exit as exit_:
            sys.exit(exit_.exit_code)


if __name__ == "__main__":
    main()
