"""Table answers of the range filter proxy for what it serves from its cache.

Purpose
    ``kubectl get`` through the proxy asks for ``meta.k8s.io`` Tables; lists
    and watches served from the watch cache are turned into Tables here with
    the shared printers of :mod:`rangeshard.core.tables`. Custom resources
    get their ``additionalPrinterColumns``, read from the upstream's
    CustomResourceDefinition (``apiextensions.k8s.io/v1``) and remembered
    for :data:`CRD_COLUMNS_TTL` seconds; without one (or when the upstream
    serves no CRD API) they get ``Name``/``Age``.

Invariants
    * Pass-through requests are not touched: the upstream answers their
      Tables itself.
    * A failed CRD lookup never fails the request: the default columns are used.

Concurrency model
    Coroutines on the proxy's event loop; the column cache is a plain dict
    touched only from that loop.
"""

from __future__ import annotations

import logging
import time

from range_filter_proxy.errors import UpstreamError
from range_filter_proxy.resources import ResourceInfo
from range_filter_proxy.upstream import Upstream
from rangeshard.core import tables as core
from rangeshard.core.rest import GVR

log = logging.getLogger(__name__)
CRD_COLUMNS_TTL = 30.0
_CRDS = GVR("apiextensions.k8s.io", "v1", "customresourcedefinitions")
#: Groups whose resources are built into Kubernetes (no CRD to read columns from).
_BUILTIN_GROUPS = frozenset({"", "apps", "batch", "coordination.k8s.io", "events.k8s.io", "policy", "autoscaling"})


class ProxyTables:
    """The columns of every cached resource (built-in printers, or the CRD's printer columns)."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self._custom: dict[GVR, tuple[float, tuple[core.Column, ...]]] = {}

    async def columns(self, info: ResourceInfo) -> tuple[core.Column, ...]:
        gvr = info.gvr
        builtin = core.BUILTIN_COLUMNS.get((gvr.group, gvr.resource))
        if builtin is not None:
            return builtin
        if gvr.group in _BUILTIN_GROUPS or gvr.group.endswith(".k8s.io"):
            return core.DEFAULT_COLUMNS
        now = time.monotonic()
        cached = self._custom.get(gvr)
        if cached is not None and cached[0] > now:
            return cached[1]
        columns = core.DEFAULT_COLUMNS
        try:
            listed = await self.upstream.list(_CRDS, {"fieldSelector": f"metadata.name={gvr.resource}.{gvr.group}"})
        except UpstreamError as e:
            log.debug("no CustomResourceDefinition for %s (%s): default columns", gvr, e)
        else:
            for crd in listed.items:
                printer = core.crd_printer_columns(crd, gvr.version)
                if printer is not None:
                    columns = core.printer_columns(printer)
        self._custom[gvr] = (now + CRD_COLUMNS_TTL, columns)
        return columns
