"""Label and field selectors with kube-apiserver's grammar and error messages.

Purpose
    Parse ``labelSelector`` (equality-based ``=``, ``==``, ``!=`` and set-based
    ``in``, ``notin``, ``key``, ``!key``, plus ``>``/``<`` on integers, as
    ``k8s.io/apimachinery/pkg/labels`` does) and ``fieldSelector`` (``=``,
    ``==``, ``!=`` on ``metadata.name``, ``metadata.namespace`` and the
    per-resource fields of the resource table), and match objects.

Invariants
    * A parse either returns a selector or raises ``ApiError`` 400 with a
      message naming the problem; it never matches "everything" by accident.
    * Label keys and values are validated (qualified names, label values).

Concurrency model
    Immutable values and pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from local_apiserver.errors import ApiError, bad_request

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid label/annotation key (None if valid)."""
    prefix, sep, name = key.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"prefix part of {key!r} must be a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        return (
            f"name part of {key!r} must consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character (at most 63 characters)"
        )
    return None


def label_value_problem(value: str) -> str | None:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return (
            f"a valid label value must be an empty string or consist of alphanumeric characters, "
            f"'-', '_' or '.', and must start and end with an alphanumeric character "
            f"(at most 63 characters), got {value!r}"
        )
    return None


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if value is None:
            return False
        try:
            have = int(value)
        except ValueError:
            return False
        want = int(self.values[0])
        return have > want if self.op == "gt" else have < want


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


_TOKEN = re.compile(r"\s*(!=|==|=|!|\(|\)|,|>|<|[^\s!=(),<>]+)")


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse a ``labelSelector`` query value; raise ``ApiError`` 400 if invalid."""
    if text is None or not text.strip():
        return LabelSelector(())
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip() == "":
                break
            raise bad_request(f"unable to parse requirement: invalid label selector {text!r} at position {pos}")
        tokens.append(m.group(1))
        pos = m.end()
    reqs: list[Requirement] = []
    i = 0

    def fail(why: str) -> ApiError:
        return bad_request(f"unable to parse requirement: {why} (in label selector {text!r})")

    def word(j: int) -> str:
        if j >= len(tokens) or tokens[j] in ("!=", "==", "=", "!", "(", ")", ",", ">", "<"):
            raise fail("expected an identifier")
        return tokens[j]

    while i < len(tokens):
        if tokens[i] == "!":
            key = word(i + 1)
            reqs.append(Requirement(key, "!"))
            i += 2
        else:
            key = word(i)
            i += 1
            if i >= len(tokens) or tokens[i] == ",":
                reqs.append(Requirement(key, "exists"))
            elif tokens[i] in ("=", "==", "!="):
                op = "!=" if tokens[i] == "!=" else "="
                if i + 1 < len(tokens) and tokens[i + 1] not in (",",):
                    value = word(i + 1)
                    i += 2
                else:
                    value = ""
                    i += 1
                reqs.append(Requirement(key, op, (value,)))
            elif tokens[i] in (">", "<"):
                value = word(i + 1)
                try:
                    int(value)
                except ValueError as e:
                    raise fail(f"for 'Gt', 'Lt' operators, the value must be an integer, got {value!r}") from e
                reqs.append(Requirement(key, "gt" if tokens[i] == ">" else "lt", (value,)))
                i += 2
            elif tokens[i] in ("in", "notin"):
                op = tokens[i]
                if i + 1 >= len(tokens) or tokens[i + 1] != "(":
                    raise fail(f"expected '(' after {op!r}")
                i += 2
                values: list[str] = []
                while True:
                    if i >= len(tokens):
                        raise fail("expected ')'")
                    if tokens[i] == ")":
                        i += 1
                        break
                    if tokens[i] == ",":
                        if not values or (i + 1 < len(tokens) and tokens[i + 1] in (",", ")")):
                            values.append("")
                        i += 1
                        continue
                    values.append(word(i))
                    i += 1
                if not values:
                    raise fail(f"for {op!r} operator, values set can't be empty")
                reqs.append(Requirement(key, op, tuple(values)))
            else:
                raise fail(f"found {tokens[i]!r}, expected: '=', '!=', '==', 'in', 'notin', ',' or end of string")
        if i < len(tokens):
            if tokens[i] != ",":
                raise fail(f"found {tokens[i]!r}, expected ','")
            i += 1
            if i >= len(tokens):
                raise fail("found trailing ','")
    for r in reqs:
        problem = label_key_problem(r.key)
        if problem:
            raise fail(f"invalid label key {r.key!r}: {problem}")
        for v in r.values:
            problem = label_value_problem(v)
            if problem:
                raise fail(f"invalid label value: {problem}")
    return LabelSelector(tuple(reqs))


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    value: str
    equal: bool


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...]

    def matches(self, obj: Mapping[str, Any]) -> bool:
        for r in self.requirements:
            have = field_value(obj, r.field)
            if (have == r.value) != r.equal:
                return False
        return True

    def value_of(self, name: str) -> str | None:
        """The value an equality requirement pins ``name`` to, if any (for key-range narrowing)."""
        for r in self.requirements:
            if r.field == name and r.equal:
                return r.value
        return None


def field_value(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, Mapping):
        # Event "source" selects on source.component.
        comp = cur.get("component")
        return str(comp) if comp is not None else ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def parse_field_selector(text: str | None, allowed: tuple[str, ...], kind: str) -> FieldSelector:
    """Parse a ``fieldSelector``; fields outside ``allowed`` are a 400 like kube-apiserver's."""
    if text is None or not text.strip():
        return FieldSelector(())
    reqs: list[FieldRequirement] = []
    for raw in _split_unescaped(text):
        part = raw.strip()
        if not part:
            raise bad_request(f"invalid field selector {text!r}: empty requirement")
        for op in ("!=", "==", "="):
            if op in part:
                name, _, value = part.partition(op)
                break
        else:
            raise bad_request(f"invalid selector: '{part}'; can't understand '{part}'")
        name = name.strip()
        if name not in allowed:
            raise bad_request(f"field label not supported: {name} (for {kind}; supported: {', '.join(allowed)})")
        reqs.append(FieldRequirement(name, _unescape(value.strip()), op != "!="))
    return FieldSelector(tuple(reqs))


def _split_unescaped(text: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    escaped = False
    for ch in text:
        if escaped:
            cur.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


__all__ = [
    "FieldSelector",
    "LabelSelector",
    "field_value",
    "label_key_problem",
    "label_value_problem",
    "parse_field_selector",
    "parse_label_selector",
]
