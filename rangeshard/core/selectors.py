"""Label and field selectors: one parser for the local API server and the proxy.

Purpose
    Parse ``labelSelector`` (equality-based ``=``, ``==``, ``!=`` and
    set-based ``in``, ``notin``, ``key``, ``!key``, plus ``>``/``<`` on
    integers, as ``k8s.io/apimachinery/pkg/labels`` does) and ``fieldSelector``
    (``path=v``, ``path==v``, ``path!=v`` joined by commas, ``\\`` escapes),
    and match objects against them.

    What differs between callers is a parameter, not a copy:

    * the local API server passes ``allowed``, the per-kind labels of
      :func:`rangeshard.core.fieldlabels.field_labels` (``metadata.name``,
      ``metadata.namespace`` and kube's extra labels, each with how kube reads
      it), so any other field is a 400 "field label not supported", as
      kube-apiserver answers;
    * the proxy passes the same table for the built-in kinds it names, and
      ``allowed=None`` for others (custom resources): it filters a cache fed
      by an upstream that already validated the field, so any dotted path is
      accepted there.

Invariants
    * A parse either returns a selector or raises :class:`SelectorParseError`
      (an :class:`~rangeshard.core.kubeapi.ApiError` with code 400 and a
      message naming the problem); it never matches "everything" by accident.
    * An empty or absent selector string selects everything.
    * Label keys and values are validated (qualified names, label values);
      selectors longer than :data:`MAX_SELECTOR_LENGTH` are refused.
    * A requirement with an extractor compares what it reads; one without
      compares the value at its dotted path: missing as the empty string,
      booleans as ``true``/``false``, a mapping (an Event's ``source``) as its
      ``component``.

Concurrency model
    Immutable values and pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from rangeshard.core.fieldlabels import Extractor, render
from rangeshard.core.kubeapi import ApiError
from rangeshard.core.objpath import get_path

MAX_SELECTOR_LENGTH = 16 * 1024

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_FIELD_PATH = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_TOKEN = re.compile(r"\s*(!=|==|=|!|\(|\)|,|>|<|[^\s!=(),<>]+)")
_OPERATORS = ("!=", "==", "=", "!", "(", ")", ",", ">", "<")
_ESCAPE = re.compile(r"\\(.)", re.S)
_ESCAPE_OR_COMMA = re.compile(r"\\.|,", re.S)
_ESCAPED_TEXT = re.compile(r"(?:\\.|[^\\])*", re.S)  # no lone backslash at the end


class SelectorParseError(ApiError):
    """A label or field selector that cannot be parsed: 400 BadRequest, the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__(400, "BadRequest", message)


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
    """Why ``value`` is not a valid label value (None if valid)."""
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return (
            f"a valid label value must be an empty string or consist of alphanumeric characters, "
            f"'-', '_' or '.', and must start and end with an alphanumeric character "
            f"(at most 63 characters), got {value!r}"
        )
    return None


@dataclass(frozen=True, slots=True)
class Requirement:
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
        if value is None:
            return False
        try:
            have = int(value)
        except ValueError:
            return False
        want = int(self.values[0])
        return have > want if self.op == "gt" else have < want


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A conjunction of label requirements (empty: everything)."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True if every requirement holds."""
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        """True if the selector selects everything."""
        return not self.requirements


