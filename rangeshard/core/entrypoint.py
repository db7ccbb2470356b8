"""``python -m`` entry points that work from any directory: a working directory shadowing our packages is left.

Purpose
    ``python -m MODULE`` puts the working directory first on ``sys.path``.
    Run from the directory that holds a clone named ``rangeshard`` (or from
    any directory with a ``hashing/``, ``registry/``, ... of its own), Python
    takes that directory for a namespace package of the same name: with an
    editable install our packages are found by a finder consulted only after
    ``sys.path``, so the namespace wins and the command fails
    (``cannot import name '__version__' from 'rangeshard' (unknown location)``).
    :func:`reexec_if_shadowed` is what each of our ``python -m`` entry points
    calls before it imports our packages: when this interpreter runs that
    module with such a working directory on its path, it executes itself
    again with ``-P`` (the working directory stays off ``sys.path``), the
    way :func:`rangeshard.core.process.python_module_command` starts our
    children. The ``rangeshard`` console script needs none of this (its
    ``sys.path[0]`` is its own directory).

Invariants
    * Standard library only: importing this module cannot itself trip over
      a shadowing directory.
    * Nothing happens unless this interpreter was started as ``python ... -m
      MODULE`` for the given module (importing the entry module elsewhere
      changes nothing), neither ``-P`` nor ``-I`` is in effect, and the
      working directory holds a directory or module named like one of our
      top-level packages without being the directory they are installed in
      (running from the checkout's root of an editable install is fine).
    * At most one re-execution: the new interpreter has ``-P``. Its command
      line is the original one (``sys.orig_argv``) with ``-P`` added, so
      the pid, arguments, environment and open descriptors stay.

Concurrency model
    Called at import time of an entry module, before any thread starts.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

#: Our top-level packages: a directory (or module) of one of these names in the working directory shadows it.
PACKAGES = ("rangeshard", "hashing", "registry", "range_filter_proxy", "controller_manager", "local_apiserver")

#: Where our top-level packages are installed (the checkout, for an editable install).
_HOME = Path(__file__).resolve().parents[2]

#: Interpreter options that take the next argument as their value.
_OPTIONS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def module_run(argv: list[str]) -> str | None:
    """The MODULE of an interpreter command line ``python [options] -m MODULE ...`` (``sys.orig_argv``), else None."""
    args = iter(argv[1:])
    for arg in args:
        if arg == "-m":
            return next(args, None)
        if arg.startswith("-m"):
            return arg[2:]
        if arg in _OPTIONS_WITH_VALUE:
            next(args, None)
        elif arg in ("-", "-c") or not arg.startswith("-") or arg.startswith("-c"):
            return None  # a script, ``-c`` or standard input: not a module
    return None


def shadowing(cwd: Path) -> list[str]:
    """Names in ``cwd`` that would shadow our packages for an interpreter with ``cwd`` first on its path."""
    try:
        if cwd.resolve() == _HOME:
            return []
        return [name for name in PACKAGES if (cwd / name).is_dir() or (cwd / f"{name}.py").is_file()]
    except OSError:  # a working directory removed or unreadable: nothing of it is imported either
        return []


def reexec_if_shadowed(module: str) -> None:
    """Execute this interpreter again with ``-P`` if it runs ``-m module`` from a directory shadowing our packages."""
    if sys.flags.safe_path or sys.flags.isolated or not sys.executable or module_run(sys.orig_argv) != module:
        return
    try:
        cwd = Path.cwd()
    except OSError:
        return
    names = shadowing(cwd)
    if not names:
        return
    log.debug("%s shadows %s: running %s again with -P", cwd, ", ".join(names), module)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execv(sys.executable, [sys.executable, "-P", *sys.orig_argv[1:]])  # noqa: S606 (ourselves again)
