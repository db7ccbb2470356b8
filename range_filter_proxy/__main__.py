"""``python -m range_filter_proxy --upstream URL --port P``: the proxy without the project CLI.

Purpose
    Entry point used by :class:`range_filter_proxy.process.ProxyProcess`.

Invariants
    Same options and exit codes as ``rangeshard proxy``.

Concurrency model
    Runs :func:`range_filter_proxy.cli.proxy_command` in the main thread.
"""

from __future__ import annotations

import typer

from range_filter_proxy.cli import proxy_command
from rangeshard.core import help_format


def main() -> None:
    """Run the proxy command."""
    help_format.install()
    typer.run(proxy_command)


if __name__ == "__main__":
    main()
