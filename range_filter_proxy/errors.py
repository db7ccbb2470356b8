"""Errors of the range filter proxy, and their Kubernetes ``Status`` form.

Purpose
    The proxy's own failures are subclasses of :class:`rangeshard.core.errors.RangeshardError`
    (the project's one error tree); foreign errors (httpx, kubernetes config
    loading, orjson) are translated where they occur with ``raise ... from e``.
    The upstream's failures are the error tree's :class:`UpstreamError`
    family (re-exported here). :class:`ApiError` (shared with the local API server, from
    :mod:`rangeshard.core.kubeapi`, re-exported here with its 410 ``Expired``
    constructor :func:`gone`) is what request handlers raise for a
    client-visible failure; the HTTP layer renders it as a Kubernetes
    ``Status`` object.

Invariants
    * Every :class:`ApiError` carries an HTTP code in the 4xx/5xx range and a
      Kubernetes ``reason`` (``BadRequest``, ``Invalid``, ``NotFound``,
      ``Expired``/``Gone``, ``Timeout``, ...). Bad input is always a 4xx.

Concurrency model
    Plain exception classes and a pure function; no state.
"""

from __future__ import annotations

from rangeshard.core.errors import RangeshardError, UpstreamError, UpstreamGone, UpstreamUnavailable
from rangeshard.core.kubeapi import ApiError, bad_request, gone

__all__ = [
    "ApiError",
    "ProxyError",
    "UpstreamError",
    "UpstreamGone",
    "UpstreamUnavailable",
    "bad_request",
    "gone",
]


class ProxyError(RangeshardError):
    """Base of every error the range filter proxy raises on purpose."""
