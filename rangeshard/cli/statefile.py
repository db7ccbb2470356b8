"""The state directory's records: what ``rangeshard up`` and managers started by hand wrote there.

Purpose
    ``DIR/up.json`` (:class:`UpState`) lists what ``up`` started (its own pid,
    whether it detached, each component: kind, pid, port, URL, health URL);
    ``DIR/managers/<name>.json`` (:class:`Component`) is a manager started by
    hand with ``--state-dir`` (also its proxy and etcd). :func:`etcd_from_state`
    and :func:`proxy_from_state` read the etcd and the proxy recorded there:
    the defaults of every command's ``--etcd`` and ``--proxy``.

Invariants
    * The state file is written atomically (temp file + rename).
    * A missing or unreadable record reads as absent, never an error.

Concurrency model
    Pure file reads and writes, from any thread.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rangeshard.core.process import process_start_time

#: Managers started by hand with ``--state-dir`` record themselves here (``<name>.json``), for ``status``.
MANAGERS_DIR = "managers"

STATE_FILE = "up.json"
ComponentKind = Literal["etcd", "apiserver", "proxy", "manager"]


class Component(BaseModel):
    """One child process of ``up`` as recorded in ``up.json``."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str
    kind: ComponentKind
    pid: int | None
    start_time: int | None = Field(None, alias="startTime")
    port: int | None
    url: str | None
    health_url: str | None = Field(None, alias="healthUrl")
    #: A manager started by hand: the proxy and etcd of its config (so ``status`` finds them without flags).
    proxy_url: str | None = Field(None, alias="proxyUrl")
    etcd: str | None = None


class UpState(BaseModel):
    """What ``up`` started (``DIR/up.json``)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    up_pid: int = Field(alias="upPid")
    up_start_time: int | None = Field(None, alias="upStartTime")
    detached: bool
    kubeconfig: str | None = None
    components: list[Component]


def alive(pid: int | None, start_time: int | None) -> bool:
    """The process exists and is the one recorded (same start time when one was recorded)."""
    if pid is None:
        return False
    now = process_start_time(pid)
    return now is not None and (start_time is None or now == start_time)


def write_state(state_dir: Path, state: UpState) -> None:
    path = state_dir / STATE_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_bytes(orjson.dumps(state.model_dump(mode="json", by_alias=True), option=orjson.OPT_INDENT_2))
    tmp.replace(path)


def read_state(state_dir: Path) -> UpState | None:
    """The recorded state, or None when there is none (or it is unreadable)."""
    try:
        return UpState.model_validate_json((state_dir / STATE_FILE).read_bytes())
    except (OSError, ValidationError):
        return None


def hand_managers(state_dir: Path) -> list[Component]:
    """The managers started by hand with ``--state-dir`` (``DIR/managers/*.json``; unreadable files skipped)."""
    found = []
    for path in sorted((state_dir / MANAGERS_DIR).glob("*.json")):
        with contextlib.suppress(OSError, ValidationError):
            found.append(Component.model_validate_json(path.read_bytes()))
    return found


def remove_state(state_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (state_dir / STATE_FILE).unlink()


def etcd_from_state(state_dir: Path) -> str | None:
    """The etcd a ``rangeshard up`` (else a manager started by hand) recorded in ``state_dir``, or None."""
    state = read_state(state_dir)
    if state is not None:
        found = next((c.url for c in state.components if c.kind == "etcd" and c.url), None)
        if found is not None:
            return found
    return next((c.etcd for c in hand_managers(state_dir) if c.etcd), None)


def proxy_from_state(state_dir: Path) -> str | None:
    """The URL of the proxy a ``rangeshard up`` recorded in ``state_dir`` (``None``: none recorded)."""
    state = read_state(state_dir)
    if state is None:
        return None
    return next((c.url for c in state.components if c.kind == "proxy" and c.url), None)
