"""Command-line options the commands share, declared once: etcd TLS/credentials and serving.

Purpose
    Typer ``Annotated`` types for ``--etcd-cacert``, ``--etcd-cert``,
    ``--etcd-key``, ``--etcd-user`` and ``--etcd-password`` (the last two
    also from ``RANGESHARD_ETCD_USER`` / ``RANGESHARD_ETCD_PASSWORD``), used
    by the component commands (local API server, proxy) and the project CLI
    alike, so every command spells them the same way; and
    :func:`config_from_options`, which checks that the given TLS files exist
    and builds the :class:`~rangeshard.core.etcd.EtcdConfig`. The component
    commands (proxy, local API server) read the same flags into models
    (:class:`rangeshard.core.settings.EtcdClientFlags`).

Invariants
    The password is never shown (``show_default=False``) and never printed.

Concurrency model
    Declarations and a pure check; no state.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from rangeshard.core.errors import ConfigError
from rangeshard.core.etcd import EtcdConfig
from rangeshard.core.settings import ENV_PASSWORD, ENV_USER

CaCertOpt = Annotated[str | None, typer.Option("--etcd-cacert", help="CA bundle for etcd TLS.")]
CertOpt = Annotated[str | None, typer.Option("--etcd-cert", help="Client certificate for etcd TLS.")]
KeyOpt = Annotated[str | None, typer.Option("--etcd-key", help="Client key for etcd TLS.")]
UserOpt = Annotated[str | None, typer.Option("--etcd-user", envvar=ENV_USER, help="etcd username.")]
PasswordOpt = Annotated[
    str | None,
    typer.Option("--etcd-password", envvar=ENV_PASSWORD, help="etcd password.", show_default=False),
]


def config_from_options(
    etcd: str | None,
    cacert: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    user: str | None = None,
    password: str | None = None,
) -> EtcdConfig:
    """The etcd config of the options; ``ConfigError`` for a missing TLS file or a bad endpoint."""
    for path in (cacert, cert, key):
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"etcd TLS file {path} does not exist")
    return EtcdConfig.from_urls(etcd, ca_cert=cacert, cert_file=cert, key_file=key, username=user, password=password)
