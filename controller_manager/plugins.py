"""Which class runs a configured controller: built-ins, ``class: "module:Class"``, entry points.

Purpose
    A manager config entry ``controllers: {widget: {class: "widgetctl:WidgetController"}}``
    names a :class:`~controller_manager.controller.Controller` subclass in user
    code, imported with the process's normal ``sys.path`` / ``PYTHONPATH``.
    An entry without ``class`` is a built-in controller (``replicaset``,
    ``deployment``) or an installed plugin: a distribution that declares the
    entry-point group ``rangeshard.controllers`` (``name = "module:Class"``), so
    ``pip install my-controllers`` is enough. :func:`resolve_controllers` turns
    the ``controllers`` section into classes, or raises :class:`ConfigError`
    with one ``FILE: controllers.<name>: problem`` line per problem.

Invariants
    * Lookup order for a bare name: built-ins, then entry points.
    * An import error, an attribute that is not a ``Controller`` subclass (or
      is abstract, or has no ``main`` resource), two entry points of one name
      pointing at different classes, an entry point or ``class:`` that reuses
      a built-in name for another class, and two entries that would register
      the same controller type are all errors, never a silent pick.
    * The registry type of a controller is its class's ``name`` (the config
      key when the class does not define one).

    * The controller framework (and with it the official Kubernetes client)
      is imported only to resolve an entry that runs a class: a config of
      ``external`` entries only loads none of it.

Concurrency model
    Pure functions called at start-up on the main thread; importing runs user
    module code once (Python's import cache).
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rangeshard.core.errors import ConfigError

if TYPE_CHECKING:
    from controller_manager.controller import Controller

ENTRY_POINT_GROUP = "rangeshard.controllers"
"""The entry-point group installed plugins declare (``name = "module:Class"``)."""

_TARGET_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
_TYPE_RE = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$")


class PluginProblem(Exception):
    """One resolution problem of one entry (message only)."""


def _entry_points() -> dict[str, list[metadata.EntryPoint]]:
    found: dict[str, list[metadata.EntryPoint]] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, []).append(ep)
    return found


def _builtins() -> Mapping[str, type[Controller]]:
    """The built-in controllers; the framework (and the official client) is imported only when a class is needed."""
    from controller_manager.config.common import BUILTIN_CONTROLLERS  # noqa: PLC0415

    return {name: import_target(target) for name, target in BUILTIN_CONTROLLERS.items()}


def available() -> dict[str, str]:
    """Names a bare config entry may use, with where each comes from (for messages and ``--help``)."""
    out = {name: f"built-in {cls.__module__}:{cls.__qualname__}" for name, cls in _builtins().items()}
    for name, eps in _entry_points().items():
        out.setdefault(name, f"entry point {eps[0].value}")
    return out


def import_target(target: str) -> Any:
    """Import ``module:attribute[.attribute]``; :class:`PluginProblem` describing what failed."""
    if not _TARGET_RE.match(target):
        raise PluginProblem(f"class {target!r} must be 'module:Class' (dotted module path, colon, class name)")
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise PluginProblem(f"cannot import module {module_name!r}: {e}") from None
    except Exception as e:  # user code failing at import time
        raise PluginProblem(f"importing module {module_name!r} failed: {type(e).__name__}: {e}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginProblem(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


def check_controller_class(obj: Any, what: str) -> type[Controller]:
    """``obj`` if it is a usable Controller subclass; :class:`PluginProblem` otherwise."""
    from controller_manager.controller import Controller  # noqa: PLC0415 (see _builtins)
    from controller_manager.resources import Resource  # noqa: PLC0415

    if not (inspect.isclass(obj) and issubclass(obj, Controller)):
        raise PluginProblem(f"{what} is not a Controller subclass (controller_manager.controller.Controller)")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        raise PluginProblem(f"{what} is abstract (does not implement {missing})")
    if not isinstance(getattr(obj, "main", None), Resource):
        raise PluginProblem(f"{what} declares no main resource (class attribute main = Resource(...))")
    _check_indexers(obj, what)
    return obj


def _check_indexers(cls: type[Controller], what: str) -> None:
    """``indexers``: a mapping of the class's own resources to ``{name: callable}``, no name a built-in index's."""
    from controller_manager.indexer import BUILTIN_INDEXERS  # noqa: PLC0415

    indexers = getattr(cls, "indexers", {})
    if not isinstance(indexers, Mapping):
        raise PluginProblem(f"{what}: indexers must be a mapping of Resource to {{name: function}}")
    own = {cls.main, *cls.dependents, *(res for res, _via in cls.chained)}
    for resource, funcs in indexers.items():
        if resource not in own:
            named = getattr(resource, "name", resource)
            raise PluginProblem(f"{what}: indexers names {named!r}, not its main, dependent or chained resource")
        if not isinstance(funcs, Mapping):
            raise PluginProblem(f"{what}: indexers[{resource.name}] must be a mapping of index name to function")
        for name, func in funcs.items():
            if not isinstance(name, str) or not name or name in BUILTIN_INDEXERS:
                raise PluginProblem(
                    f"{what}: indexers[{resource.name}]: index name {name!r} is empty or a built-in one "
                    f"({', '.join(BUILTIN_INDEXERS)})"
                )
            if not callable(func):
                raise PluginProblem(f"{what}: indexers[{resource.name}][{name!r}] is not a function")


def _resolve_one(name: str, target: str | None, eps: Mapping[str, list[metadata.EntryPoint]]) -> type[Controller]:
    builtin = _builtins().get(name)
    if target is not None:
        cls = check_controller_class(import_target(target), f"class {target!r}")
        if builtin is not None and cls is not builtin:
            raise PluginProblem(
                f"name clashes with the built-in controller {name!r}; choose another name for {target!r}"
            )
        return cls
    if builtin is not None:
        for ep in eps.get(name, []):
            if ep.value.replace(" ", "") != f"{builtin.__module__}:{builtin.__qualname__}":
                raise PluginProblem(
                    f"name clashes: built-in controller {name!r} and entry point {ep.value!r} "
                    f"(group {ENTRY_POINT_GROUP}); give the plugin another name"
                )
        return builtin
    candidates = eps.get(name, [])
    if not candidates:
        known = ", ".join(sorted(available())) or "none"
        raise PluginProblem(f"unknown controller (known: {known}); or give class: 'module:Class'")
    targets = sorted({ep.value.replace(" ", "") for ep in candidates})
    if len(targets) > 1:
        raise PluginProblem(f"name clashes: entry points of group {ENTRY_POINT_GROUP} disagree: {', '.join(targets)}")
    return check_controller_class(import_target(targets[0]), f"entry point {targets[0]!r}")


def controller_type(name: str, cls: type[Controller]) -> str:
    """The registry type of config entry ``name`` running ``cls``."""
    declared = getattr(cls, "name", None)
    return declared if isinstance(declared, str) and declared else name


def _check_shard(cls: type[Controller], shard: list[Any]) -> None:
    """``shard[].resource`` of an in-process entry must name the class's main resource or a dependent."""
    readable = {r.gvr.label: r for r in (cls.main, *cls.dependents)}
    for i, item in enumerate(shard):
        if item.resource not in readable:
            raise PluginProblem(
                f"shard[{i}].resource: {item.resource!r} is not read by {cls.__name__} "
                f"(its main resource or dependents: {', '.join(sorted(readable))})"
            )


