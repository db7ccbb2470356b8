"""Is a TCP port free, and if not, who holds it (for ``rangeshard up``'s fail-fast port check).

Purpose
    :func:`check_ports` tries to bind every requested port before anything is
    started and raises :class:`~rangeshard.core.errors.PortInUseError` naming
    each busy port and, where Linux lets us see it, the process listening on
    it (pid and command line, from ``/proc/net/tcp{,6}`` and ``/proc/*/fd``).
    When the holder cannot be seen (another user's process, no ``/proc``) the
    message says ``in use``.

Invariants
    * A port is "free" when a socket with ``SO_REUSEADDR`` (as every server
      of ours and etcd set it) can bind it on the given host; the probe socket
      is closed at once and never listens.
    * Only reads ``/proc``; never signals or touches the holder.

Concurrency model
    Pure functions, called on the main thread.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rangeshard.core.errors import PortInUseError

_LISTEN = "0A"
_PROC = Path("/proc")


@dataclass(frozen=True)
class PortHolder:
    """The process listening on a port (``pid`` None when it cannot be seen)."""

    pid: int | None
    command: str | None

    def describe(self) -> str:
        if self.pid is None:
            return "in use"
        return f"in use by pid {self.pid} ({self.command or '?'})"


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could bind ``host:port`` now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != _LISTEN:
                continue
            local_port = cols[1].rsplit(":", 1)[-1]
            with contextlib.suppress(ValueError):
                if int(local_port, 16) == port:
                    inodes.add(cols[9])
    return inodes


def _command_line(pid: int) -> str | None:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    text = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    return text[:160] + ("..." if len(text) > 160 else "") if text else None


def port_holder(port: int) -> PortHolder:
    """The process listening on ``port`` as far as ``/proc`` shows it."""
    targets = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not targets:
        return PortHolder(None, None)
    try:
        pids = [p for p in os.listdir(_PROC) if p.isdigit()]
    except OSError:
        return PortHolder(None, None)
    for pid in pids:
        fd_dir = _PROC / pid / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if link in targets:
                return PortHolder(int(pid), _command_line(int(pid)))
    return PortHolder(None, None)


def check_ports(ports: Mapping[str, int], host: str = "127.0.0.1") -> None:
    """Raise :class:`PortInUseError` listing every port of ``ports`` (what -> port) that cannot be bound."""
    problems = [
        f"port {port} ({what}) is {port_holder(port).describe()}"
        for what, port in ports.items()
        if not port_free(port, host)
    ]
    if problems:
        raise PortInUseError("; ".join(problems), problems)
