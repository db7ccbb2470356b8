"""Shared pieces of the benchmarks: a local cluster, a byte-counting relay, metrics and CPU readers.

Purpose
    :class:`BenchCluster` is the :class:`~rangeshard.localcluster.LocalCluster`
    of the benchmarks: etcd, the local API server and the range filter proxy
    as child processes on loopback (the proxy reaches the API server through
    a :class:`CountingRelay`, so the bytes the upstream sends to the proxy are
    measured, not estimated), all stopped, in reverse order, whatever happens;
    the sections add their managers to it. Helpers read Prometheus text metrics,
    per-process CPU seconds from ``/proc/<pid>/stat`` (no psutil needed),
    percentiles, and build ~1 KiB pod objects.

Invariants
    * Everything listens on 127.0.0.1 only; every child is stopped in a
      ``finally`` (SIGTERM, then SIGKILL after a grace period).
    * Every wait is bounded by a deadline; nothing polls forever.
    * The relay counts bytes in both directions per listener; counters only grow.
      Each relay pump lives exactly as long as its connection (either side
      closing ends it) and :meth:`CountingRelay.close` cancels all of them.

Concurrency model
    The relay runs its own asyncio loop on one daemon thread
    (``bench-relay``); its counters are plain ints written by that thread and
    read (atomically under the GIL) by the caller. Everything else is
    synchronous and owned by the calling thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

from controller_manager.process import ManagerProcess, ManagerProcessError
from local_apiserver.process import LocalApiServerProcess
from rangeshard.core.process import ReadyCheck, wait_ready
from rangeshard.localcluster import LocalCluster
from registry import Registry, State

log = logging.getLogger(__name__)

T = TypeVar("T")

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of one process (``/proc/<pid>/stat`` fields 14 and 15); 0.0 if gone."""
    if pid is None:
        return 0.0
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # The command name (field 2) may contain spaces; it is wrapped in parentheses.
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[idx]


