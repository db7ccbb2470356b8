"""Handover: what one range change costs, against a restart of the controller (issue 46 point 5).

Purpose
    For each size in ``sizes`` (pods; the full run 10,000 and 100,000), on a
    kube-like upstream (:mod:`bench.upstream_server`: a consistent list
    there is a quorum read, no bookmark ever comes, no progress on request),
    reached through a :class:`bench.common.CountingRelay`, the unmodified
    ``rangeshard proxy`` caching pods, a private etcd for the registry, and
    managers whose one ``external`` entry runs :mod:`bench.handover_child`
    (a list-then-watch pod informer counting what it receives), sharded
    ``by: uid``:

    * **join**: manager A owns everything; manager B joins. Seconds from B's
      spawn until both instances are ``active`` and both controllers have
      listed their new ranges; bytes the upstream sent meanwhile; objects
      the two controllers received; the proxy's upstream lists
      (``range_filter_proxy_relists_total`` + ``..._consistent_read_fallbacks_total``).
    * **restart**: A's controller is SIGKILLed; its manager starts it again
      (backoff 1 s): seconds until it listed again, bytes upstream, objects
      received, upstream lists.
    * **one upstream LIST**: the bytes of one full list of the upstream, what
      a handover cost when its relists fell back to the API server (and what
      a restart of a controller costs that lists the API server directly).

Invariants
    * Every process started here is stopped in ``finally``; every wait is
      bounded by a deadline.
    * Each join moves half of the hash space: the controllers' objects after
      it add up to every pod (checked by the quick test).

Concurrency model
    The caller's thread starts the processes and polls the registry, the
    proxy's metrics and the children's count files.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from bench.common import CountingRelay, metric_value, scrape, settled, wait_for
from bench.throughput import _spawn_printing_port
from controller_manager.process import ManagerProcess
from range_filter_proxy.process import ProxyProcess
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.etcdserver import EtcdServer
from registry import Registry

log = logging.getLogger(__name__)

CHILD = Path(__file__).with_name("handover_child.py")
TYPE = "bench-handover"


def _counts(path: Path) -> list[dict[str, Any]]:
    try:
        return [orjson.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, orjson.JSONDecodeError):
        return []


def _objects(paths: list[Path]) -> int:
    """Objects the controllers received: list items and watch events (recorded at each list)."""
    return sum(line["items"] + line["events"] for path in paths for line in _counts(path))


def _lists(path: Path) -> int:
    return len(_counts(path))


class _Setup:
    """The upstream, relay, proxy and etcd of one size; managers started on demand."""

    def __init__(self, workdir: Path, objects: int) -> None:
        self.workdir = workdir
        self.objects = objects
        self.prefix = f"/bench-handover-{uuid.uuid4().hex[:8]}"
        self.upstream, port = _spawn_printing_port(["bench.upstream_server", "--objects", str(objects)])
        self.relay = CountingRelay()
        self.proxy_relay = self.relay.add(port)
        self.direct = self.relay.add(port)
        self.etcd = EtcdServer(workdir / f"etcd-{objects}", fast=True)
        self.etcd.start()
        self.proxy = ProxyProcess(
            self.relay.url(self.proxy_relay),
            resources=["pods"],
            log_file=workdir / f"handover-proxy-{objects}.log",
            extra_args=["--log-level", "warning"],
        )
        self.proxy.start(timeout=300)
        self.client = EtcdClient(EtcdConfig.from_urls(self.etcd.url))
        self.registry = Registry(self.client, self.prefix)
        self.managers: list[ManagerProcess] = []
        self.count_files: list[Path] = []

    def manager(self, name: str) -> tuple[ManagerProcess, Path]:
        counts = self.workdir / f"{name}-{self.objects}.counts"
        cfg = {
            "etcd": {"endpoints": [self.etcd.url]},
            "proxy": {"url": self.proxy.url},
            "registryPrefix": self.prefix,
            # A manager relaying one list of 50,000 pods holds the GIL for seconds on a loaded host: a short TTL
            # would fence it (measured: 5 s fenced the giver at 100,000 pods on 2 busy cores).
            "leaseTTLSeconds": 15,
            "controllers": {
                TYPE: {
                    "external": {
                        "command": [sys.executable, str(CHILD), str(counts)],
                        "shard": [{"resource": "pods", "by": "uid"}],
                        "drainSeconds": 0.5,
                    }
                }
            },
        }
        path = self.workdir / f"{name}-{self.objects}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        m = ManagerProcess.of_config(
            name, path, self.workdir / f"{name}-{self.objects}.log", instance_prefix=name, log_level="warning"
        )
        m.start()
        self.managers.append(m)
        self.count_files.append(counts)
        return m, counts

    def upstream_lists(self) -> float:
        text = scrape(self.proxy.url + "/metrics")
        return metric_value(text, "range_filter_proxy_relists_total", resource="pods") + metric_value(
            text, "range_filter_proxy_consistent_read_fallbacks_total", resource="pods"
        )

    def snapshot(self) -> dict[str, float]:
        return {
            "t": time.monotonic(),
            "bytes": float(self.relay.down[self.proxy_relay]),
            "objects": float(_objects(self.count_files)),
            "lists": self.upstream_lists(),
        }

    def delta(self, before: dict[str, float]) -> dict[str, Any]:
        now = self.snapshot()
        return {
            "seconds": round(now["t"] - before["t"], 3),
            "upstreamBytes": int(now["bytes"] - before["bytes"]),
            "objectsToControllers": int(now["objects"] - before["objects"]),
            "upstreamLists": int(now["lists"] - before["lists"]),
        }

    def one_upstream_list_bytes(self) -> int:
        before = self.relay.down[self.direct]
        httpx.get(self.relay.url(self.direct) + "/api/v1/pods", timeout=120).raise_for_status()
        return self.relay.down[self.direct] - before

    def stop(self) -> None:
        for m in self.managers:
            try:
                m.stop()
            except Exception as e:  # a benchmark cleans up what it can
                log.warning("stopping %s: %s", m.name, e)
        self.client.close()
        self.proxy.stop()
        self.etcd.stop()
        self.relay.close()
        if self.upstream.poll() is None:
            self.upstream.terminate()
        self.upstream.wait(10)


def _settled(setup: _Setup, n: int) -> bool:
    ok, _why = settled(setup.registry, TYPE, n)
    return ok


def measure(workdir: Path, objects: int, timeout: float) -> dict[str, Any]:
    """Join, then a controller restart, at ``objects`` pods (see the module docstring)."""
    setup = _Setup(workdir, objects)
    try:
        _a, a_counts = setup.manager("a")
        wait_for(lambda: _settled(setup, 1), timeout, "the first instance active")
        wait_for(lambda: any(c["items"] == objects for c in _counts(a_counts)), timeout, "A's controller listed all")
        result: dict[str, Any] = {"objects": objects}

        before = setup.snapshot()
        _b, b_counts = setup.manager("b")
        wait_for(lambda: _settled(setup, 2), timeout, "both instances active after the join")

        def split() -> list[int] | None:
            """The items of each controller's last list since the join, once they add up to every pod."""
            last = [[c for c in _counts(f) if c["t"] > before["t"]] for f in (a_counts, b_counts)]
            items = [cs[-1]["items"] if cs else 0 for cs in last]
            return items if sum(items) == objects and all(items) else None

        ranges = wait_for(split, timeout, "both controllers listed their new ranges")
        join = setup.delta(before)
        join["itemsPerController"] = ranges
        result["join"] = join

        member = next(m for m in setup.registry.snapshot(TYPE) if m.instance_id.startswith("a"))
        pid = member.record.child.pid if member.record.child is not None else None
        if pid is None:
            raise RuntimeError("A's controller has no pid in the registry")
        before = setup.snapshot()
        a_lists = _lists(a_counts)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: _lists(a_counts) > a_lists, timeout, "A's controller listed again after its restart")
        result["restart"] = setup.delta(before)
        result["oneUpstreamListBytes"] = setup.one_upstream_list_bytes()
        return result
    finally:
        setup.stop()


def run(quick: bool, workdir: Path, sizes: list[int] | None = None) -> dict[str, Any]:
    """Every size, then the ratios a handover is judged by."""
    sizes = sizes or ([2_000] if quick else [10_000, 100_000])
    workdir.mkdir(parents=True, exist_ok=True)
    rows = [measure(workdir, n, 120 if quick else 900) for n in sizes]
    return {
        "setup": "bench.upstream_server (no bookmarks, quorum reads) -> counting relay -> rangeshard proxy (pods)"
        " -> 1 then 2 managers, one external entry each: a list-then-watch pod informer by uid",
        "rows": rows,
        "ratios": [
            {
                "objects": r["objects"],
                "joinUpstreamBytesOverOneList": round(
                    r["join"]["upstreamBytes"] / max(r["oneUpstreamListBytes"], 1), 4
                ),
                "joinObjectsOverRestartObjects": round(
                    r["join"]["objectsToControllers"] / max(r["restart"]["objectsToControllers"], 1), 2
                ),
            }
            for r in rows
        ],
    }
