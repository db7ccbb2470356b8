"""The proxy's Table columns: built-in printers, a CRD's additionalPrinterColumns from the upstream, the default."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Mapping
from typing import Any

from range_filter_proxy.errors import UpstreamError
from range_filter_proxy.resources import ResourceInfo
from range_filter_proxy.tables import ProxyTables
from range_filter_proxy.upstream import ListResult
from rangeshard.core.rest import GVR

WIDGETS = ResourceInfo(GVR("example.com", "v1", "widgets"), "Widget", True, frozenset({"list", "watch"}))
GADGETS = ResourceInfo(GVR("example.org", "v1", "gadgets"), "Gadget", True, frozenset({"list", "watch"}))
PODS = ResourceInfo(GVR("", "v1", "pods"), "Pod", True, frozenset({"list", "watch"}))


class CrdUpstream:
    """Answers only the CustomResourceDefinition lists ProxyTables asks for (an in-memory fake of our Upstream)."""

    def __init__(self) -> None:
        self.calls: list[Mapping[str, str] | None] = []

    async def list(self, gvr: GVR, params: Mapping[str, str] | None = None) -> ListResult:
        self.calls.append(params)
        if gvr.resource != "customresourcedefinitions":
            raise UpstreamError("unexpected", 404)
        if params == {"fieldSelector": "metadata.name=widgets.example.com"}:
            crd = {
                "metadata": {"name": "widgets.example.com"},
                "spec": {
                    "versions": [
                        {
                            "name": "v1",
                            "additionalPrinterColumns": [
                                {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                                {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                            ],
                        }
                    ]
                },
            }
            return ListResult([crd], "5")
        raise UpstreamError("customresourcedefinitions.apiextensions.k8s.io not found", 404)


def test_columns_for_builtin_crd_and_unknown_kinds() -> None:
    upstream = CrdUpstream()
    tables = ProxyTables(upstream)  # type: ignore[arg-type]

    async def run() -> tuple[list[str], list[str], list[str]]:
        pods = [c.name for c in await tables.columns(PODS)]
        widgets = [c.name for c in await tables.columns(WIDGETS)]
        await tables.columns(WIDGETS)  # cached: no second lookup
        gadgets = [c.name for c in await tables.columns(GADGETS)]
        return pods, widgets, gadgets

    pods, widgets, gadgets = asyncio.run(run())
    assert pods == ["Name", "Ready", "Status", "Restarts", "Age", "IP", "Node", "Nominated Node", "Readiness Gates"]
    assert widgets == ["Name", "Size", "Age"]
    assert gadgets == ["Name", "Age"]
    assert len(upstream.calls) == 2


def test_custom_columns_fill_cells() -> None:
    tables = ProxyTables(CrdUpstream())  # type: ignore[arg-type]
    columns = asyncio.run(tables.columns(WIDGETS))
    obj: dict[str, Any] = {"metadata": {"name": "w1"}, "spec": {"size": 7}}
    assert [c.cell(obj, dt.datetime.now(dt.UTC)) for c in columns] == ["w1", 7, None]
