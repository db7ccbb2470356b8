"""A one-controller manager process for the scale-out benchmark: ``python -m bench.scaleout_manager``.

Purpose
    Runs :class:`SleepController` (main resource: ConfigMaps) in one
    :class:`~controller_manager.controller.ControllerRuntime`, i.e. the real
    sharding framework (registry join, handover, informers through the proxy
    with a ``shardSelector``, workqueue, workers, audit log), without touching
    ``controller_manager/``. The reconcile is I/O-bound by construction: it
    sleeps ``--latency`` seconds (a stand-in for API calls) and asks to be
    requeued at once, so every key in the instance's range is reconciled over
    and over and throughput is limited by workers x latency, not by the
    number of objects.

Invariants
    * Only keys in ``--namespace`` sleep; anything else returns at once.
    * The sleep never runs past the reconcile deadline (``ctx.remaining()``),
      so fencing stays safe.
    * The runtime resyncs every ``--resync-seconds`` (default 0.5 s, the
      framework's default is 30 s): keys refused while an instance pauses for
      a relist are dropped by the framework and only a resync brings them
      back, which would otherwise stall this requeue-forever controller for
      up to 30 s after every membership change.
    * The process leaves gracefully on SIGTERM/SIGINT and exits by itself
      after ``--max-seconds`` (never outlives the benchmark).

Concurrency model
    The main thread waits for a signal; the runtime's named threads do the work.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from controller_manager.audit import AuditLog
from controller_manager.controller import Controller, ControllerRuntime, ReconcileContext, Requeue
from controller_manager.fencing import api_client_for
from controller_manager.metrics import Metrics
from controller_manager.process import ManagerProcess
from controller_manager.resources import Resource
from controller_manager.shardhost import ShardSettings
from rangeshard.core.etcd import EtcdConfig
from rangeshard.core.logs import configure_logging

if TYPE_CHECKING:
    from rangeshard.localcluster import LocalCluster

log = logging.getLogger(__name__)


def start(cluster: LocalCluster, name: str, prefix: str, audit: Path, log_path: Path, *args: str) -> ManagerProcess:
    """This program as a manager of ``cluster`` (registry ``prefix``, instance ``name``); ``args`` add options.

    The one way the sections start it: a :class:`ManagerProcess` the cluster stops with itself.
    """
    command = [
        sys.executable, "-m", "bench.scaleout_manager",
        "--etcd", cluster.etcd_url, "--proxy", cluster.proxy_url,
        "--registry-prefix", prefix, "--instance", name, "--audit", str(audit), *args,
    ]  # fmt: skip
    return cluster.add(ManagerProcess(name, command, log_path, audit=audit, new_session=False))


CONFIGMAPS = Resource("configmaps", "", "v1", "ConfigMap", "CoreV1Api", "list_config_map_for_all_namespaces")
CONTROLLER_TYPE = "benchsleep"


class SleepController(Controller):
    """Reconcile = sleep ``latency`` seconds, then requeue (an I/O-bound controller that never finishes)."""

    name: ClassVar[str] = CONTROLLER_TYPE
    main: ClassVar[Resource] = CONFIGMAPS
    latency: ClassVar[float] = 0.05
    namespace: ClassVar[str] = "bench-scale"

    def __init__(self, runtime: ControllerRuntime) -> None:
        super().__init__(runtime)

    #: With ``--period P`` every key is reconciled again P seconds after its last reconcile (a steady,
    #: unsaturated demand) instead of at once; the sleep is ``latency`` x the object's ``data.cost`` (1 when absent).
    period: ClassVar[float] = 0.0

    def reconcile(self, key: str, ctx: ReconcileContext) -> None:
        if not key.startswith(self.namespace + "/"):
            return
        factor = 1.0
        if self.period > 0:
            obj = self.rt.informers[CONFIGMAPS.name].get(key) or {}
            try:
                factor = float((obj.get("data") or {}).get("cost", 1))
            except (TypeError, ValueError):
                factor = 1.0
        time.sleep(max(0.0, min(self.latency * factor, ctx.remaining() - 0.05)))
        raise Requeue(after=self.period, reason="benchmark: reconcile again")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scaleout_manager")
    p.add_argument("--etcd", required=True)
    p.add_argument("--proxy", required=True)
    p.add_argument("--registry-prefix", required=True)
    p.add_argument("--instance", required=True)
    p.add_argument("--audit", required=True)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--latency", type=float, default=0.05)
    p.add_argument("--namespace", default="bench-scale")
    p.add_argument("--lease-ttl", type=int, default=3)
    p.add_argument("--reconcile-timeout", type=float, default=1.0)
    p.add_argument("--resync-seconds", type=float, default=0.5)
    p.add_argument("--max-seconds", type=float, default=900.0)
    p.add_argument("--rejoin-grace", type=float, default=0.0, help="rejoinGraceSeconds: park on SIGTERM")
    p.add_argument("--period", type=float, default=0.0, help="requeue each key after this long (0: at once)")
    p.add_argument("--cost-window", type=float, default=300.0, help="costWindowSeconds")
    args = p.parse_args(argv)
    configure_logging("info")

    SleepController.latency = args.latency
    SleepController.namespace = args.namespace
    SleepController.period = args.period
    api: Any = api_client_for(args.proxy)
    audit = AuditLog(args.audit)
    rt = ControllerRuntime(
        SleepController,
        api_client=api,
        shard=ShardSettings(
            etcd_config=EtcdConfig.from_urls(args.etcd),
            registry_prefix=args.registry_prefix,
            controller_type=SleepController.name,
            instance_id=args.instance,
            lease_ttl=args.lease_ttl,
            reconcile_timeout=args.reconcile_timeout,
            rejoin_grace=args.rejoin_grace,
        ),
        workers=args.workers,
        metrics=Metrics(),
        audit=audit,
        resync_period=args.resync_seconds,
        cost_window=args.cost_window,
    )
    faulthandler.register(signal.SIGUSR1)  # the benchmark asks for every thread's stack when a stop hangs
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    rt.start()
    try:
        stop.wait(args.max_seconds)
    finally:
        rt.stop()
        audit.close()
        api.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
