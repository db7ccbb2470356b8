"""Options shared by several commands (etcd endpoints, TLS, credentials, registry prefix).

Purpose
    Declare each shared option once so every command spells it the same way,
    and turn them into an :class:`~registry.etcd.EtcdConfig`.

Invariants
    The etcd password is read from an option or ``RANGESHARD_ETCD_PASSWORD`` and
    never printed.

Concurrency model
    Pure helpers, called on the main thread.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated, NoReturn

import typer

from rangeshard.errors import ConfigError, RangeshardError, RegistryUnavailable
from registry import DEFAULT_PREFIX, EtcdConfig

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"

EtcdOpt = Annotated[
    str | None,
    typer.Option(
        "--etcd",
        envvar="RANGESHARD_ETCD",
        help="etcd endpoints, URL[,URL...] (default http://127.0.0.1:2379).",
        show_default=False,
    ),
]
CaCertOpt = Annotated[str | None, typer.Option("--etcd-cacert", help="CA bundle for etcd TLS.")]
CertOpt = Annotated[str | None, typer.Option("--etcd-cert", help="Client certificate for etcd TLS.")]
KeyOpt = Annotated[str | None, typer.Option("--etcd-key", help="Client key for etcd TLS.")]
UserOpt = Annotated[str | None, typer.Option("--etcd-user", envvar="RANGESHARD_ETCD_USER", help="etcd username.")]
PasswordOpt = Annotated[
    str | None,
    typer.Option("--etcd-password", envvar="RANGESHARD_ETCD_PASSWORD", help="etcd password.", show_default=False),
]
PrefixOpt = Annotated[str, typer.Option("--prefix", help="Registry key prefix in etcd.")]


def etcd_config(
    etcd: str | None,
    cacert: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    user: str | None = None,
    password: str | None = None,
) -> EtcdConfig:
    """Build the etcd config from the shared options (raises ConfigError)."""
    return EtcdConfig.from_urls(etcd, ca_cert=cacert, cert_file=cert, key_file=key, username=user, password=password)


DEFAULT_REGISTRY_PREFIX = DEFAULT_PREFIX


def configure_logging(level: str) -> None:
    """Install the one stderr handler (library code only creates loggers)."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        fail(ConfigError(f"--log-level: unknown level {level!r} (use debug, info, warning, error)"))
    logging.basicConfig(level=numeric, format=LOG_FORMAT, stream=sys.stderr, force=True)


def fail(error: RangeshardError) -> NoReturn:
    """Print an expected error and exit: 2 for bad input, 1 for runtime failures."""
    if isinstance(error, ConfigError):
        for problem in error.problems:
            typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)
    if isinstance(error, RegistryUnavailable):
        typer.echo(f"error: {error} (is etcd running? set --etcd or RANGESHARD_ETCD)", err=True)
        raise typer.Exit(1)
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(1)
