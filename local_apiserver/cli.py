"""Command line of the local API server: ``rangeshard local-apiserver`` / ``python -m local_apiserver``.

Purpose
    :func:`local_apiserver_command` is a plain function whose parameters are
    typer Options, so the project CLI registers it as a sub-command and
    ``python -m local_apiserver`` runs it standalone. It validates the options,
    builds the app with :func:`local_apiserver.app.create_app` and serves it
    with uvicorn (HTTP, or HTTPS with ``--tls-cert``/``--tls-key``). etcd
    TLS and authentication options are spelled as in the rest of the project
    (``--etcd-cacert/--etcd-cert/--etcd-key/--etcd-user/--etcd-password``,
    the password also from ``RANGESHARD_ETCD_PASSWORD``); ``--token-file``
    turns on bearer-token authentication (ServiceAccount tokens too) and the
    built-in authorization policy (docs/security.md), or the one
    ``--authorization-mode`` names (``RBAC``, as kube spells it); ``--audit-log-path``/``--audit-level`` write an
    ``audit.k8s.io/v1`` audit log (:mod:`local_apiserver.audit`).

Invariants
    * Bad options exit with code 2 and a one-line message (``ConfigError``),
      never a traceback.
    * Binds to 127.0.0.1 unless ``--host`` says otherwise.
    * Secrets (etcd password, tokens) are never printed or logged.

Concurrency model
    Blocks in uvicorn's event loop until SIGINT/SIGTERM.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

import typer

from rangeshard.core.errors import ConfigError, RangeshardError, RegistryUnavailable
from rangeshard.core.etcd import ENV_ENDPOINTS, EtcdClient
from rangeshard.core.options import (
    LOOPBACK_HOSTS,
    CaCertOpt,
    CertOpt,
    HostOpt,
    KeyOpt,
    LogLevelOpt,
    MaxBodyOpt,
    PasswordOpt,
    TlsCertOpt,
    TlsKeyOpt,
    UserOpt,
    check_serving_options,
    config_from_options,
)

log = logging.getLogger(__name__)

EtcdOpt = Annotated[
    str | None,
    typer.Option("--etcd", help=f"etcd endpoint(s) URL[,URL...] (default ${ENV_ENDPOINTS} or http://127.0.0.1:2379)"),
]
PortOpt = Annotated[int, typer.Option("--port", help="TCP port to listen on")]
PrefixOpt = Annotated[
    str | None, typer.Option("--prefix", help="etcd key prefix for stored objects (default /registry)")
]
BookmarkOpt = Annotated[
    float, typer.Option("--bookmark-interval", help="seconds between watch bookmarks (when allowed)")
]
TokenFileOpt = Annotated[
    str | None,
    typer.Option(
        "--token-file",
        help='Authenticate every request by bearer token: CSV lines token,user,uid[,"group1,group2"] '
        "(see docs/security.md for the policy).",
    ),
]
AuthorizationModeOpt = Annotated[
    str | None,
    typer.Option(
        "--authorization-mode",
        help="With --token-file: RBAC (the Roles, ClusterRoles and bindings the server stores, as kube "
        "evaluates them), AlwaysAllow or AlwaysDeny; default: the built-in policy of docs/security.md.",
    ),
]
#: The values of ``--authorization-mode`` this server implements (kube's spelling).
AUTHORIZATION_MODES = ("RBAC", "AlwaysAllow", "AlwaysDeny")
SimulateNodeOpt = Annotated[
    str | None,
    typer.Option(
        "--simulate-node",
        help="Register a simulated node NAME that schedules pods and runs them to Ready "
        "(and stops them gracefully on delete); see docs/local_apiserver.md.",
    ),
]
AuditLogPathOpt = Annotated[
    str | None,
    typer.Option(
        "--audit-log-path",
        help="Append one audit.k8s.io/v1 Event per request (JSON line, stage ResponseComplete) to this file.",
    ),
]
AuditLevelOpt = Annotated[
    str, typer.Option("--audit-level", help="Metadata, Request (plus requestObject) or RequestResponse (plus both).")
]
ServiceRangeOpt = Annotated[
    str, typer.Option("--service-cluster-ip-range", help="IPv4 CIDR Services' cluster IPs are allocated from.")
]


def local_apiserver_command(
    etcd: EtcdOpt = None,
    port: PortOpt = 6443,
    host: HostOpt = "127.0.0.1",
    prefix: PrefixOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    bookmark_interval: BookmarkOpt = 60.0,
    log_level: LogLevelOpt = "info",
    etcd_cacert: CaCertOpt = None,
    etcd_cert: CertOpt = None,
    etcd_key: KeyOpt = None,
    etcd_user: UserOpt = None,
    etcd_password: PasswordOpt = None,
    token_file: TokenFileOpt = None,
    authorization_mode: AuthorizationModeOpt = None,
    simulate_node: SimulateNodeOpt = None,
    max_request_body_bytes: MaxBodyOpt = 3 * 1024 * 1024,
    audit_log_path: AuditLogPathOpt = None,
    audit_level: AuditLevelOpt = "Metadata",
    service_cluster_ip_range: ServiceRangeOpt = "10.96.0.0/12",
) -> None:
    """Serve a small Kubernetes-compatible API stored in etcd."""
    from local_apiserver.app import create_app  # noqa: PLC0415
    from rangeshard.core.logs import configure_logging  # noqa: PLC0415
    from rangeshard.core.serving import serve  # noqa: PLC0415 (keep `--help` fast)

    try:
        if not 0 < port < 65536:
            raise ConfigError(f"--port must be in 1..65535, got {port}")
        check_serving_options(tls_cert, tls_key, max_request_body_bytes)
        configure_logging(log_level)
        config = config_from_options(etcd, etcd_cacert, etcd_cert, etcd_key, etcd_user, etcd_password)
        settings = app_settings(
            prefix, bookmark_interval, simulate_node, service_cluster_ip_range, token_file, audit_log_path, audit_level
        )
        settings["authorization_mode"] = parse_authorization_mode(authorization_mode, token_file)
    except ConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    try:
        with EtcdClient(config):  # with a username this authenticates: refuse bad credentials at once
            pass
    except RegistryUnavailable:
        pass  # etcd not up yet: the server starts and answers 503 until it is
    except RangeshardError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    if settings["authenticator"] is None and host not in LOOPBACK_HOSTS:
        log.warning("listening on %s without --token-file: anybody who reaches the port can do anything", host)
    app = create_app(config, max_body_bytes=max_request_body_bytes, **settings)
    serve(
        app,
        app.state.local.shutdown,
        host=host,
        port=port,
        ssl_certfile=tls_cert,
        ssl_keyfile=tls_key,
        log_level=log_level.lower(),
        access_log=log_level.lower() == "debug",
        timeout_graceful_shutdown=2,
    )


def parse_authorization_mode(value: str | None, token_file: str | None) -> str:
    """The ``--authorization-mode`` (kube's comma-separated spelling, one mode here); ``""`` by default."""
    if value is None:
        return ""
    modes = [m.strip() for m in value.split(",") if m.strip()]
    unknown = [m for m in modes if m not in AUTHORIZATION_MODES]
    if unknown or len(modes) != 1:
        what = f"{unknown[0]!r} is not supported" if unknown else "name exactly one mode"
        raise ConfigError(f"--authorization-mode: {what} (this server implements {', '.join(AUTHORIZATION_MODES)})")
    if token_file is None:
        raise ConfigError(
            f"--authorization-mode {modes[0]} needs --token-file (who may create the first bindings?): "
            "authentication is off without it"
        )
    return modes[0]


def app_settings(
    prefix: str | None,
    bookmark_interval: float,
    simulate_node: str | None,
    service_cluster_ip_range: str,
    token_file: str | None,
    audit_log_path: str | None,
    audit_level: str,
) -> dict[str, Any]:
    """The keyword arguments of ``create_app`` from the options (``ConfigError`` naming the flag)."""
    from local_apiserver.audit import AuditLevel, AuditLog  # noqa: PLC0415
    from local_apiserver.resources import core_spec  # noqa: PLC0415
    from local_apiserver.services import parse_range  # noqa: PLC0415
    from local_apiserver.validation import name_problem  # noqa: PLC0415
    from rangeshard.core.kubeapi import StaticTokens, load_token_file  # noqa: PLC0415

    if bookmark_interval <= 0:
        raise ConfigError("--bookmark-interval must be positive")
    if prefix is not None and (not prefix.startswith("/") or prefix.rstrip("/") == ""):
        raise ConfigError("--prefix must be an absolute key prefix such as /registry")
    problem = name_problem(core_spec("nodes"), simulate_node) if simulate_node is not None else None
    if problem:
        raise ConfigError(f"--simulate-node: {problem}")
    try:
        service_range = parse_range(service_cluster_ip_range)
    except ValueError as e:
        raise ConfigError(f"--service-cluster-ip-range: {e}") from None
    level = AuditLevel.parse(audit_level)  # checked with or without --audit-log-path
    return {
        "prefix": prefix,
        "bookmark_interval": bookmark_interval,
        "simulate_node": simulate_node,
        "service_range": service_range,
        "authenticator": StaticTokens(load_token_file(token_file)) if token_file is not None else None,
        "audit_log": AuditLog(audit_log_path, level) if audit_log_path else None,
    }


def main() -> None:
    """Entry point of ``python -m local_apiserver``."""
    typer.run(local_apiserver_command)
