"""Kubernetes list and watch query parameters, parsed and validated once, the way kube-apiserver does.

Purpose
    Both HTTP servers (the local API server and the range filter proxy)
    answer collection GETs. :meth:`ListQuery.parse` reads the common query
    parameters (``watch``, ``resourceVersion``, ``resourceVersionMatch``,
    ``sendInitialEvents``, ``allowWatchBookmarks``, ``timeoutSeconds``,
    ``limit``, ``continue``) and applies kube-apiserver's rules, so both
    servers accept and refuse exactly the same requests with the same codes.
    Selectors stay with :mod:`rangeshard.core.selectors` and
    :mod:`hashing` (each server knows which fields it allows).

Invariants
    * Unparsable values are ``400 BadRequest`` (as kube's query-parameter
      conversion): booleans follow Go's ``strconv.ParseBool`` (``1 t T TRUE
      true True`` / ``0 f F FALSE false False``); ``limit`` and
      ``timeoutSeconds`` are non-negative decimal integers (ASCII digits).
    * Forbidden combinations are ``422 Invalid`` with details ``kind:
      ListOptions, group: meta.k8s.io`` and one cause naming the field, in
      the order kube-apiserver's ``ValidateListOptions`` checks them.
    * ``resourceVersion`` is kept as given; each server parses it against its
      own store (both accept non-negative decimal integers).

Concurrency model
    Pure functions and a frozen value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rangeshard.core.kubeapi import ApiError, bad_request

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
#: The longest watch a client may ask for (kube-apiserver has no cap; ours keeps timers sane).
MAX_WATCH_TIMEOUT_SECONDS = 86_400
_MATCHES = ("Exact", "NotOlderThan")
_RVM = "resourceVersionMatch"


def parse_bool(params: Mapping[str, str], name: str) -> bool | None:
    """A boolean query parameter (``None`` when absent or empty); 400 for anything else."""
    value = params.get(name)
    if value is None or value == "":
        return None
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise bad_request(f"invalid value {value!r} for query parameter {name}: want true or false")


def parse_count(raw: str | None, name: str, *, most: int = 10**18) -> int | None:
    """A non-negative decimal integer query parameter (``None`` when absent or empty); 400 otherwise."""
    if raw is None or raw == "":
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:  # "²".isdigit() is True; int("²") fails
        raise bad_request(f'invalid value "{raw}" for query parameter {name}: want a non-negative integer')
    return min(int(raw), most)


def parse_limit(raw: str | None) -> int | None:
    """``limit``: 0 or absent mean no limit."""
    return parse_count(raw, "limit") or None


def invalid(field: str, message: str) -> ApiError:
    """A ``422 Invalid`` for ListOptions, worded and detailed as kube-apiserver's."""
    return ApiError(
        422,
        "Invalid",
        f'ListOptions.meta.k8s.io "" is invalid: {field}: {message}',
        {
            "group": "meta.k8s.io",
            "kind": "ListOptions",
            "causes": [{"reason": "FieldValueInvalid", "message": message, "field": field}],
        },
    )


@dataclass(frozen=True)
class ListQuery:
    """The common query parameters of a collection GET, parsed and validated (see module docstring)."""

    watch: bool = False
    resource_version: str | None = None
    resource_version_match: str | None = None
    send_initial_events: bool | None = None
    allow_watch_bookmarks: bool = False
    timeout_seconds: int | None = None
    limit: int | None = None
    continue_token: str | None = None

    @classmethod
    def parse(cls, params: Mapping[str, str], *, watch_path: bool = False) -> ListQuery:
        """Parse ``params`` (a request's query parameters); raise :class:`ApiError` 400 or 422.

        ``watch_path``: the request came by the legacy ``/watch/...`` path (a watch whatever ``watch`` says).
        """
        query = cls(
            watch=bool(parse_bool(params, "watch")) or watch_path,
            resource_version=params.get("resourceVersion") or None,
            resource_version_match=params.get("resourceVersionMatch") or None,
            send_initial_events=parse_bool(params, "sendInitialEvents"),
            allow_watch_bookmarks=bool(parse_bool(params, "allowWatchBookmarks")),
            timeout_seconds=parse_count(params.get("timeoutSeconds"), "timeoutSeconds", most=MAX_WATCH_TIMEOUT_SECONDS),
            limit=parse_limit(params.get("limit")),
            continue_token=params.get("continue") or None,
        )
        query.validate()
        return query

    def validate(self) -> None:
        """kube-apiserver's ``ValidateListOptions`` and the continue/resourceVersion rule."""
        match = self.resource_version_match
        if match is not None and match not in _MATCHES:
            raise invalid(_RVM, f'Unsupported value: "{match}": supported values: "Exact", "NotOlderThan"')
        if self.send_initial_events is not None:
            if not self.watch:
                raise invalid("sendInitialEvents", "sendInitialEvents is forbidden for list")
            if match != "NotOlderThan":
                raise invalid(_RVM, "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan")
            if self.send_initial_events and not self.allow_watch_bookmarks:
                raise invalid("allowWatchBookmarks", "sendInitialEvents requires setting allowWatchBookmarks to true")
        elif match is not None:
            if self.watch:
                raise invalid(_RVM, "resourceVersionMatch is forbidden for watch")
            if self.resource_version is None:
                raise invalid(_RVM, "resourceVersionMatch is forbidden unless resourceVersion is provided")
            if match == "Exact" and self.resource_version == "0":
                raise invalid(_RVM, 'resourceVersionMatch "exact" is forbidden for resourceVersion "0"')
            if self.continue_token is not None:
                raise invalid(_RVM, "resourceVersionMatch is forbidden when continue is provided")
        if self.continue_token is not None and not self.watch and self.resource_version not in (None, "0"):
            raise bad_request("specifying resource version is not allowed when using continue")
