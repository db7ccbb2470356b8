"""A bearer token read from a file: the one reader, re-reading a rotated file and keeping the last good token.

Purpose
    A manager sends the proxy the token of ``proxy.tokenFile`` (a projected
    ServiceAccount token, rotated by the kubelet). :class:`BearerTokenFile`
    is read by the official client's hook of the in-process controllers and
    by the external endpoint alike: a ``stat`` per use, the file re-read
    when its modification time changes.

Invariants
    * A file that is unreadable or empty at start is a
      :class:`~rangeshard.core.errors.ConfigError` (the process exits 2).
    * Later, an unreadable or empty file keeps the last good token (one
      WARNING until it is readable again): a rotation in progress never
      leaves a request without credentials.
    * The token is never logged.

Concurrency model
    Safe from any thread: each use replaces whole values; two threads that
    see the same change both re-read the file, which is harmless.
"""

from __future__ import annotations

import logging
import os

from rangeshard.core.errors import ConfigError

log = logging.getLogger(__name__)


class BearerTokenFile:
    """The token in ``path`` (see module docstring); ``what`` names the setting in messages."""

    def __init__(self, path: str, *, what: str = "proxy.tokenFile") -> None:
        self.path = path
        self.what = what
        self._mtime: float | None = None
        self._token = ""
        self._failing = False
        try:
            self._read(os.stat(path).st_mtime)
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{what}: cannot read {path}: {_why(e)}") from e
        if not self._token:
            raise ConfigError(f"{what}: {path} is empty")

    @property
    def token(self) -> str:
        """The current token (re-read when the file changed)."""
        try:
            mtime = os.stat(self.path).st_mtime
            if mtime != self._mtime:
                self._read(mtime)
        except (OSError, UnicodeDecodeError) as e:
            self._failed(_why(e))
        return self._token

    def authorization(self) -> str:
        """The ``Authorization`` header value: ``Bearer <token>``."""
        return f"Bearer {self.token}"

    def _read(self, mtime: float) -> None:
        with open(self.path, encoding="utf-8") as f:
            token = f.read().strip()
        if not token:
            self._failed("empty")
            return
        self._mtime = mtime
        self._token = token
        if self._failing:
            self._failing = False
            log.info("%s %s is readable again", self.what, self.path)

    def _failed(self, why: str) -> None:
        if self._token and not self._failing:
            self._failing = True
            log.warning("%s %s unreadable (%s); keeping the previous token", self.what, self.path, why)


def _why(error: OSError | UnicodeDecodeError) -> str:
    return str(getattr(error, "strerror", None) or error)