def resolve_controllers(sections: Mapping[str, Any], source: str | Path | None = None) -> dict[str, type[Controller]]:
    """Classes of the ``controllers`` section (``name -> section`` with an optional ``class_``).

    Raises :class:`ConfigError` listing ``FILE: controllers.<name>: problem`` for every bad entry.
    """
    prefix = f"{source}: " if source is not None else ""
    eps: dict[str, list[metadata.EntryPoint]] | None = None  # read once, and only if a class is needed
    resolved: dict[str, type[Controller]] = {}
    problems: list[str] = []
    types: dict[str, str] = {}
    for name, section in sections.items():
        try:
            if getattr(section, "external", None) is not None:
                # An external program, not a class (controller_manager.external): its name is its type.
                cls, kind, whose = None, name, ""
            else:
                eps = _entry_points() if eps is None else eps
                cls = _resolve_one(name, getattr(section, "class_", None), eps)
                kind, whose = controller_type(name, cls), " (the class's name)"
            if not _TYPE_RE.match(kind):
                raise PluginProblem(f"controller type {kind!r}{whose} must be lowercase letters, digits, '-'")
            if kind in types:
                raise PluginProblem(f"name clashes: controllers.{types[kind]} also runs controller type {kind!r}")
            types[kind] = name
            if cls is not None:
                _check_shard(cls, getattr(section, "shard", None) or [])
                resolved[name] = cls
        except PluginProblem as e:
            problems.append(f"{prefix}controllers.{name}: {e}")
    if problems:
        where = f" {source}" if source is not None else ""
        raise ConfigError(f"invalid config{where}: {len(problems)} problem(s)", problems)
    return resolved
