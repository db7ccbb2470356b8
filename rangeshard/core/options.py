"""Command-line options the commands share, declared once: etcd TLS/credentials and serving.

Purpose
    Typer ``Annotated`` types for ``--etcd-cacert``, ``--etcd-cert``,
    ``--etcd-key``, ``--etcd-user`` and ``--etcd-password`` (the last two
    also from ``RANGESHARD_ETCD_USER`` / ``RANGESHARD_ETCD_PASSWORD``), used
    by the component commands (local API server, proxy) and the project CLI
    alike, so every command spells them the same way; and
    :func:`config_from_options`, which checks that the given TLS files exist
    and builds the :class:`~rangeshard.core.etcd.EtcdConfig`. The two HTTP
    servers (local API server, proxy) share ``--host``, ``--tls-cert``,
    ``--tls-key``, ``--log-level`` and ``--max-request-body-bytes`` and their
    checks (:func:`check_serving_options`).

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

CaCertOpt = Annotated[str | None, typer.Option("--etcd-cacert", help="CA bundle for etcd TLS.")]
CertOpt = Annotated[str | None, typer.Option("--etcd-cert", help="Client certificate for etcd TLS.")]
KeyOpt = Annotated[str | None, typer.Option("--etcd-key", help="Client key for etcd TLS.")]
UserOpt = Annotated[str | None, typer.Option("--etcd-user", envvar="RANGESHARD_ETCD_USER", help="etcd username.")]
PasswordOpt = Annotated[
    str | None,
    typer.Option("--etcd-password", envvar="RANGESHARD_ETCD_PASSWORD", help="etcd password.", show_default=False),
]

HostOpt = Annotated[str, typer.Option("--host", help="Address to listen on")]
TlsCertOpt = Annotated[str | None, typer.Option("--tls-cert", help="Serve HTTPS with this certificate (PEM)")]
TlsKeyOpt = Annotated[str | None, typer.Option("--tls-key", help="Private key (PEM) of --tls-cert")]
LogLevelOpt = Annotated[str, typer.Option("--log-level", help="debug, info, warning, error")]
MaxBodyOpt = Annotated[int, typer.Option("--max-request-body-bytes", help="Largest accepted request body (413 beyond)")]
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def check_serving_options(tls_cert: str | None, tls_key: str | None, max_request_body_bytes: int) -> None:
    """``ConfigError`` for half a TLS pair, a missing TLS file or a body limit under 1 KiB."""
    if (tls_cert is None) != (tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    for path in (tls_cert, tls_key):
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"TLS file {path} does not exist")
    if max_request_body_bytes < 1024:
        raise ConfigError("--max-request-body-bytes must be at least 1024")


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
