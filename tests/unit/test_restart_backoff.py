"""``rangeshard up`` restarts a manager that exits with the one retry policy: 1 s doubling to 30 s, reset by a
run of a minute (as the external controller's child is restarted)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rich.console import Console

from rangeshard.cli.up import ManagerSupervisor


class _Manager:
    name = "m0"
    pid = None

    def __init__(self) -> None:
        self.returncode: int | None = None

    def start(self) -> None:
        self.returncode = None


def test_a_manager_that_keeps_exiting_is_restarted_after_growing_delays(tmp_path: Path) -> None:
    m = _Manager()
    sup = ManagerSupervisor([m], tmp_path, Console(file=io.StringIO()))  # type: ignore[list-item]
    delays: list[float] = []
    now = sup._started["m0"]

    def exit_after(ran: float) -> None:
        nonlocal now
        now += ran
        m.returncode = 1
        sup.check(m, now)  # type: ignore[arg-type]
        due: Any = sup._due["m0"]
        delays.append(due - now)
        now = due
        sup.check(m, now)  # type: ignore[arg-type]
        assert m.returncode is None and sup.restarts["m0"] == len(delays)

    for _ in range(7):
        exit_after(1.0)
    exit_after(60.0)
    exit_after(1.0)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 1.0, 2.0]
