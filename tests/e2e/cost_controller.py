"""The cost-balance benchmark's sleeping controller, configured for the e2e test (``class:`` in a manager config).

Purpose
    :class:`bench.scaleout_manager.SleepController` (the controller of
    ``python -m bench --sections balance``) with the e2e test's settings as
    class attributes, since a manager config names a class, not arguments:
    every ConfigMap in :data:`NAMESPACE` is reconciled again ``PERIOD``
    seconds after its last reconcile, and a reconcile sleeps ``LATENCY``
    times the ConfigMap's ``data.cost``.

Invariants
    * Only keys in :data:`NAMESPACE` sleep; anything else returns at once.
    * The sleep never runs past the reconcile deadline (the bench
      controller's own guard).

Concurrency model
    The manager's worker threads call ``reconcile``; nothing is shared.
"""

from __future__ import annotations

from typing import ClassVar

from bench.scaleout_manager import SleepController

#: Registry type of the controller.
CONTROLLER_TYPE = "costsleep"
#: Namespace of the ConfigMaps it works on.
NAMESPACE = "e2e-cost"
#: Seconds of sleep per unit of ``data.cost``.
LATENCY = 0.005
#: Seconds between the end of a key's reconcile and its next one.
PERIOD = 0.5


class CostSleepController(SleepController):
    """Sleeps ``LATENCY`` x ``data.cost`` per reconcile, every ``PERIOD`` seconds per key."""

    name: ClassVar[str] = CONTROLLER_TYPE
    namespace: ClassVar[str] = NAMESPACE
    latency: ClassVar[float] = LATENCY
    period: ClassVar[float] = PERIOD
