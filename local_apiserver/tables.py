"""Table answers of the local API server (``Accept: application/json;as=Table;g=meta.k8s.io;v=v1``).

Purpose
    Picks the columns of the requested resource (a served CRD's
    ``printer_columns`` on its :class:`ResourceSpec`, else the built-in
    printers of :mod:`rangeshard.core.tables`) and turns lists, single gets
    and watch streams into ``meta.k8s.io`` Tables, honouring
    ``includeObject``. Cells of a resource served in another form than it
    is stored (autoscaling/v1 HPAs) are computed from the stored form, as
    kube's printers read the internal type; rows embed the served object.

Invariants
    * A request is answered as a Table only when its first acceptable media
      type asks for one; everything else keeps the JSON object answers.
    * A bad ``includeObject`` is a 400 before anything is read.

Concurrency model
    Pure functions and a frozen value per request; safe on the event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from local_apiserver import conversion
from local_apiserver.errors import bad_request
from local_apiserver.routing import Target
from rangeshard.core import tables as core

Obj = dict[str, Any]


@dataclass(frozen=True)
class TableRequest:
    """What one Table request asked for."""

    columns: tuple[core.Column, ...]
    include: str
    version: str
    view: Callable[[Obj], Obj] | None = None  # the form cells are computed from (see :func:`requested`)

    def of(self, items: Iterable[Obj], list_meta: Obj) -> Obj:
        return core.build_table(
            self.columns, items, include=self.include, version=self.version, list_meta=list_meta, view=self.view
        )

    def single(self, obj: Obj) -> Obj:
        meta = {"resourceVersion": (obj.get("metadata") or {}).get("resourceVersion", "")}
        return self.of([obj], meta)

    def watch(self, lines: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        return core.table_watch(lines, self.columns, include=self.include, version=self.version, view=self.view)


def requested(request: Request, target: Target) -> TableRequest | None:
    """The Table request of a GET, or None when the client wants plain JSON; 400 for a bad ``includeObject``."""
    version = core.table_version(request.headers.get("accept"))
    if version is None:
        return None
    try:
        include = core.include_object(request.query_params.get("includeObject"))
    except ValueError as e:
        raise bad_request(str(e)) from e
    spec = target.spec
    if target.subresource:
        columns = core.DEFAULT_COLUMNS
    else:
        columns = core.columns_for(spec.group, spec.resource, spec.printer_columns)
    # A resource served in another form than it is stored (autoscaling/v1 HPAs): kube's printers read the
    # internal (stored) form, so cells come from it - a v1 HPA's TARGETS lists every metric, as kube's does.
    view = conversion.to_storage if spec.stored_as and not target.subresource else None
    return TableRequest(columns, include, version, view)
