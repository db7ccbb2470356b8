"""The map is true: every package's ``__init__`` docstring names each of its modules and subpackages.

A module added without a line in its package's docstring fails here, so the
docstrings stay the table of contents docs/architecture.md points to.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["hashing", "registry", "range_filter_proxy", "controller_manager", "local_apiserver", "rangeshard"]


def _packages() -> list[str]:
    found: list[str] = []
    for top in PACKAGES:
        found.append(top)
        module = importlib.import_module(top)
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{top}."):
            if info.ispkg:
                found.append(info.name)
    return found


@pytest.mark.parametrize("package", _packages())
def test_package_docstring_lists_every_module(package: str) -> None:
    module = importlib.import_module(package)
    doc = module.__doc__ or ""
    missing = []
    for info in pkgutil.iter_modules(module.__path__):
        if info.name.startswith("_"):
            continue
        # ``name`` in a module list, or :mod:`package.name`
        if f"``{info.name}``" not in doc and f"{package}.{info.name}`" not in doc:
            missing.append(info.name)
    assert missing == [], f"{package}/__init__.py does not mention: {', '.join(missing)}"


def test_the_error_tree_draws_every_error_class() -> None:
    """Every subclass of RangeshardError defined anywhere in the project appears in core/errors.py's tree."""
    from rangeshard.core import errors  # noqa: PLC0415

    for top in PACKAGES:
        module = importlib.import_module(top)
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{top}."):
            if info.name.endswith("__main__"):
                continue
            importlib.import_module(info.name)
    seen: set[type] = set()
    todo: list[type] = [errors.RangeshardError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in seen and sub.__module__.split(".")[0] in PACKAGES:
                seen.add(sub)
                todo.append(sub)
    doc = errors.__doc__ or ""
    missing = sorted(c.__name__ for c in seen if f" {c.__name__} " not in doc)
    assert missing == [], f"rangeshard/core/errors.py's tree misses: {', '.join(missing)}"


def test_architecture_names_every_foundation_module() -> None:
    """docs/architecture.md's floor plan and its foundation row name each module of rangeshard/core."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    plan = text[text.index(" floor 1  foundation") : text.index(" floor 0  pure")]
    row = next(line for line in text.splitlines() if line.startswith("| foundation |"))
    modules = sorted(p.name for p in (ROOT / "rangeshard" / "core").glob("*.py") if not p.name.startswith("_"))
    assert modules, "no modules found under rangeshard/core"
    assert [m for m in modules if m not in plan] == [], "the floor plan's foundation box misses these"
    assert [m for m in modules if f"`{m}`" not in row] == [], "the foundation row misses these"