_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` in Prometheus text; 0.0 if none."""
    total = 0.0
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if m is None or m.group(1) != name:
            continue
        label_text = m.group(2) or ""
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(m.group(3))
    return total


def scrape(url: str, timeout: float = 5.0) -> str:
    """GET ``url`` (a ``/metrics`` endpoint) and return its text."""
    resp = httpx.get(url, timeout=timeout)
    resp.raise_for_status()
    return resp.text


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.02) -> T:
    """Poll ``predicate`` until it is truthy; ``TimeoutError`` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what} (last: {value!r})")
        time.sleep(interval)


def settled(registry: Registry, controller_type: str, n: int) -> tuple[bool, str]:
    """Whether ``n`` instances of ``controller_type`` are registered, all active and unlocked; the states seen."""
    snap = registry.snapshot(controller_type)
    ready = len(snap) == n and all(m.record.state is State.ACTIVE and not m.record.is_locked for m in snap)
    return ready, str({m.instance_id: m.record.state.value for m in snap})


def wait_managers(check: ReadyCheck, managers: Sequence[ManagerProcess], timeout: float, what: str) -> None:
    """:func:`~rangeshard.core.process.wait_ready` while the live ``managers`` run (polled every 50 ms).

    One that exits raises :class:`ManagerProcessError` at once (with its log tail); the timeout ``TimeoutError``.
    """
    live = [m for m in managers if m.alive]
    wait_ready(
        check, timeout, what=what, error=ManagerProcessError, children=live, timeout_error=TimeoutError, interval=0.05
    )


PAD_TARGET = 1024


def make_pod(name: str, namespace: str, *, uid: str | None = None, owner_uid: str | None = None) -> dict[str, Any]:
    """A realistic pod of about 1 KiB of JSON (labels, annotations, one container with env and resources)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {"app": "bench", "tier": "backend", "pod-template-hash": "5d8f7c9b6"},
        "annotations": {"bench.rangeshard.io/note": "x" * 200},
    }
    if uid is not None:
        meta["uid"] = uid
    if owner_uid is not None:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "bench-rs", "uid": owner_uid, "controller": True}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example.com/bench/app:1.2.3",
                    "args": ["--port=8080", "--log-level=info"],
                    "env": [{"name": f"ENV_{i}", "value": f"value-{i}"} for i in range(6)],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                }
            ],
            "restartPolicy": "Always",
            "nodeName": "node-1",
        },
    }


def _managed(
    manager: str, operation: str, time_: str, fields: dict[str, Any], sub: str | None = None
) -> dict[str, Any]:
    entry = {
        "manager": manager,
        "operation": operation,
        "apiVersion": "v1",
        "time": time_,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }
    if sub:
        entry["subresource"] = sub
    return entry


def real_pod(name: str, namespace: str, rv: int) -> dict[str, Any]:
    """A pod as a real kube-apiserver stores a Deployment's pod: ~5 KiB of JSON.

    What :func:`stored_pod` leaves out: ``managedFields`` (kube-controller-manager's
    create, the kubelet's status updates), a full ``status`` (conditions, container
    statuses, IPs, QoS), five labels, three annotations, an owner reference, the
    service-account volume and the tolerations the admission plugins add.
    """
    uid = str(uuid.uuid4())
    ts = "2026-01-01T00:00:00Z"
    labels = {
        "app.kubernetes.io/name": "shop",
        "app.kubernetes.io/instance": "shop-prod",
        "app.kubernetes.io/component": "backend",
        "pod-template-hash": "5d8f7c9b6",
        "team": "payments",
    }
    annotations = {
        "kubectl.kubernetes.io/restartedAt": ts,
        "prometheus.io/scrape": "true",
        "checksum/config": "4f8b2c1e9a7d6b5c3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d",
    }
    fields_create = {
        "f:metadata": {
            "f:generateName": {},
            "f:labels": {".": {}, **{f"f:{k}": {} for k in labels}},
            "f:annotations": {".": {}, **{f"f:{k}": {} for k in annotations}},
            "f:ownerReferences": {".": {}, 'k:{"uid":"' + uid + '"}': {}},
        },
        "f:spec": {
            "f:containers": {
                'k:{"name":"app"}': {
                    ".": {},
                    "f:args": {},
                    "f:env": {
                        ".": {},
                        **{f'k:{{"name":"ENV_{i}"}}': {".": {}, "f:name": {}, "f:value": {}} for i in range(6)},
                    },
                    "f:image": {},
                    "f:imagePullPolicy": {},
                    "f:name": {},
                    "f:ports": {".": {}, 'k:{"containerPort":8080,"protocol":"TCP"}': {".": {}, "f:containerPort": {}}},
                    "f:resources": {
                        ".": {},
                        "f:limits": {".": {}, "f:memory": {}},
                        "f:requests": {".": {}, "f:cpu": {}},
                    },
                    "f:terminationMessagePath": {},
                    "f:terminationMessagePolicy": {},
                }
            },
            "f:dnsPolicy": {},
            "f:enableServiceLinks": {},
            "f:restartPolicy": {},
            "f:schedulerName": {},
            "f:securityContext": {},
            "f:terminationGracePeriodSeconds": {},
        },
    }
    fields_status: dict[str, Any] = {
        "f:status": {
            "f:conditions": {
                f'k:{{"type":"{t}"}}': {
                    ".": {},
                    "f:lastProbeTime": {},
                    "f:lastTransitionTime": {},
                    "f:status": {},
                    "f:type": {},
                }
                for t in ("ContainersReady", "Initialized", "PodReadyToStartContainers", "Ready")
            },
            "f:containerStatuses": {},
            "f:hostIP": {},
            "f:hostIPs": {},
            "f:phase": {},
            "f:podIP": {},
            "f:podIPs": {".": {}, 'k:{"ip":"10.244.1.17"}': {".": {}, "f:ip": {}}},
            "f:startTime": {},
        }
    }
    pod = make_pod(name, namespace, uid=uid, owner_uid=str(uuid.uuid4()))
    meta = pod["metadata"]
    meta |= {
        "generateName": "shop-prod-5d8f7c9b6-",
        "labels": labels,
        "annotations": annotations,
        "resourceVersion": str(rv),
        "creationTimestamp": ts,
        "managedFields": [
            _managed("kube-controller-manager", "Update", ts, fields_create),
            _managed("kubelet", "Update", ts, fields_status, "status"),
        ],
    }
    spec = pod["spec"]
    spec["containers"][0] |= {
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "volumeMounts": [
            {
                "name": "kube-api-access-x7k2p",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            }
        ],
    }
    spec |= {
        "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
        ]}}],
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "terminationGracePeriodSeconds": 30,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "tolerations": [
            {"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            for k in ("not-ready", "unreachable")
        ],
    }  # fmt: skip
    cond = {"status": "True", "lastProbeTime": None, "lastTransitionTime": ts}
    pod["status"] = {
        "phase": "Running",
        "conditions": [
            {"type": t, **cond}
            for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "hostIP": "10.0.3.41",
        "hostIPs": [{"ip": "10.0.3.41"}],
        "podIP": "10.244.1.17",
        "podIPs": [{"ip": "10.244.1.17"}],
        "startTime": ts,
        "containerStatuses": [
            {
                "name": "app",
                "state": {"running": {"startedAt": ts}},
                "lastState": {},
                "ready": True,
                "restartCount": 0,
                "image": "registry.example.com/bench/app:1.2.3",
                "imageID": "registry.example.com/bench/app@sha256:" + "ab12" * 16,
                "containerID": "containerd://" + "9f8e" * 16,
                "started": True,
            }
        ],
        "qosClass": "Burstable",
    }  # fmt: skip
    return pod


def stored_pod(name: str, namespace: str, rv: int, *, owner_uid: str | None = None) -> dict[str, Any]:
    """A pod as an API server returns it (uid, resourceVersion, creationTimestamp, status): ~1.2 KiB of JSON."""
    pod = make_pod(name, namespace, uid=str(uuid.uuid4()), owner_uid=owner_uid)
    pod["metadata"]["resourceVersion"] = str(rv)
    pod["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    pod["status"] = {"phase": "Running", "podIP": "10.0.0.1", "startTime": "2026-01-01T00:00:01Z"}
    return pod


class CountingRelay:
    """Loopback TCP relays that count the bytes each listener forwarded in each direction.

    ``add(target_port)`` opens a listener forwarding to ``127.0.0.1:target_port``
    and returns its index; ``down[i]`` is the bytes the target sent to clients,
    ``up[i]`` the bytes clients sent to the target.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.down: list[int] = []
        self.up: list[int] = []
        self.ports: list[int] = []
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self.loop.run_forever, name="bench-relay", daemon=True)
        self._thread.start()

    def add(self, target_port: int) -> int:
        """Start a listener forwarding to ``target_port``; return its index."""
        idx = len(self.ports)
        self.down.append(0)
        self.up.append(0)
        fut = asyncio.run_coroutine_threadsafe(self._listen(idx, target_port), self.loop)
        self.ports.append(fut.result(10))
        return idx

    def url(self, idx: int) -> str:
        return f"http://127.0.0.1:{self.ports[idx]}"

    async def _listen(self, idx: int, target_port: int) -> int:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            if task is not None:
                self._tasks.add(task)
            try:
                up_r, up_w = await asyncio.open_connection("127.0.0.1", target_port)
            except OSError:
                writer.close()
                return
            try:
                await asyncio.gather(self._pump(reader, up_w, idx, False), self._pump(up_r, writer, idx, True))
            finally:
                for w in (writer, up_w):
                    w.close()
                if task is not None:
                    self._tasks.discard(task)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, idx: int, down: bool) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if down:
                    self.down[idx] += len(data)
                else:
                    self.up[idx] += len(data)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                writer.write_eof()

    def close(self) -> None:
        """Close every listener and connection and stop the loop thread (idempotent)."""
        if not self.loop.is_running():
            return

        async def shutdown() -> None:
            for s in self._servers:
                s.close()
            for t in list(self._tasks):
                t.cancel()
            await asyncio.sleep(0)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


class BenchCluster(LocalCluster):
    """etcd + local API server + proxy (through a counting relay), as child processes (see module docstring)."""

    def __init__(self, workdir: Path | None = None, *, proxy_resources: Sequence[str] = ("pods",)) -> None:
        self._own_dir = workdir is None
        super().__init__(
            workdir or Path(tempfile.mkdtemp(prefix="rangeshard-bench-")),
            etcd_fast=True,
            storage_prefix="/bench",
            bookmark_interval=1.0,
            proxy_resources=proxy_resources,
            proxy_args=["--log-level", "warning"],
            proxy_upstream=self._relay_to,
        )
        self.relay: CountingRelay | None = None
        self.proxy_relay = -1
        self.direct_relay = -1

    def _relay_to(self, apiserver: LocalApiServerProcess) -> str:
        """The proxy's upstream: a relay counting the bytes (and another one for direct clients)."""
        self.relay = CountingRelay()
        self.proxy_relay = self.relay.add(apiserver.port)
        self.direct_relay = self.relay.add(apiserver.port)
        return self.relay.url(self.proxy_relay)

    @property
    def proxy_pid(self) -> int | None:
        return self.proxy.pid if self.proxy is not None else None

    def stop(self, on_error: Callable[[str, Exception], None] | None = None) -> None:
        """Stop every process this cluster started (reverse order; idempotent), then the relay."""
        super().stop(on_error)
        if self.relay is not None:
            self.relay.close()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
