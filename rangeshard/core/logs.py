"""The one logging setup of every entry point (``rangeshard``, ``python -m range_filter_proxy``, ...).

Purpose
    Library code only creates loggers (``logging.getLogger(__name__)``);
    an entry point calls :func:`configure_logging` once, so every process of
    ours writes the same line format whichever way it was started, uvicorn's
    own lines included (:mod:`rangeshard.core.serving` keeps uvicorn from
    installing its handlers).

Invariants
    * One stderr handler on the root logger, format :data:`LOG_FORMAT`;
      calling it again replaces the handler (``force``), never adds one.
    * An unknown level is a :class:`~rangeshard.core.errors.ConfigError`
      (the caller exits 2).
    * Below DEBUG, ``httpx`` logs warnings only (it would log one line per
      request).

Concurrency model
    Called once, on the main thread, before any other thread starts.
"""

from __future__ import annotations

import logging
import sys

from rangeshard.core.errors import ConfigError

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"
LEVELS = ("debug", "info", "warning", "error")


def parse_level(level: str) -> int:
    """``debug|info|warning|error`` (any case) as a logging level; ConfigError otherwise."""
    if level.lower() not in LEVELS:
        raise ConfigError(f"--log-level: unknown level {level!r} (use {', '.join(LEVELS)})")
    return int(logging.getLevelName(level.upper()))


def configure_logging(level: str) -> int:
    """Install the one stderr handler at ``level``; return the numeric level."""
    numeric = parse_level(level)
    logging.basicConfig(level=numeric, format=LOG_FORMAT, stream=sys.stderr, force=True)
    logging.getLogger("httpx").setLevel(logging.DEBUG if numeric <= logging.DEBUG else logging.WARNING)
    return numeric
