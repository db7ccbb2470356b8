"""Options shared by several commands (etcd endpoints, TLS, credentials, registry prefix).

Purpose
    Declare each shared option once so every command spells it the same way,
    and turn them into an :class:`~rangeshard.core.etcd.EtcdConfig` (without
    ``--etcd``/``RANGESHARD_ETCD``: the etcd a ``rangeshard up`` recorded in
    ``--state-dir``, else ``http://127.0.0.1:2379``); the
    errors and stop signal several commands share (:func:`fail`,
    :func:`unknown_type`, :func:`stop_on_signals`).

Invariants
    The etcd password is read from an option or ``RANGESHARD_ETCD_PASSWORD`` and
    never printed.

Concurrency model
    Pure helpers, called on the main thread (``stop_on_signals`` installs the
    SIGINT/SIGTERM handlers, which only the main thread may do).
"""

from __future__ import annotations

import functools
import inspect
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from rangeshard.cli.statefile import etcd_from_state
from rangeshard.core import help_format, logs
from rangeshard.core.errors import ConfigError, PlanError, PortInUseError, RangeshardError, RegistryUnavailable
from rangeshard.core.etcd import EtcdConfig
from rangeshard.core.options import CaCertOpt, CertOpt, KeyOpt, PasswordOpt, UserOpt, config_from_options
from registry import DEFAULT_PREFIX, Snapshot

help_format.install()


EtcdOpt = Annotated[
    str | None,
    typer.Option(
        "--etcd",
        envvar="RANGESHARD_ETCD",
        help="etcd endpoints, URL[,URL...] (default: the etcd of a rangeshard up in --state-dir, "
        "else http://127.0.0.1:2379).",
        show_default=False,
    ),
]
PrefixOpt = Annotated[str, typer.Option("--prefix", help="Registry key prefix in etcd.")]
StateDirOpt = Annotated[
    Path,
    typer.Option(
        "--state-dir",
        envvar="RANGESHARD_STATE_DIR",
        help="Where etcd data, logs and the kubeconfig live; what rangeshard up recorded there (etcd, proxy) "
        "is the default of --etcd and --proxy.",
    ),
]
DEFAULT_STATE_DIR = Path(".rangeshard")
ProxyOpt = Annotated[
    str | None,
    typer.Option(
        "--proxy",
        envvar="RANGESHARD_PROXY",
        help="Range filter proxy (started with --etcd) whose /metrics give each instance's progress; default: "
        "the proxy of a rangeshard up in --state-dir, else the one the instances publish in their records.",
        show_default=False,
    ),
]
ProxyTokenFileOpt = Annotated[
    str | None,
    typer.Option(
        "--token-file",
        help="Bearer token for a secured proxy's /metrics (--auth-mode delegate/static), e.g. a ServiceAccount "
        "token; re-read on every request.",
        show_default=False,
    ),
]
KubeconfigOpt = Annotated[
    str | None,
    typer.Option(
        "--kubeconfig",
        help="Credentials for a secured proxy as kubectl reads them: the current context's user (token, "
        "token file, exec plugin, client certificate). The proxy's address is --proxy.",
        show_default=False,
    ),
]


def configure_logging(level: str) -> None:
    """Install the one stderr handler (:func:`rangeshard.core.logs.configure_logging`); exit 2 on a bad level."""
    try:
        logs.configure_logging(level)
    except ConfigError as e:
        fail(e)


def fail(error: RangeshardError) -> NoReturn:
    """Print an expected error and exit: 2 for bad input, 1 for runtime failures."""
    if isinstance(error, ConfigError | PortInUseError):
        for problem in error.problems:
            typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2 if isinstance(error, ConfigError) else 1)
    if isinstance(error, PlanError):
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2)
    if isinstance(error, RegistryUnavailable):
        typer.echo(f"error: {error} (is etcd running? set --etcd or RANGESHARD_ETCD)", err=True)
        raise typer.Exit(1)
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(1)


def stop_on_signals() -> threading.Event:
    """An event that SIGTERM and SIGINT set (a long-running command's main loop waits on it)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def unknown_type(controller_type: str, snapshots: Mapping[str, Snapshot]) -> ConfigError:
    """``--type`` names a type without registered instances (exit 2); the message lists the known ones."""
    known = ", ".join(sorted(t for t, s in snapshots.items() if s.members)) or "none"
    return ConfigError(f"--type: no instance of controller type {controller_type!r} is registered (known: {known})")


@dataclass(frozen=True)
class EtcdOptions:
    """The shared etcd options of one command invocation (the password is never printed)."""

    etcd: str | None
    prefix: str
    cacert: str | None
    cert: str | None
    key: str | None
    user: str | None
    password: str | None = field(repr=False)
    state_dir: Path = DEFAULT_STATE_DIR

    def config(self) -> EtcdConfig:
        """The etcd of ``--etcd``; without it the one ``up`` recorded in ``--state-dir`` (else the default)."""
        etcd = self.etcd
        if etcd is None:
            etcd = etcd_from_state(self.state_dir)
        return config_from_options(etcd, self.cacert, self.cert, self.key, self.user, self.password)


# (parameter name, annotation, default, EtcdOptions field)
_ETCD_PARAMS: list[tuple[str, Any, Any, str]] = [
    ("etcd", EtcdOpt, None, "etcd"),
    ("prefix", PrefixOpt, DEFAULT_PREFIX, "prefix"),
    ("etcd_cacert", CaCertOpt, None, "cacert"),
    ("etcd_cert", CertOpt, None, "cert"),
    ("etcd_key", KeyOpt, None, "key"),
    ("etcd_user", UserOpt, None, "user"),
    ("etcd_password", PasswordOpt, None, "password"),
    ("state_dir", StateDirOpt, DEFAULT_STATE_DIR, "state_dir"),
]


def with_etcd_options(fn: Callable[..., None]) -> Callable[..., None]:
    """Give a Typer command the shared etcd options, passed to it as ``etcd_options: EtcdOptions``.

    The options are declared once here instead of in every command: the
    wrapper's signature is the command's own parameters (minus
    ``etcd_options``) followed by ``--etcd``, ``--prefix``, the TLS/auth
    options and ``--state-dir``, which Typer reads like any other. A
    :class:`RangeshardError` the command raises is printed and exits
    (:func:`fail`): the commands translate no error themselves.
    """
    sig = inspect.signature(fn, eval_str=True)
    own = [p for p in sig.parameters.values() if p.name != "etcd_options"]
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=ann, default=default)
        for name, ann, default, _ in _ETCD_PARAMS
    ]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        values = {field_name: kwargs.pop(name) for name, _, _, field_name in _ETCD_PARAMS}
        try:
            fn(*args, etcd_options=EtcdOptions(**values), **kwargs)
        except RangeshardError as e:
            fail(e)

    wrapper.__signature__ = sig.replace(parameters=own + extra)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in own + extra} | {"return": sig.return_annotation}
    return wrapper
