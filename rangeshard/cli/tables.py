"""How the CLI prints tables: never cut when piped, ``-o table|wide|json``.

Purpose
    :func:`table_console` is the console every table goes to. On a terminal
    it has the terminal's width; when stdout is not a terminal (a pipe, a
    file, a test) it is wide enough that no cell is cut or wrapped, so ids
    like ``m1-deployment-...`` stay whole for ``grep``/``awk``.
    :data:`OutputOpt` is the shared ``-o/--output`` option.

Invariants
    Tables are never ``expand``-ed, so the large width adds no padding.

Concurrency model
    Pure helpers, main thread.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated

import typer
from rich.console import Console

#: Wide enough for any row we print; rich only uses what the table needs.
PIPE_WIDTH = 100_000


class Output(StrEnum):
    """Values of ``-o/--output``."""

    table = "table"
    wide = "wide"
    json = "json"


OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table, wide (more columns) or json.")]


def table_console(*, stderr: bool = False) -> Console:
    """A console for tables: the terminal's width on a terminal, else never narrower than the table."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=PIPE_WIDTH, soft_wrap=False)
