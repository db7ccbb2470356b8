"""Label and field selectors, evaluated against cached objects.

Purpose
    The shared watch cache answers downstream lists and watches itself, so it
    must apply the selectors kube-apiserver would have applied upstream:
    ``labelSelector`` (equality- and set-based requirements: ``k=v``, ``k==v``,
    ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``, ``k>N``,
    ``k<N``) and ``fieldSelector`` (``path=v``, ``path==v``, ``path!=v`` joined
    by commas, with ``\\`` escapes). kube-apiserver restricts field selectors
    to a per-resource list of fields; here any dotted path into the object is
    accepted (``metadata.name``, ``metadata.namespace``, ``spec.nodeName``,
    ``status.phase``, ...). A missing field compares as the empty string.

Invariants
    * Parsing either returns a selector or raises :class:`SelectorParseError`
      (a ``ValueError``) naming the problem; it never raises anything else.
    * An empty selector string selects everything.

Concurrency model
    Immutable values and pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_KEY_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?")
_VALUE_RE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)?")
_MAX_SELECTOR = 16 * 1024


class SelectorParseError(ValueError):
    """A label or field selector that cannot be parsed; the message says why."""


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    """One requirement of a label selector."""

    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Evaluate against a label map."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if not present or value is None:
            return False
        try:
            number = int(value)
        except ValueError:
            return False
        bound = int(self.values[0])
        return number > bound if self.op == "gt" else number < bound


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A conjunction of label requirements (empty: everything)."""

    requirements: tuple[LabelRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True if every requirement holds."""
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        """True if the selector selects everything."""
        return not self.requirements


def _check_key(key: str, text: str) -> str:
    if not key or len(key) > 317 or not _KEY_RE.fullmatch(key):
        raise SelectorParseError(f"invalid label key {key!r} in label selector {text!r}")
    return key


def _check_value(value: str, text: str) -> str:
    if len(value) > 63 or not _VALUE_RE.fullmatch(value):
        raise SelectorParseError(f"invalid label value {value!r} in label selector {text!r}")
    return value


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorParseError(f"unbalanced ')' in label selector {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise SelectorParseError(f"unbalanced '(' in label selector {text!r}")
    parts.append("".join(current))
    return parts


_SET_RE = re.compile(r"^\s*(?P<key>[^\s!=<>(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*$")
_CMP_RE = re.compile(r"^\s*(?P<key>[^\s!=<>(),]+)\s*(?P<op>==|=|!=|<|>)\s*(?P<value>[^\s!=<>(),]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(?P<neg>!?)\s*(?P<key>[^\s!=<>(),]+)\s*$")


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse a ``labelSelector`` query value."""
    if text is None or not text.strip():
        return LabelSelector()
    if len(text) > _MAX_SELECTOR:
        raise SelectorParseError(f"label selector is {len(text)} characters long; at most {_MAX_SELECTOR} allowed")
    reqs: list[LabelRequirement] = []
    for part in _split_top_level(text):
        if not part.strip():
            raise SelectorParseError(f"empty requirement in label selector {text!r}")
        m = _SET_RE.match(part)
        if m:
            values = tuple(_check_value(v.strip(), text) for v in m.group("values").split(","))
            if m.group("values").strip() == "":
                raise SelectorParseError(f"{m.group('op')} needs at least one value in label selector {text!r}")
            reqs.append(LabelRequirement(_check_key(m.group("key"), text), m.group("op"), values))
            continue
        m = _CMP_RE.match(part)
        if m:
            key = _check_key(m.group("key"), text)
            op = m.group("op")
            value = m.group("value")
            if op in ("<", ">"):
                try:
                    int(value)
                except ValueError as e:
                    raise SelectorParseError(f"{op} needs an integer value, got {value!r} in {text!r}") from e
                reqs.append(LabelRequirement(key, "gt" if op == ">" else "lt", (value,)))
            else:
                reqs.append(LabelRequirement(key, "!=" if op == "!=" else "=", (_check_value(value, text),)))
            continue
        m = _EXISTS_RE.match(part)
        if m:
            reqs.append(LabelRequirement(_check_key(m.group("key"), text), "!" if m.group("neg") else "exists"))
            continue
        raise SelectorParseError(f"cannot parse requirement {part.strip()!r} of label selector {text!r}")
    return LabelSelector(tuple(reqs))


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    """``path == value`` or ``path != value``."""

    path: tuple[str, ...]
    value: str
    negate: bool

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Evaluate against an object (missing fields are the empty string)."""
        current: Any = obj
        for part in self.path:
            current = current.get(part) if isinstance(current, Mapping) else None
        if current is None:
            text = ""
        elif isinstance(current, bool):
            text = "true" if current else "false"
        else:
            text = str(current)
        return (text == self.value) != self.negate


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """A conjunction of field requirements (empty: everything)."""

    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """True if every requirement holds."""
        return all(r.matches(obj) for r in self.requirements)

    @property
    def empty(self) -> bool:
        """True if the selector selects everything."""
        return not self.requirements

    def required_value(self, path: str) -> str | None:
        """The value an ``=`` requirement fixes for ``path``, if any."""
        want = tuple(path.split("."))
        for r in self.requirements:
            if r.path == want and not r.negate:
                return r.value
        return None


_FIELD_PATH_RE = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


def _split_escaped(text: str, sep: str) -> list[str]:
    out: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            current.append(text[i : i + 2])
            i += 2
            continue
        if ch == sep:
            out.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    out.append("".join(current))
    return out


def _unescape(value: str, text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "\\":
            if i + 1 >= len(value) or value[i + 1] not in "\\,=":
                raise SelectorParseError(f"invalid escape in field selector {text!r}")
            out.append(value[i + 1])
            i += 2
            continue
        if ch in ",=":
            raise SelectorParseError(f"unescaped {ch!r} in value of field selector {text!r}")
        out.append(ch)
        i += 1
    return "".join(out)


def parse_field_selector(text: str | None) -> FieldSelector:
    """Parse a ``fieldSelector`` query value."""
    if text is None or not text.strip():
        return FieldSelector()
    if len(text) > _MAX_SELECTOR:
        raise SelectorParseError(f"field selector is {len(text)} characters long; at most {_MAX_SELECTOR} allowed")
    reqs: list[FieldRequirement] = []
    for part in _split_escaped(text, ","):
        for op in ("!=", "==", "="):
            idx = _find_unescaped(part, op)
            if idx >= 0:
                path = part[:idx].strip()
                raw = part[idx + len(op) :]
                break
        else:
            raise SelectorParseError(f"invalid field selector {text!r}: {part!r} has no operator (=, ==, !=)")
        if not _FIELD_PATH_RE.fullmatch(path):
            raise SelectorParseError(f"invalid field path {path!r} in field selector {text!r}")
        reqs.append(FieldRequirement(tuple(path.split(".")), _unescape(raw, text), op == "!="))
    return FieldSelector(tuple(reqs))


def _find_unescaped(text: str, needle: str) -> int:
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith(needle, i):
            return i
        i += 1
    return -1
