"""Controllers from user code: ``class: "module:Class"``, entry points, and clear exit-2 errors."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller_manager.config import KNOWN_CONTROLLERS, load_config
from controller_manager.config.common import BUILTIN_CONTROLLERS
from controller_manager.controllers import ReplicaSetController
from controller_manager.plugins import available, import_target, resolve_controllers
from rangeshard.core.errors import ConfigError

PLUGIN = """
from typing import ClassVar
from controller_manager.controller import Controller
from controller_manager.resources import Resource

WIDGETS = Resource("widgets", "example.com", "v1", "Widget")


class WidgetController(Controller):
    name: ClassVar[str] = "widget"
    main: ClassVar[Resource] = WIDGETS

    def reconcile(self, key, ctx):
        return None


class Other(WidgetController):
    name: ClassVar[str] = "other"


class NotAController:
    pass


class Abstract(Controller):
    main: ClassVar[Resource] = WIDGETS


class ForeignIndex(WidgetController):
    indexers = {Resource("gizmos", "example.com", "v1", "Gizmo"): {"colour": lambda o: []}}


class BuiltinIndexName(WidgetController):
    indexers = {WIDGETS: {"owner": lambda o: []}}


class NotAFunction(WidgetController):
    indexers = {WIDGETS: {"colour": "spec.colour"}}
"""

BASE = "etcd: {endpoints: ['http://127.0.0.1:1']}\nproxy: {url: 'http://127.0.0.1:2'}\n"


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Iterator[Path]:
    pkg = tmp_path / "plugins"
    pkg.mkdir()
    (pkg / "widgetctl_t13.py").write_text(PLUGIN)
    (pkg / "broken_t13.py").write_text("import does_not_exist_anywhere_t13\n")
    sys.path.insert(0, str(pkg))
    yield pkg
    sys.path.remove(str(pkg))
    for mod in ("widgetctl_t13", "broken_t13"):
        sys.modules.pop(mod, None)


def write(tmp_path: Path, controllers: str) -> Path:
    path = tmp_path / "manager.yaml"
    path.write_text(BASE + "controllers:\n" + controllers)
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    return ei.value.problems


def test_class_is_imported_from_the_path(plugin_dir: Path, tmp_path: Path) -> None:
    path = write(tmp_path, "  widget: {class: 'widgetctl_t13:WidgetController', workers: 3}\n  replicaset: {}\n")
    cfg = load_config(path)
    classes = resolve_controllers(cfg.controllers, path)
    assert classes["widget"].__name__ == "WidgetController"
    assert classes["replicaset"] is ReplicaSetController
    assert cfg.controllers["widget"].workers == 3


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{class: 'broken_t13:X'}", "cannot import module 'broken_t13': No module named 'does_not_exist_anywhere_t13'"),
        ("{class: 'nowhere_t13:X'}", "cannot import module 'nowhere_t13'"),
        ("{class: 'widgetctl_t13:Missing'}", "module 'widgetctl_t13' has no attribute 'Missing'"),
        ("{class: 'widgetctl_t13:NotAController'}", "is not a Controller subclass"),
        ("{class: 'widgetctl_t13:Abstract'}", "is abstract (does not implement reconcile)"),
        ("{class: 'widgetctl_t13'}", "must be 'module:Class'"),
        ("{class: 'widgetctl_t13:ForeignIndex'}", "indexers names 'gizmos', not its main, dependent or chained"),
        ("{class: 'widgetctl_t13:BuiltinIndexName'}", "index name 'owner' is empty or a built-in one"),
        ("{class: 'widgetctl_t13:NotAFunction'}", "indexers[widgets]['colour'] is not a function"),
    ],
)
def test_bad_classes_name_the_entry(plugin_dir: Path, tmp_path: Path, entry: str, message: str) -> None:
    path = write(tmp_path, f"  widget: {entry}\n")
    found = problems(path)
    assert len(found) == 1
    assert found[0].startswith(f"{path}: controllers.widget: ")
    assert message in found[0]


def test_name_clashes_are_errors(plugin_dir: Path, tmp_path: Path) -> None:
    path = write(tmp_path, "  replicaset: {class: 'widgetctl_t13:WidgetController'}\n")
    assert problems(path) == [
        f"{path}: controllers.replicaset: name clashes with the built-in controller 'replicaset'; "
        "choose another name for 'widgetctl_t13:WidgetController'"
    ]
    path = write(
        tmp_path, "  a: {class: 'widgetctl_t13:WidgetController'}\n  b: {class: 'widgetctl_t13:WidgetController'}\n"
    )
    assert problems(path) == [f"{path}: controllers.b: name clashes: controllers.a also runs controller type 'widget'"]


def test_cli_exits_2_with_file_and_entry(plugin_dir: Path, tmp_path: Path) -> None:
    path = write(tmp_path, "  widget: {class: 'widgetctl_t13:NotAController'}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "rangeshard.cli.main", "controller-manager", "--config", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{path}: controllers.widget: class 'widgetctl_t13:NotAController' is not a Controller subclass" in (
        proc.stderr
    )


def _dist(root: Path, name: str, entries: str) -> None:
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[rangeshard.controllers]\n{entries}\n")


def test_installed_entry_points_are_found_by_bare_name(plugin_dir: Path, tmp_path: Path) -> None:
    _dist(plugin_dir, "widgets_t13", "wt13 = widgetctl_t13:WidgetController\nreplicaset = widgetctl_t13:Other")
    path = write(tmp_path, "  wt13: {workers: 2}\n")
    assert resolve_controllers(load_config(path).controllers)["wt13"].__name__ == "WidgetController"
    path = write(tmp_path, "  replicaset: {}\n")
    assert problems(path) == [
        f"{path}: controllers.replicaset: name clashes: built-in controller 'replicaset' and entry point "
        "'widgetctl_t13:Other' (group rangeshard.controllers); give the plugin another name"
    ]
    _dist(plugin_dir, "more_t13", "wt13 = widgetctl_t13:Other")
    path = write(tmp_path, "  wt13: {}\n")
    assert problems(path) == [
        f"{path}: controllers.wt13: name clashes: entry points of group rangeshard.controllers disagree: "
        "widgetctl_t13:Other, widgetctl_t13:WidgetController"
    ]


def test_up_checks_the_manager_config_before_starting_anything(plugin_dir: Path, tmp_path: Path) -> None:
    path = write(tmp_path, "  widget: {class: 'widgetctl_t13:Missing'}\n")
    state = tmp_path / "state"
    proc = subprocess.run(
        [sys.executable, "-m", "rangeshard.cli.main", "up", "--config", str(path), "--state-dir", str(state)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(plugin_dir)},
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{path}: controllers.widget: module 'widgetctl_t13' has no attribute 'Missing'" in proc.stderr
    assert not state.exists()  # nothing was started


def test_the_one_list_of_built_ins_names_each_class_by_its_registry_type() -> None:
    """config.BUILTIN_CONTROLLERS is the only list: each entry imports to a controller whose ``name`` is its key."""
    assert KNOWN_CONTROLLERS == ("replicaset", "deployment")
    for name, target in BUILTIN_CONTROLLERS.items():
        assert import_target(target).name == name
        assert available()[name] == f"built-in {target}"
