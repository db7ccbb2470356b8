"""``--help`` shows flags as flags: no ``<bool>`` after ``--json``, no ``<list[str]>`` after ``VALUES...``.

Purpose
    Recent Typer releases print a type column for every parameter, so a
    boolean flag reads ``--json <bool>`` (as if it took a value) and a list
    argument ``values... <list[str]>``. :func:`install` changes only that
    column, process-wide, for every Typer app of ours (and the built-in
    ``--help``/``--version``): flags show no type; lists show their element
    type (``<str>``), with ``...`` for a repeatable option.

Invariants
    * Parsing is untouched: only the text of the help's type column changes.
    * Idempotent, and a no-op with Typer versions that have no such column.

Concurrency model
    Called at import time of each command line (``rangeshard``, ``python -m
    range_filter_proxy``, ``python -m local_apiserver``), before any command runs.
"""

from __future__ import annotations

from typing import Any, get_args

from typer import core

_installed = False


def install() -> None:
    """Patch the type column of Typer's help (see module docstring)."""
    global _installed  # noqa: PLW0603 (one process-wide switch)
    base = getattr(core, "_TyperParameter", None)
    if _installed or base is None or not hasattr(base, "display_type"):
        return
    original = base.display_type

    def display_type(self: Any, ctx: Any) -> str | None:
        if getattr(self, "is_flag", False) and not getattr(self, "count", False):
            return None
        desc = getattr(self, "type_descriptor", None)
        if desc is not None and getattr(desc, "is_list", False) and not getattr(desc, "is_choice", False):
            args = get_args(desc.annotation)
            element = args[0] if args else str
            name = element.__name__ if isinstance(element, type) else str(element)
            return f"<{name}>" if isinstance(self, core.TyperArgument) else f"<{name}>..."
        result: str | None = original(self, ctx)
        return result

    base.display_type = display_type
    _installed = True
