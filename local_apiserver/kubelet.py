"""A simulated node (scheduler + kubelet) for the local API server: pods get bound, Running, Ready, and stop.

Purpose
    With ``--simulate-node NAME`` the local API server registers a Node
    ``NAME`` and plays the parts a real cluster's scheduler and kubelet play
    for pods, so status counts (ready/available replicas, rollouts) are real:

    * a pod without ``spec.nodeName`` (and the default scheduler) is bound to
      the node: ``spec.nodeName``, condition ``PodScheduled``; event
      ``Scheduled``;
    * a pod bound to the node is started: ``phase: Running``, ``podIP``,
      ``hostIP``, ``startTime``, one ``containerStatuses`` entry per container
      (``started``, ``restartCount: 0``, ``state.running``); it becomes
      ``Ready``/``ContainersReady`` at once, or when the longest
      ``readinessProbe.initialDelaySeconds`` has passed; events ``Pulled``,
      ``Created``, ``Started``;
    * a pod whose ``restartPolicy`` is ``Never`` or ``OnFailure`` (a Job's
      pod) runs for ``run_seconds`` (1 s), then its containers exit 0:
      ``phase: Succeeded``, every ``containerStatuses`` entry
      ``state.terminated`` (``exitCode: 0``, ``reason: Completed``), not
      ready, conditions ``Ready``/``ContainersReady`` ``False`` with reason
      ``PodCompleted``; ``Always`` pods (the default) stay Running;
    * a pod being deleted gracefully (``deletionTimestamp`` set by a delete,
      see :meth:`local_apiserver.store.Store.delete`) has its containers
      stopped (not ready; event ``Killing``); a simulated container exits
      ``stop_seconds`` after SIGTERM (1 s), or at the end of the grace period
      if that comes first; then the node removes the pod (a delete with grace
      period 0), as a kubelet does.

Invariants
    * Every write is a guarded read-modify-write (``Store.guaranteed_update``)
      that re-checks the pod's state, so a replayed or stale watch event never
      undoes a newer change; removals carry the pod's uid as precondition.
    * Only pods bound to this node (or unbound ones) are touched.
    * A finished pod (``Succeeded``) is never started again.
    * Events are best effort: a failed event write never stops the node.

Concurrency model
    One daemon thread (``simulated-node``) lists the pods, then follows an
    etcd watch of the pods prefix (on its own etcd client; the watch callback
    only enqueues) and keeps a heap of timers (readiness, container exit).
    After a watch error it relists, after a :class:`~rangeshard.core.backoff.Backoff`
    (1 s doubling to 10 s; 1 s again after 10 s of following). Storage calls are synchronous.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from local_apiserver.errors import ApiError, tolerating
from local_apiserver.resources import core_spec
from local_apiserver.store import Obj, Store
from rangeshard.core.backoff import Backoff
from rangeshard.core.errors import RangeshardError, RegistryError
from rangeshard.core.etcd import EtcdClient, EtcdConfig, WatchBatch
from rangeshard.core.events import event_body
from rangeshard.core.loops import join_thread, start_thread
from rangeshard.core.timestamps import format_time, parse_time

log = logging.getLogger(__name__)

NODE_IP = "10.0.0.1"
KUBELET_VERSION = "v1.32.0"
DEFAULT_STOP_SECONDS = 1.0
#: How long a pod with ``restartPolicy`` Never/OnFailure runs before its containers exit 0.
DEFAULT_RUN_SECONDS = 1.0
#: Restart policies whose pods run to completion (Job pods).
RUN_TO_COMPLETION = ("Never", "OnFailure")


def pod_ip(uid: str) -> str:
    """A stable address in 10.244.0.0/16 for a pod uid."""
    n = int.from_bytes(hashlib.sha256(uid.encode()).digest()[:2], "big") % (254 * 254)
    return f"10.244.{n // 254 + 1}.{n % 254 + 1}"


def _condition(kind: str, status: bool, now: str, reason: str | None = None) -> Obj:
    cond: Obj = {"type": kind, "status": str(status), "lastProbeTime": None, "lastTransitionTime": now}
    if reason:
        cond["reason"] = reason
    return cond


def _set_condition(status: Obj, kind: str, value: bool, now: str, reason: str | None = None) -> None:
    status["conditions"] = conds = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    for c in conds:
        if c.get("type") == kind:
            if c.get("status") != str(value):
                c.update(_condition(kind, value, now, reason))
            return
    conds.append(_condition(kind, value, now, reason))


def _is_ready(status: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _parse_time(value: Any) -> float | None:
    parsed = parse_time(value)
    return parsed.timestamp() if parsed is not None else None


def readiness_delay(pod: Obj) -> float:
    """Seconds after start before the pod is Ready: the longest readinessProbe.initialDelaySeconds."""
    delays = [0.0]
    for c in (pod.get("spec") or {}).get("containers") or []:
        probe = c.get("readinessProbe") if isinstance(c, dict) else None
        if isinstance(probe, dict):
            try:
                delays.append(float(probe.get("initialDelaySeconds") or 0))
            except (TypeError, ValueError):
                continue
    return max(delays)


def runs_to_completion(pod: Obj) -> bool:
    """Whether ``pod`` runs to completion on the simulated node (``restartPolicy`` Never or OnFailure)."""
    return (pod.get("spec") or {}).get("restartPolicy", "Always") in RUN_TO_COMPLETION


def _container_id(uid: str, name: str) -> str:
    return "containerd://" + hashlib.sha256(f"{uid}/{name}".encode()).hexdigest()


def _image_id(image: str) -> str:
    return f"{image.split('@', maxsplit=1)[0]}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def _completed(started: Any, finished: str, **extra: Any) -> Obj:
    """A container's ``state`` once it exited 0."""
    return {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": finished, **extra}}


def container_statuses(pod: Obj, ready: bool, now: str, running: bool = True) -> list[Obj]:
    uid = str((pod.get("metadata") or {}).get("uid", ""))
    out = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        if not isinstance(c, dict):
            continue
        name, image = str(c.get("name", "")), str(c.get("image", ""))
        state = {"running": {"startedAt": now}} if running else _completed(now, now)
        out.append(
            {
                "name": name,
                "image": image,
                "imageID": _image_id(image),
                "containerID": _container_id(uid, name),
                "ready": ready and running,
                "started": running,
                "restartCount": 0,
                "state": state,
                "lastState": {},
            }
        )
    return out


class SimulatedNode:
    """The node ``name``: binds, starts and stops pods (see module docstring)."""

    def __init__(
        self,
        store: Store,
        etcd: EtcdConfig,
        name: str,
        *,
        stop_seconds: float = DEFAULT_STOP_SECONDS,
        run_seconds: float = DEFAULT_RUN_SECONDS,
    ) -> None:
        self.store = store
        self.etcd = etcd
        self.name = name
        self.stop_seconds = stop_seconds
        self.run_seconds = run_seconds
        self.pods = core_spec("pods")
        self.events = core_spec("events")
        self.nodes = core_spec("nodes")
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._timers: list[tuple[float, int, str, str, str, str]] = []
        self._seq = itertools.count()
        self._pending: set[tuple[str, str]] = set()  # (uid, action) with a timer
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> None:
        self._thread = start_thread("simulated-node", self._run, what="simulated node")

    def stop(self) -> None:
        self._stop.set()
        self._queue.put(("stop", None))
        join_thread(self._thread, 10)

    def _run(self) -> None:
        backoff = Backoff(1.0, 10.0, jitter=0.2, reset_after=10.0)
        while not self._stop.is_set():
            try:
                self._ensure_node()
                backoff.succeeded()
                self._follow()
            except (ApiError, RangeshardError) as e:
                log.warning("simulated node %s: %s; retrying", self.name, e)
            except Exception:
                log.exception("simulated node %s: unexpected error; retrying", self.name)
            self._stop.wait(backoff.next_delay())

    # -- the node object -----------------------------------------------------
    def _node_status(self) -> Obj:
        now = format_time()
        capacity = {"cpu": str(os.cpu_count() or 2), "memory": "8Gi", "pods": "110", "ephemeral-storage": "50Gi"}
        conds = [
            {"type": t, "status": s, "reason": r, "message": m, "lastHeartbeatTime": now, "lastTransitionTime": now}
            for t, s, r, m in (
                ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                ("Ready", "True", "KubeletReady", "simulated kubelet is ready"),
            )
        ]
        return {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": conds,
            "addresses": [{"type": "InternalIP", "address": NODE_IP}, {"type": "Hostname", "address": self.name}],
            "nodeInfo": {
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "containerRuntimeVersion": "simulated://1.0",
                "osImage": "rangeshard simulated node",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "kernelVersion": os.uname().release,
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }

    def _ensure_node(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "node.kubernetes.io/instance-type": "simulated",
                },
            },
            "spec": {},
        }
        with tolerating(409):
            self.store.create(self.nodes, None, body)
        status = self._node_status()

        def mutate(node: Obj) -> Obj:
            node["status"] = status
            return node

        self.store.guaranteed_update(self.nodes, None, self.name, mutate)

    # -- the pod loop --------------------------------------------------------
    def _follow(self) -> None:
        prefix = self.store.resource_prefix(self.pods)
        revision, kvs = self.store.client.get_prefix(prefix)
        for kv in kvs:
            self._handle(self.store.decode(self.pods, kv))
        watcher = EtcdClient(self.etcd)
        try:
            watch = watcher.watch_prefix(prefix, self._on_watch, start_revision=revision + 1)
            try:
                self._loop()
            finally:
                watch.cancel()
        finally:
            watcher.close()

    def _on_watch(self, response: WatchBatch | RegistryError) -> None:
        """Runs on the etcd client's watch thread: only enqueue."""
        if isinstance(response, RegistryError):
            self._queue.put(("error", response))
            return
        for ev in response.events:
            self._queue.put(("deleted", ev.kv.key) if ev.deleted else ("put", ev.kv))

    def _loop(self) -> None:
        while not self._stop.is_set():
            timeout = 1.0
            if self._timers:
                timeout = max(0.0, min(timeout, self._timers[0][0] - time.monotonic()))
            try:
                kind, item = self._queue.get(timeout=timeout)
            except queue.Empty:
                kind, item = "tick", None
            if kind == "stop":
                return
            if kind == "error":
                raise ApiError(503, "ServiceUnavailable", f"pod watch ended: {item}")
            if kind == "put":
                self._handle(self.store.decode(self.pods, item))
            self._fire_timers()

    def _fire_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, action, ns, name, uid = heapq.heappop(self._timers)
            self._pending.discard((uid, action))
            with tolerating(404, 409):
                if action == "ready":
                    self._mark_ready(ns, name, uid)
                elif action == "complete":
                    self._complete(ns, name, uid)
                elif action == "remove":
                    self._remove(ns, name, uid)

    def _after(self, delay: float, action: str, pod: Obj) -> None:
        meta = pod["metadata"]
        entry = (time.monotonic() + delay, next(self._seq), action, meta["namespace"], meta["name"], meta["uid"])
        heapq.heappush(self._timers, entry)
        self._pending.add((meta["uid"], action))

    # -- one pod ---------------------------------------------------------------
    def _handle(self, pod: Obj) -> None:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        try:
            if meta.get("deletionTimestamp"):
                if node == self.name and (meta.get("uid"), "remove") not in self._pending:
                    self._kill(pod)
                return
            if not node:
                if spec.get("schedulerName", "default-scheduler") == "default-scheduler":
                    self._bind(pod)
                return
            if node != self.name:
                return
            phase = (pod.get("status") or {}).get("phase")
            status = pod.get("status") or {}
            if phase in (None, "", "Pending") and not status.get("startTime"):
                self._start(pod)
            elif phase == "Running" and not _is_ready(status) and (meta.get("uid"), "ready") not in self._pending:
                # Started before a restart of this server: the readiness timer is gone.
                started = _parse_time(status.get("startTime"))
                left = readiness_delay(pod) - (time.time() - started) if started is not None else 0.0
                self._after(max(left, 0.0), "ready", pod)
            if phase == "Running" and runs_to_completion(pod) and (meta.get("uid"), "complete") not in self._pending:
                started = _parse_time(status.get("startTime"))
                left = self.run_seconds - (time.time() - started) if started is not None else 0.0
                self._after(max(left, 0.0), "complete", pod)
        except ApiError as e:
            if e.code not in (404, 409):
                raise

    def _update(self, pod: Obj, mutate: Callable[[Obj], Obj | None]) -> Obj | None:
        """Guarded update of ``pod`` (same uid); ``None`` when ``mutate`` found nothing to do."""
        meta = pod["metadata"]
        uid = meta["uid"]
        changed: list[Obj] = []

        def guarded(current: Obj) -> Obj:
            if current["metadata"].get("uid") != uid:
                return current
            result = mutate(current)
            if result is None:
                return current
            changed.append(result)
            return result

        self.store.guaranteed_update(self.pods, meta["namespace"], meta["name"], guarded)
        return changed[-1] if changed else None

    def _bind(self, pod: Obj) -> None:
        def mutate(current: Obj) -> Obj | None:
            if current["metadata"].get("deletionTimestamp") or (current.get("spec") or {}).get("nodeName"):
                return None
            current.setdefault("spec", {})["nodeName"] = self.name
            status = current.setdefault("status", {})
            status.setdefault("phase", "Pending")
            _set_condition(status, "PodScheduled", True, format_time())
            return current

        bound = self._update(pod, mutate)
        if bound is not None:
            meta = bound["metadata"]
            self._event(
                bound, "Scheduled", f"Successfully assigned {meta['namespace']}/{meta['name']} to {self.name}", None
            )

    def _start(self, pod: Obj) -> None:
        delay = readiness_delay(pod)
        ready = delay <= 0

        def mutate(current: Obj) -> Obj | None:
            status = current.get("status") or {}
            if current["metadata"].get("deletionTimestamp") or status.get("startTime"):
                return None
            if (current.get("spec") or {}).get("nodeName") != self.name:
                return None
            now = format_time()
            uid = str(current["metadata"]["uid"])
            status["phase"] = "Running"
            status["hostIP"] = NODE_IP
            status["hostIPs"] = [{"ip": NODE_IP}]
            status["podIP"] = pod_ip(uid)
            status["podIPs"] = [{"ip": status["podIP"]}]
            status["startTime"] = now
            status.setdefault("qosClass", "BestEffort")
            for kind in ("PodReadyToStartContainers", "Initialized", "PodScheduled"):
                _set_condition(status, kind, True, now)
            _set_condition(status, "ContainersReady", ready, now, None if ready else "ContainersNotReady")
            _set_condition(status, "Ready", ready, now, None if ready else "ContainersNotReady")
            init = (current.get("spec") or {}).get("initContainers") or []
            if init:
                status["initContainerStatuses"] = container_statuses(
                    {"metadata": current["metadata"], "spec": {"containers": init}}, False, now, running=False
                )
            status["containerStatuses"] = container_statuses(current, ready, now)
            current["status"] = status
            return current

        started = self._update(pod, mutate)
        if started is None:
            return
        for c in (started.get("spec") or {}).get("containers") or []:
            name, image = c.get("name"), c.get("image")
            path = f"spec.containers{{{name}}}"
            self._event(started, "Pulled", f'Container image "{image}" already present on machine', path)
            self._event(started, "Created", f"Created container {name}", path)
            self._event(started, "Started", f"Started container {name}", path)
        if not ready:
            self._after(delay, "ready", started)
        if runs_to_completion(started):
            self._after(self.run_seconds, "complete", started)

    def _mark_ready(self, ns: str, name: str, uid: str) -> None:
        def ready(status: Obj, now: str) -> None:
            _set_condition(status, "ContainersReady", True, now)
            _set_condition(status, "Ready", True, now)
            for c in status.get("containerStatuses") or []:
                c["ready"] = True

        self._update_running(ns, name, uid, ready)

    def _update_running(self, ns: str, name: str, uid: str, change: Callable[[Obj, str], None]) -> None:
        """``change(status, now)`` of the pod ``uid`` while it is Running and not being deleted."""

        def mutate(current: Obj) -> Obj:
            meta = current["metadata"]
            status = current.get("status") or {}
            if meta.get("uid") != uid or meta.get("deletionTimestamp") or status.get("phase") != "Running":
                return current
            change(status, format_time())
            current["status"] = status
            return current

        self.store.guaranteed_update(self.pods, ns, name, mutate)

    def _complete(self, ns: str, name: str, uid: str) -> None:
        """The containers of a run-to-completion pod exit 0: ``Succeeded`` (what a kubelet reports)."""

        def completed(status: Obj, now: str) -> None:
            status["phase"] = "Succeeded"
            _set_condition(status, "PodReadyToStartContainers", False, now)
            for kind in ("ContainersReady", "Ready"):
                _set_condition(status, kind, False, now, "PodCompleted")
            for c in status.get("containerStatuses") or []:
                started = ((c.get("state") or {}).get("running") or {}).get("startedAt") or status.get("startTime")
                c["ready"] = False
                c["started"] = False
                c["state"] = _completed(started, now, containerID=c.get("containerID"))

        self._update_running(ns, name, uid, completed)

    def _kill(self, pod: Obj) -> None:
        meta = pod["metadata"]
        grace = float(meta.get("deletionGracePeriodSeconds") or 0)

        def mutate(current: Obj) -> Obj | None:
            status = current.get("status") or {}
            if not status.get("containerStatuses"):
                return None
            now = format_time()
            _set_condition(status, "ContainersReady", False, now, "ContainersNotReady")
            _set_condition(status, "Ready", False, now, "ContainersNotReady")
            for c in status.get("containerStatuses") or []:
                c["ready"] = False
            current["status"] = status
            return current

        stopped = self._update(pod, mutate) or pod
        for c in (pod.get("spec") or {}).get("containers") or []:
            self._event(
                stopped, "Killing", f"Stopping container {c.get('name')}", f"spec.containers{{{c.get('name')}}}"
            )
        self._after(min(grace, self.stop_seconds), "remove", pod)

    def _remove(self, ns: str, name: str, uid: str) -> None:
        self.store.delete(self.pods, ns, name, precondition_uid=uid, grace_period_seconds=0)

    def _event(self, pod: Obj, reason: str, message: str, field_path: str | None) -> None:
        scheduler = reason == "Scheduled"
        body = event_body(
            pod,
            reason,
            message,
            component="default-scheduler" if scheduler else "kubelet",
            host=None if scheduler else self.name,
            field_path=field_path,
        )
        try:
            self.store.create(self.events, pod["metadata"]["namespace"], body)
        except ApiError as e:
            log.debug("event %s for pod %s not recorded: %s", reason, pod["metadata"].get("name"), e)
