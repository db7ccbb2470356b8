"""Loading a config file: the strict YAML loader, every problem as ``FILE: field.path: problem``.

Invariants
    Duplicate keys are errors; every problem of a file is reported at once, paths in camelCase.

Concurrency model
    Pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ValidationError,
)

from controller_manager.config.models import ControllerSection, ManagerConfig
from rangeshard.core.errors import ConfigError
from rangeshard.core.etcd import parse_endpoints
from rangeshard.core.settings import FIELD_ERROR, check_api_url


class _StrictLoader(yaml.SafeLoader):
    """``SafeLoader`` that rejects duplicate mapping keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
    seen: dict[Hashable, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, Hashable) and key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r} (first on line {seen[key].start_mark.line + 1})",
                key_node.start_mark,
            )
        if isinstance(key, Hashable):
            seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_problem(path: Path, e: yaml.YAMLError) -> str:
    # Only the problem and its position: never str(e), whose source snippet could show a password.
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        return f"{path}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {e.problem}"
    if isinstance(e, yaml.reader.ReaderError):
        return f"{path}: invalid YAML: unacceptable character #x{e.character:04x} at byte {e.position}"
    return f"{path}: invalid YAML: {type(e).__name__}"


def _model_in(annotation: Any) -> tuple[type[BaseModel] | None, int]:
    """The model an annotation holds and how many ``loc`` steps (list index, dict key) lie before it."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _model_in(get_args(annotation)[0])
    if origin in (Union, UnionType):
        for arg in get_args(annotation):
            found = _model_in(arg)
            if found[0] is not None:
                return found
        return None, 0
    if origin in (list, tuple, dict):
        inner, steps = _model_in(get_args(annotation)[-1 if origin is dict else 0])
        return inner, steps + 1
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, 0
    return None, 0


def _model_at(loc: tuple[str, ...]) -> type[BaseModel] | None:
    """The model of the mapping at ``loc`` (field names as in the file), or ``None``."""
    model: type[BaseModel] = ManagerConfig
    rest = list(loc)
    while rest:
        key = rest.pop(0)
        field = next((f for name, f in model.model_fields.items() if (f.alias or name) == key), None)
        if field is None:
            return None
        inner, steps = _model_in(field.annotation)
        if inner is None or len(rest) < steps:
            return None
        del rest[:steps]
        model = inner
    return model


def _field_names(model: type[BaseModel]) -> list[str]:
    return sorted(f.alias or name for name, f in model.model_fields.items())


def _problems(e: ValidationError) -> list[tuple[str, str]]:
    """``(dotted.path, problem)`` for each error of a validation, spelled as in the file."""
    out: list[tuple[str, str]] = []
    for err in e.errors():
        loc = tuple(str(x) for x in err["loc"] if x != "[key]")
        typ = err["type"]
        ctx = err.get("ctx") or {}
        if typ == FIELD_ERROR:
            loc = (*loc, str(ctx["field"]))
            msg = err["msg"]
        elif typ == "value_error" and "error" in ctx:
            msg = str(ctx["error"])
        elif typ == "missing":
            msg = "required field is missing"
        elif typ == "extra_forbidden":
            model = _model_at(loc[:-1])
            msg = f"unknown field; expected one of: {', '.join(_field_names(model))}" if model else "unknown field"
        elif typ in ("model_type", "model_attributes_type", "dict_type"):
            msg = "expected a mapping"
        else:
            msg = err["msg"]
        out.append((".".join(loc), msg))
    return out


_FILE_FIELDS = (("etcd", "ca_cert"), ("etcd", "cert"), ("etcd", "key"), ("proxy", "token_file"), ("proxy", "ca_cert"))


def _resolve_cert_paths(cfg: ManagerConfig, path: Path) -> tuple[ManagerConfig, list[str]]:
    updates: dict[str, dict[str, str]] = {"etcd": {}, "proxy": {}}
    problems: list[str] = []
    for section, field in _FILE_FIELDS:
        model = getattr(cfg, section)
        value = getattr(model, field)
        if value is None:
            continue
        resolved = (path.parent / Path(value).expanduser()).resolve()
        # A token file may be provided later (a projected token appears when the pod
        # starts); the manager reports it at start-up if it is still missing.
        if field != "token_file" and not resolved.is_file():
            alias = type(model).model_fields[field].alias or field
            problems.append(f"{path}: {section}.{alias}: file not found: {resolved}")
        updates[section][field] = str(resolved)
    changed = {name: getattr(cfg, name).model_copy(update=u) for name, u in updates.items() if u}
    return cfg.model_copy(update=changed) if changed else cfg, problems


def _class_problems(raw: Any, reported: set[str], path: Path) -> list[str]:
    """Resolution problems of the controller entries that are otherwise valid (reported with the others)."""
    from controller_manager.plugins import resolve_controllers  # noqa: PLC0415 (imports user code)

    if not isinstance(raw, dict):
        return []
    sections: dict[str, ControllerSection] = {}
    for name, section in raw.items():
        entry = f"controllers.{name}"
        if any(f == entry or f.startswith(entry + ".") for f in reported):
            continue
        try:
            sections[str(name)] = ControllerSection.model_validate(section or {})
        except ValidationError:
            continue
    try:
        resolve_controllers(sections, path)
    except ConfigError as e:
        return e.problems
    return []


def load_config(path: str | Path, *, resolve: bool = True) -> ManagerConfig:
    """Read and validate a manager config file.

    Raises :class:`ConfigError` whose ``problems`` has one ``FILE: field.path: problem``
    line per problem (``FILE:LINE:COLUMN: invalid YAML: ...`` for syntax errors). With
    ``resolve`` (the default) every controller's class is imported and checked too
    (:func:`controller_manager.plugins.resolve_controllers`).
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(
            f"cannot read config {path}: {e.strerror or e}", [f"{path}: cannot read: {e.strerror or e}"]
        ) from e
    except UnicodeDecodeError as e:
        problem = f"{path}: not valid UTF-8 (byte {e.start})"
        raise ConfigError(f"invalid config {path}: not UTF-8", [problem]) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        problem = _yaml_problem(path, e)
        raise ConfigError(f"invalid config {path}: invalid YAML", [problem]) from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise ConfigError(f"invalid config {path}", [f"{path}: top level must be a mapping, got {got}"])
    try:
        cfg = ManagerConfig.model_validate(data)
    except ValidationError as e:
        found = _problems(e)
        problems = [f"{path}: {field}: {msg}" if field else f"{path}: {msg}" for field, msg in found]
        if resolve:
            problems += _class_problems(data.get("controllers"), {field for field, _ in found}, path)
        raise ConfigError(f"invalid config {path}: {len(problems)} problem(s)", problems) from None
    cfg, problems = _resolve_cert_paths(cfg, path)
    if problems:
        raise ConfigError(f"invalid config {path}: {len(problems)} problem(s)", problems)
    if resolve:
        from controller_manager.plugins import resolve_controllers  # noqa: PLC0415 (imports user code)

        resolve_controllers(cfg.controllers, path)
    return cfg


def with_overrides(cfg: ManagerConfig, *, etcd: str | None = None, proxy: str | None = None) -> ManagerConfig:
    """Apply the CLI's ``--etcd URL[,URL...]`` and ``--proxy URL`` to a loaded config.

    ``None`` keeps the file's value. Raises :class:`ConfigError` naming the option.
    """
    if etcd is not None:
        try:
            endpoints = tuple(e.url for e in parse_endpoints(etcd))
        except ConfigError as e:
            raise ConfigError(f"--etcd: {e}", [f"--etcd: {p}" for p in e.problems]) from e
        cfg = cfg.model_copy(update={"etcd": cfg.etcd.model_copy(update={"endpoints": endpoints})})
    if proxy is not None:
        try:
            url = check_api_url(proxy)
        except ValueError as e:
            shown = re.sub(r"//[^/@]*@", "//***@", proxy)  # never a password
            raise ConfigError(f"--proxy: {shown}: {e}") from None
        cfg = cfg.model_copy(update={"proxy": cfg.proxy.model_copy(update={"url": url})})
    return cfg
