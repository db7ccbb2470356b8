"""Python children are started with ``-P``: a directory named like our package in the cwd cannot shadow it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rangeshard.core.process import python_module_command


@pytest.fixture
def shadow(tmp_path: Path) -> Path:
    """The directory that holds a clone: ``rangeshard/`` there has no ``__init__.py``."""
    for name in ("rangeshard", "range_filter_proxy", "local_apiserver"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "README.md").write_text("not the package\n")
    return tmp_path


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_command_shape() -> None:
    assert python_module_command("local_apiserver", "--port", "1") == [
        sys.executable,
        "-P",
        "-m",
        "local_apiserver",
        "--port",
        "1",
    ]


@pytest.mark.parametrize("module", ["rangeshard.cli.main", "range_filter_proxy", "local_apiserver"])
def test_children_import_the_installed_package_from_a_shadowing_directory(shadow: Path, module: str) -> None:
    done = _run(python_module_command(module, "--help"), shadow)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
