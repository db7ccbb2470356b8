"""Component servers as ``rangeshard`` subcommands: local-apiserver, proxy, controller-manager.

Purpose
    Register each component's command function under the one CLI (the
    controller-manager's is :mod:`rangeshard.cli.manager`).

Concurrency model
    Main thread; the components run their own threads / event loops.
"""

from __future__ import annotations

import typer

from local_apiserver.cli import local_apiserver_command
from range_filter_proxy.cli import proxy_command
from rangeshard.cli.manager import controller_manager_command


def register(app: typer.Typer) -> None:
    app.command("local-apiserver")(local_apiserver_command)
    app.command("proxy")(proxy_command)
    app.command("controller-manager")(controller_manager_command)
