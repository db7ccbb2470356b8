"""Command line of the local API server: ``rangeshard local-apiserver`` / ``python -m local_apiserver``.

Purpose
    :class:`LocalApiServerFlags` is the command line as a pydantic model
    (each option declared once, as a field, with the shared grammars of
    :mod:`rangeshard.core.settings`); :func:`local_apiserver_command` (made
    by :func:`rangeshard.core.settings.flag_command`) reads the options into
    it, so the project CLI registers it as a sub-command and ``python -m
    local_apiserver`` runs it standalone. It builds the app with :func:`local_apiserver.app.create_app` and serves it
    with uvicorn (HTTP, or HTTPS with ``--tls-cert``/``--tls-key``). etcd
    TLS and authentication options are spelled as in the rest of the project
    (``--etcd-cacert/--etcd-cert/--etcd-key/--etcd-user/--etcd-password``,
    the password also from ``RANGESHARD_ETCD_PASSWORD``); ``--token-file``
    turns on bearer-token authentication (ServiceAccount tokens too) and the
    built-in authorization policy (docs/security.md), or the one
    ``--authorization-mode`` names (``RBAC``, as kube spells it); ``--audit-log-path``/``--audit-level`` write an
    ``audit.k8s.io/v1`` audit log (:mod:`local_apiserver.audit`).

Invariants
    * Bad options exit with code 2 and ``error: --flag: problem``, never a
      traceback.
    * Binds to 127.0.0.1 unless ``--host`` says otherwise.
    * Secrets (etcd password, tokens) are never printed or logged.

Concurrency model
    Blocks in uvicorn's event loop until SIGINT/SIGTERM.
"""

from __future__ import annotations

import logging
from typing import Any

import typer
from pydantic import Field, field_validator, model_validator

from rangeshard.core.errors import ConfigError, RangeshardError, RegistryUnavailable
from rangeshard.core.etcd import ENV_ENDPOINTS, EtcdClient
from rangeshard.core.settings import (
    EtcdClientFlags,
    EtcdEndpoints,
    ExistingFile,
    KeyPrefix,
    Port,
    ServingFlags,
    flag_command,
)

log = logging.getLogger(__name__)

#: The values of ``--authorization-mode`` this server implements (kube's spelling).
AUTHORIZATION_MODES = ("RBAC", "AlwaysAllow", "AlwaysDeny")


