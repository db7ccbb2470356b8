"""A controller whose main resource the local API server does not serve: for the not-ready reason test."""

from __future__ import annotations

from typing import ClassVar

from controller_manager.controller import Controller, ReconcileContext
from controller_manager.resources import Resource


class CertificateController(Controller):
    """Watches a resource nobody serves; does nothing (its informer never lists: 404 on the local API server)."""

    name: ClassVar[str] = "certificate"
    main: ClassVar[Resource] = Resource("gizmos", "example.org", "v1", "Gizmo")

    def reconcile(self, key: str, ctx: ReconcileContext) -> None:
        return None
