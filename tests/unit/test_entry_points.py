"""Every ``python -m`` entry point works from a directory that shadows our packages (issue 41).

The directory holds decoys named like each top-level package (``rangeshard/``
as left by ``git clone``, ``hashing/``, ``registry/``, ... without
``__init__.py``): with the working directory first on ``sys.path`` and an
editable install, Python would import those as namespace packages
(``cannot import name '__version__' from 'rangeshard' (unknown location)``).
Each entry point is run as a user runs it, without ``-P``, and must exit 0
without a traceback (:mod:`rangeshard.core.entrypoint` runs it again with
``-P``). The benchmark's modules are not installed: they run with the
checkout on ``PYTHONPATH``, where its real packages win over the decoys.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import rangeshard
from hashing import hash_key
from rangeshard.core.entrypoint import PACKAGES, module_run, shadowing

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
#: ``hash_key("u1")``: the ``hash`` command imports ``hashing``, which a decoy would replace.
HASH_U1 = str(hash_key("u1"))

#: (id, command line, a line its output must contain); ``{empty}`` is an empty API server audit log.
ENTRY_POINTS: list[tuple[str, list[str], str]] = [
    ("rangeshard.cli.main --help", [PY, "-m", "rangeshard.cli.main", "--help"], "controller-manager"),
    ("rangeshard.cli.main --version", [PY, "-m", "rangeshard.cli.main", "--version"], "rangeshard "),
    ("rangeshard.cli.main hash", [PY, "-X", "dev", "-W", "ignore", "-m", "rangeshard.cli.main", "hash", "u1"], HASH_U1),
    ("audit --help", [PY, "-m", "controller_manager.audit", "--help"], "--apiserver-audit"),
    (
        "audit --apiserver-audit",
        [PY, "-m", "controller_manager.audit", "--apiserver-audit", "{empty}"],
        "0 stale-owner write(s)",
    ),
    ("local_apiserver --help", [PY, "-m", "local_apiserver", "--help"], "--etcd"),
    ("range_filter_proxy --help", [PY, "-m", "range_filter_proxy", "--help"], "--upstream"),
    ("rangeshard console script", [str(Path(PY).parent / "rangeshard"), "--help"], "controller-manager"),
    *(
        (f"{module} --help", [PY, "-m", module, "--help"], "usage:")
        for module in ("bench", "bench.feed", "bench.floor", "bench.upstream_server", "bench.scaleout_manager")
    ),
]


@pytest.fixture
def decoys(tmp_path: Path) -> Path:
    """A working directory with a decoy of every top-level package (and of ``bench``)."""
    for name in (*PACKAGES, "bench"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "README.md").write_text("not the package\n")
    (tmp_path / "empty-audit.jsonl").write_text("")
    return tmp_path


@pytest.mark.parametrize(
    ("command", "expected"), [(c, e) for _, c, e in ENTRY_POINTS], ids=[i for i, _, _ in ENTRY_POINTS]
)
def test_entry_point_runs_from_a_shadowing_directory(decoys: Path, command: list[str], expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    if command[2:3] == ["bench"] or "bench." in " ".join(command):
        env["PYTHONPATH"] = str(REPO)  # not installed: the checkout on the path, as from its root
    argv = [arg.replace("{empty}", str(decoys / "empty-audit.jsonl")) for arg in command]
    done = subprocess.run(argv, cwd=decoys, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert expected in done.stdout, done.stdout


def test_only_a_module_run_counts() -> None:
    assert module_run(["python", "-m", "controller_manager.audit", "--help"]) == "controller_manager.audit"
    assert module_run(["python", "-X", "dev", "-W", "error", "-u", "-mlocal_apiserver"]) == "local_apiserver"
    assert module_run(["python", "-c", "import x", "-m", "y"]) is None
    assert module_run(["python", "script.py", "-m", "y"]) is None
    assert module_run(["/venv/bin/rangeshard", "up"]) is None


def test_where_our_packages_live_does_not_shadow(decoys: Path) -> None:
    assert shadowing(Path(rangeshard.__file__).resolve().parents[1]) == []  # the checkout, for an editable install
    assert sorted(shadowing(decoys)) == sorted(PACKAGES)