def _tokens(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip() == "":
                break
            raise SelectorParseError(f"unable to parse requirement: invalid label selector {text!r} at position {pos}")
        tokens.append(m.group(1))
        pos = m.end()
    return tokens


class _LabelParser:
    """Recursive-descent over the token list of one label selector."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.i = 0

    def fail(self, why: str) -> SelectorParseError:
        return SelectorParseError(f"unable to parse requirement: {why} (in label selector {self.text!r})")

    def word(self, j: int) -> str:
        if j >= len(self.tokens) or self.tokens[j] in _OPERATORS:
            raise self.fail("expected an identifier")
        return self.tokens[j]

    def parse(self) -> list[Requirement]:
        reqs: list[Requirement] = []
        tokens = self.tokens
        while self.i < len(tokens):
            reqs.append(self.requirement())
            if self.i < len(tokens):
                if tokens[self.i] != ",":
                    raise self.fail(f"found {tokens[self.i]!r}, expected ','")
                self.i += 1
                if self.i >= len(tokens):
                    raise self.fail("found trailing ','")
        return reqs

    def requirement(self) -> Requirement:
        tokens = self.tokens
        if tokens[self.i] == "!":
            key = self.word(self.i + 1)
            self.i += 2
            return Requirement(key, "!")
        key = self.word(self.i)
        self.i += 1
        if self.i >= len(tokens) or tokens[self.i] == ",":
            return Requirement(key, "exists")
        op = tokens[self.i]
        if op in ("=", "==", "!="):
            if self.i + 1 < len(tokens) and tokens[self.i + 1] != ",":
                value = self.word(self.i + 1)
                self.i += 2
            else:
                value = ""
                self.i += 1
            return Requirement(key, "!=" if op == "!=" else "=", (value,))
        if op in (">", "<"):
            value = self.word(self.i + 1)
            try:
                int(value)
            except ValueError as e:
                raise self.fail(f"for 'Gt', 'Lt' operators, the value must be an integer, got {value!r}") from e
            self.i += 2
            return Requirement(key, "gt" if op == ">" else "lt", (value,))
        if op in ("in", "notin"):
            return Requirement(key, op, self.value_set(op))
        raise self.fail(f"found {op!r}, expected: '=', '!=', '==', 'in', 'notin', ',' or end of string")

    def value_set(self, op: str) -> tuple[str, ...]:
        tokens = self.tokens
        if self.i + 1 >= len(tokens) or tokens[self.i + 1] != "(":
            raise self.fail(f"expected '(' after {op!r}")
        self.i += 2
        values: list[str] = []
        while True:
            if self.i >= len(tokens):
                raise self.fail("expected ')'")
            if tokens[self.i] == ")":
                self.i += 1
                break
            if tokens[self.i] == ",":
                if not values or (self.i + 1 < len(tokens) and tokens[self.i + 1] in (",", ")")):
                    values.append("")
                self.i += 1
                continue
            values.append(self.word(self.i))
            self.i += 1
        if not values:
            raise self.fail(f"for {op!r} operator, values set can't be empty")
        return tuple(values)


def _given(text: str | None, kind: str) -> str | None:
    """The selector string, None when it selects everything; 400 when longer than :data:`MAX_SELECTOR_LENGTH`."""
    if text is None or not text.strip():
        return None
    if len(text) > MAX_SELECTOR_LENGTH:
        raise SelectorParseError(
            f"{kind} selector is {len(text)} characters long; at most {MAX_SELECTOR_LENGTH} allowed"
        )
    return text


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse a ``labelSelector`` query value; raise :class:`SelectorParseError` if invalid."""
    if (text := _given(text, "label")) is None:
        return LabelSelector()
    parser = _LabelParser(text)
    reqs = parser.parse()
    for r in reqs:
        problem = label_key_problem(r.key)
        if problem:
            raise parser.fail(f"invalid label key {r.key!r}: {problem}")
        for v in r.values:
            problem = label_value_problem(v)
            if problem:
                raise parser.fail(f"invalid label value: {problem}")
    return LabelSelector(tuple(reqs))


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    """``field == value`` (``equal``) or ``field != value``."""

    field: str
    value: str
    equal: bool
    # How the kind renders this label (rangeshard.core.fieldlabels); None: the value at the dotted path.
    extract: Extractor | None = dataclass_field(default=None, compare=False, repr=False)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Evaluate against an object."""
        have = self.extract(obj) if self.extract is not None else field_value(obj, self.field)
        return (have == self.value) == self.equal


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

    def value_of(self, name: str) -> str | None:
        """The value an equality requirement pins ``name`` to, if any (for key-range narrowing)."""
        return next((r.value for r in self.requirements if r.field == name and r.equal), None)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string a field selector compares for ``path`` in ``obj`` (missing: ``""``)."""
    return render(get_path(obj, path))


def parse_field_selector(
    text: str | None,
    allowed: Collection[str] | Mapping[str, Extractor] | None = None,
    kind: str = "this resource",
) -> FieldSelector:
    """Parse a ``fieldSelector``.

    ``allowed`` names the fields the caller supports (others: 400 "field label
    not supported" naming ``kind``); ``None`` accepts any dotted path. A
    mapping (:func:`rangeshard.core.fieldlabels.field_labels`) also says how
    each label is read from an object.
    """
    extractors: Mapping[str, Extractor] = allowed if isinstance(allowed, Mapping) else {}
    if (text := _given(text, "field")) is None:
        return FieldSelector()
    reqs: list[FieldRequirement] = []
    for raw in _split_unescaped(text):
        part = raw.strip()
        if not part:
            raise SelectorParseError(f"invalid field selector {text!r}: empty requirement")
        for op in ("!=", "==", "="):
            idx = _find_unescaped(part, op)
            if idx >= 0:
                name, value = part[:idx].strip(), part[idx + len(op) :]
                break
        else:
            raise SelectorParseError(
                f"invalid selector: can't understand '{part}' in field selector {text!r} (expected =, == or !=)"
            )
        if allowed is not None and name not in allowed:
            raise SelectorParseError(f"field label not supported: {name} (for {kind}; supported: {', '.join(allowed)})")
        if not _FIELD_PATH.fullmatch(name):
            raise SelectorParseError(f"invalid field path {name!r} in field selector {text!r}")
        reqs.append(FieldRequirement(name, _unescape(value.strip(), text), op != "!=", extractors.get(name)))
    return FieldSelector(tuple(reqs))


def _split_unescaped(text: str) -> list[str]:
    """Split on commas that are not escaped with a backslash (escapes kept)."""
    out: list[str] = []
    start = 0
    for m in _ESCAPE_OR_COMMA.finditer(text):
        if m.group() == ",":
            out.append(text[start : m.start()])
            start = m.end()
    out.append(text[start:])
    return out


def _find_unescaped(text: str, needle: str) -> int:
    """Where ``needle`` first stands outside a backslash escape, -1 if nowhere."""
    found = re.finditer(r"\\.|" + re.escape(needle), text, re.S)
    return next((m.start() for m in found if not m.group().startswith("\\")), -1)


def _unescape(value: str, text: str) -> str:
    if not _ESCAPED_TEXT.fullmatch(value):
        raise SelectorParseError(f"invalid escape at the end of field selector {text!r}")
    return _ESCAPE.sub(r"\1", value)


__all__ = [
    "MAX_SELECTOR_LENGTH",
    "FieldRequirement",
    "FieldSelector",
    "LabelSelector",
    "Requirement",
    "SelectorParseError",
    "field_value",
    "label_key_problem",
    "label_value_problem",
    "parse_field_selector",
    "parse_label_selector",
]