class LocalApiServerFlags(ServingFlags, EtcdClientFlags):
    """The options of ``rangeshard local-apiserver`` (each field is ``--field-name``)."""

    etcd: EtcdEndpoints | None = Field(
        None, description=f"etcd endpoint(s) URL[,URL...] (default ${ENV_ENDPOINTS} or http://127.0.0.1:2379)"
    )
    port: Port = Field(6443, description="TCP port to listen on")
    prefix: KeyPrefix | None = Field(None, description="etcd key prefix for stored objects (default /registry)")
    bookmark_interval: float = Field(60.0, gt=0, description="seconds between watch bookmarks (when allowed)")
    token_file: ExistingFile | None = Field(
        None,
        description='Authenticate every request by bearer token: CSV lines token,user,uid[,"group1,group2"] '
        "(see docs/security.md for the policy).",
    )
    authorization_mode: str | None = Field(
        None,
        description="With --token-file: RBAC (the Roles, ClusterRoles and bindings the server stores, as kube "
        "evaluates them), AlwaysAllow or AlwaysDeny; default: the built-in policy of docs/security.md.",
    )
    simulate_node: str | None = Field(
        None,
        description="Register a simulated node NAME that schedules pods and runs them to Ready "
        "(and stops them gracefully on delete); see docs/local_apiserver.md.",
    )
    audit_log_path: str | None = Field(
        None,
        description="Append one audit.k8s.io/v1 Event per request (JSON line, stage ResponseComplete) to this file.",
    )
    audit_level: str = Field(
        "Metadata", description="Metadata, Request (plus requestObject) or RequestResponse (plus both)."
    )
    service_cluster_ip_range: str = Field(
        "10.96.0.0/12", description="IPv4 CIDR Services' cluster IPs are allocated from."
    )

    @field_validator("authorization_mode")
    @classmethod
    def _authorization_mode(cls, value: str | None) -> str | None:
        if value is None:
            return None
        modes = [m.strip() for m in value.split(",") if m.strip()]
        unknown = [m for m in modes if m not in AUTHORIZATION_MODES]
        if unknown or len(modes) != 1:
            what = f"{unknown[0]!r} is not supported" if unknown else "name exactly one mode"
            raise ValueError(f"{what} (this server implements {', '.join(AUTHORIZATION_MODES)})")
        return modes[0]

    @model_validator(mode="after")
    def _mode_needs_tokens(self) -> LocalApiServerFlags:
        if self.authorization_mode is not None and self.token_file is None:
            raise ValueError(
                f"--authorization-mode {self.authorization_mode} needs --token-file (who may create the first "
                "bindings?): authentication is off without it"
            )
        return self

    @field_validator("simulate_node")
    @classmethod
    def _node_name(cls, value: str | None) -> str | None:
        from local_apiserver.resources import core_spec  # noqa: PLC0415 (keep `--help` fast)
        from local_apiserver.validation import name_problem  # noqa: PLC0415

        problem = name_problem(core_spec("nodes"), value) if value is not None else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("audit_level")
    @classmethod
    def _audit_level(cls, value: str) -> str:
        from local_apiserver.audit import AuditLevel  # noqa: PLC0415

        if value.lower() not in {level.value.lower() for level in AuditLevel}:
            raise ValueError(f"must be Metadata, Request or RequestResponse, got {value!r}")
        return AuditLevel.parse(value).value

    @field_validator("service_cluster_ip_range")
    @classmethod
    def _service_range(cls, value: str) -> str:
        from local_apiserver.services import parse_range  # noqa: PLC0415

        parse_range(value)  # ValueError saying what is wrong
        return value


def _serve(flags: LocalApiServerFlags) -> None:
    from local_apiserver.app import create_app  # noqa: PLC0415
    from rangeshard.core.logs import configure_logging  # noqa: PLC0415
    from rangeshard.core.serving import serve  # noqa: PLC0415 (keep `--help` fast)

    try:
        configure_logging(flags.log_level)
        config = flags.etcd_config(flags.etcd)
        settings = app_settings(flags)
    except ConfigError as e:  # a token file that cannot be read, a bad $RANGESHARD_ETCD
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
    if flags.token_file is None and not flags.loopback:
        log.warning("listening on %s without --token-file: anybody who reaches the port can do anything", flags.host)
    app = create_app(config, max_body_bytes=flags.max_request_body_bytes, **settings)
    serve(
        app,
        app.state.local.shutdown,
        host=flags.host,
        port=flags.port,
        ssl_certfile=flags.tls_cert,
        ssl_keyfile=flags.tls_key,
        log_level=flags.log_level,
        access_log=flags.log_level == "debug",
        timeout_graceful_shutdown=2,
    )


local_apiserver_command = flag_command(
    LocalApiServerFlags, _serve, "Serve a small Kubernetes-compatible API stored in etcd."
)


def app_settings(flags: LocalApiServerFlags) -> dict[str, Any]:
    """The keyword arguments of ``create_app`` from the options."""
    from local_apiserver.audit import AuditLevel, AuditLog  # noqa: PLC0415
    from local_apiserver.services import parse_range  # noqa: PLC0415
    from rangeshard.core.kubeapi import StaticTokens, load_token_file  # noqa: PLC0415

    return {
        "prefix": flags.prefix,
        "bookmark_interval": flags.bookmark_interval,
        "simulate_node": flags.simulate_node,
        "service_range": parse_range(flags.service_cluster_ip_range),
        "authenticator": StaticTokens(load_token_file(flags.token_file)) if flags.token_file is not None else None,
        "audit_log": AuditLog(flags.audit_log_path, AuditLevel(flags.audit_level)) if flags.audit_log_path else None,
        "authorization_mode": flags.authorization_mode or "",
    }


def main() -> None:
    """Entry point of ``python -m local_apiserver``."""
    typer.run(local_apiserver_command)
