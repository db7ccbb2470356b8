"""The ``rangeshard proxy`` command (also ``python -m range_filter_proxy``).

Purpose
    :class:`ProxyFlags` is the command line as a pydantic model (each option
    declared once, as a field; the shared grammars of
    :mod:`rangeshard.core.settings`: ``--port``, ``--upstream``,
    ``--registry-prefix``, ``--etcd``, ``--resources``);
    :func:`proxy_command` (made by
    :func:`rangeshard.core.settings.flag_command`) reads the options into it,
    loads the upstream configuration (URL, kubeconfig or in-cluster), turns
    the rest into the proxy's settings root (:func:`proxy_settings` ->
    :class:`range_filter_proxy.app.ProxySettings`) and serves
    :func:`range_filter_proxy.app.create_app` with uvicorn until
    SIGINT/SIGTERM. The project CLI registers it as ``rangeshard proxy``.

Invariants
    * Exactly one of ``--upstream``, ``--kubeconfig`` or ``--in-cluster``;
      a bad value or combination exits 2 with ``error: --flag: problem``.
    * Library code configures no logging handlers; this entry point calls
      :func:`rangeshard.core.logs.configure_logging`, as every other does.
    * Binds to 127.0.0.1 unless ``--host`` says otherwise; ``--auth-mode``
      defaults to ``none`` (see docs/security.md for why) and a warning is
      logged when the proxy listens beyond loopback without authentication.
    * Tokens (``--token-file``) and upstream credentials are never printed.
    * ``--etcd`` turns on write fencing (:mod:`range_filter_proxy.fencing`)
      against the registry under ``--registry-prefix``; the etcd TLS and
      authentication options are spelled as in the rest of the project, the
      password never printed.

Concurrency model
    uvicorn owns the event loop; the app's lifespan starts and stops every
    background task.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal, Self

import typer
from pydantic import Field, model_validator

from rangeshard.core.errors import ConfigError
from rangeshard.core.settings import (
    ApiUrl,
    EtcdClientFlags,
    EtcdEndpoints,
    ExistingFile,
    KeyPrefix,
    Port,
    ResourceNames,
    ServingFlags,
    field_error,
    flag_command,
)

if TYPE_CHECKING:
    from range_filter_proxy.app import ProxySettings


class ProxyFlags(ServingFlags, EtcdClientFlags):
    """The options of ``rangeshard proxy`` (each field is ``--field-name``)."""

    upstream: ApiUrl | None = Field(None, description="Upstream API server URL (no credentials, query or fragment)")
    kubeconfig: str | None = Field(None, description="Take upstream URL, TLS and credentials from this kubeconfig")
    context: str | None = Field(None, description="kubeconfig context to use")
    in_cluster: bool = Field(False, description="Use the pod's service account config")
    port: Port = Field(8001, description="Port to listen on")
    resources: ResourceNames = Field(
        (), description="Comma-separated resources to cache from start-up, e.g. pods,replicasets.apps"
    )
    bookmark_interval: float = Field(10.0, gt=0, description="Seconds between bookmarks of a quiet watch")
    history_events: int = Field(10_000, ge=1, description="Events kept per resource for resuming watches (at least)")
    history_seconds: float = Field(300.0, ge=0, description="Seconds of events kept per resource (at least)")
    history_max_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1,
        description="Most bytes of events kept per resource (JSON plus 256 per event), whatever --history-events and "
        "--history-seconds ask for (64 MiB: kube's 75 s window up to ~870 KiB/s of changes)",
    )
    consistent_read_timeout: float = Field(
        0.5, ge=0, description="Seconds a consistent read waits for the cache before listing upstream instead"
    )
    upstream_ca: ExistingFile | None = Field(None, description="PEM CA bundle verifying an https:// --upstream")
    auth_mode: Literal["none", "static", "delegate"] = Field(
        "none",
        description="Who may read through the proxy: none (anybody who reaches the port), "
        "static (--token-file), delegate (TokenReview + SubjectAccessReview against the upstream)",
    )
    token_file: ExistingFile | None = Field(
        None, description='Tokens of --auth-mode static: CSV lines token,user,uid[,"group1,group2"]'
    )
    auth_cache_ttl: float = Field(10.0, ge=0, description="Seconds a delegated review answer is cached (0: never)")
    auth_cache_size: int = Field(10_000, ge=1, description="Entries kept in each delegated review cache")
    gc_freeze_interval: float = Field(
        0.25,
        ge=0,
        description="Seconds between collect-and-freeze passes that keep garbage-collector pauses short "
        "with large caches (0: leave the collector alone)",
    )
    gc_full_interval: float = Field(3600.0, description="Seconds between complete collections of the frozen heap")
    etcd: EtcdEndpoints | None = Field(
        None,
        description="Turn on write fencing: etcd endpoints URL[,URL...] of the instance registry. Writes carrying a "
        "controller manager's owner token are forwarded only while it owns the object (else 409)",
    )
    registry_prefix: KeyPrefix = Field("/rangeshard", description="Registry key prefix in etcd (with --etcd)")

    @model_validator(mode="after")
    def _combinations(self) -> Self:
        if sum([self.upstream is not None, self.kubeconfig is not None, self.in_cluster]) != 1:
            raise field_error("upstream", "give exactly one of --upstream URL, --kubeconfig FILE or --in-cluster")
        if self.upstream_ca is not None and not (self.upstream or "").startswith("https://"):
            raise field_error("upstream_ca", "goes with an https:// --upstream URL")
        if (self.token_file is not None) != (self.auth_mode == "static"):
            raise field_error("token_file", "is needed by --auth-mode static and used by it alone")
        if self.gc_freeze_interval > 0 and self.gc_full_interval < self.gc_freeze_interval:
            raise field_error("gc_full_interval", "must be >= --gc-freeze-interval")
        if self.etcd is None and self.etcd_options_given():
            raise field_error("etcd", "--etcd-cacert/--etcd-cert/--etcd-key/--etcd-user/--etcd-password need --etcd")
        return self


def _serve(flags: ProxyFlags) -> None:
    from range_filter_proxy.app import create_app  # noqa: PLC0415
    from range_filter_proxy.upstream import load_upstream_config  # noqa: PLC0415
    from rangeshard.core.logs import configure_logging  # noqa: PLC0415
    from rangeshard.core.serving import serve  # noqa: PLC0415  (keep `rangeshard --help` fast)

    try:
        level = configure_logging(flags.log_level)
        config = load_upstream_config(
            flags.upstream, flags.kubeconfig, flags.context, flags.in_cluster, flags.upstream_ca
        )
        app = create_app(config, proxy_settings(flags))
    except ConfigError as e:
        for problem in e.problems:
            typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2) from e
    if flags.auth_mode == "none" and not flags.loopback:
        logging.getLogger(__name__).warning(
            "listening on %s with --auth-mode none: anybody who reaches the port reads every cached resource "
            "with the proxy's credentials (see docs/security.md)",
            flags.host,
        )
    serve(
        app,
        app.state.proxy.shutdown,
        host=flags.host,
        port=flags.port,
        log_level=flags.log_level,
        access_log=level <= logging.DEBUG,
        timeout_graceful_shutdown=5,
        ssl_certfile=flags.tls_cert,
        ssl_keyfile=flags.tls_key,
    )


proxy_command = flag_command(
    ProxyFlags, _serve, "Serve the range filter proxy: shard-filtered list/watch from one shared watch per resource."
)


def proxy_settings(flags: ProxyFlags) -> ProxySettings:
    """The settings root of the command's options."""
    from range_filter_proxy.app import ProxySettings  # noqa: PLC0415
    from range_filter_proxy.auth import AuthMode, AuthSettings  # noqa: PLC0415
    from range_filter_proxy.cached import CacheSettings  # noqa: PLC0415
    from range_filter_proxy.fencing import FenceSettings  # noqa: PLC0415
    from range_filter_proxy.heap import HeapSettings  # noqa: PLC0415
    from rangeshard.core.kubeapi import load_token_file  # noqa: PLC0415

    return ProxySettings(
        resources=flags.resources,
        settings=CacheSettings(
            bookmark_interval=flags.bookmark_interval,
            history_events=flags.history_events,
            history_seconds=flags.history_seconds,
            history_max_bytes=flags.history_max_bytes,
            history_hard_cap=max(10 * flags.history_events, 100_000),
            consistent_read_timeout=flags.consistent_read_timeout,
        ),
        auth=AuthSettings(
            mode=AuthMode(flags.auth_mode),
            users=load_token_file(flags.token_file) if flags.token_file is not None else {},
            cache_ttl=flags.auth_cache_ttl,
            cache_size=flags.auth_cache_size,
        ),
        max_body_bytes=flags.max_request_body_bytes,
        heap=HeapSettings(flags.gc_freeze_interval, flags.gc_full_interval) if flags.gc_freeze_interval > 0 else None,
        fencing=None if flags.etcd is None else FenceSettings(flags.etcd_config(flags.etcd), flags.registry_prefix),
    )
