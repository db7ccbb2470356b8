"""The ``rangeshard proxy`` command (also ``python -m range_filter_proxy``).

Purpose
    :func:`proxy_command` parses the options (typer; each declared once
    below as an ``Annotated`` type), loads the upstream configuration (URL,
    kubeconfig or in-cluster), turns the rest into the proxy's settings root
    (:func:`proxy_settings` -> :class:`range_filter_proxy.app.ProxySettings`)
    and serves :func:`range_filter_proxy.app.create_app` with uvicorn until
    SIGINT/SIGTERM. The project CLI registers this function as
    ``rangeshard proxy``.

Invariants
    * Exactly one of ``--upstream``, ``--kubeconfig`` or ``--in-cluster``;
      anything else is a :class:`rangeshard.core.errors.ConfigError`, reported with
      exit code 2.
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
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rangeshard.core.errors import ConfigError
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

if TYPE_CHECKING:
    from range_filter_proxy.app import ProxySettings
    from range_filter_proxy.auth import AuthSettings
    from range_filter_proxy.fencing import FenceSettings

UpstreamOpt = Annotated[str | None, typer.Option("--upstream", help="Upstream API server URL (no credentials)")]
KubeconfigOpt = Annotated[
    str | None, typer.Option("--kubeconfig", help="Take upstream URL, TLS and credentials from this kubeconfig")
]
ContextOpt = Annotated[str | None, typer.Option("--context", help="kubeconfig context to use")]
InClusterOpt = Annotated[bool, typer.Option("--in-cluster", help="Use the pod's service account config")]
PortOpt = Annotated[int, typer.Option("--port", help="Port to listen on")]
ResourcesOpt = Annotated[
    str,
    typer.Option("--resources", help="Comma-separated resources to cache from start-up, e.g. pods,replicasets.apps"),
]
BookmarkIntervalOpt = Annotated[
    float, typer.Option("--bookmark-interval", help="Seconds between bookmarks of a quiet watch")
]
HistoryEventsOpt = Annotated[
    int, typer.Option("--history-events", help="Events kept per resource for resuming watches (at least)")
]
HistorySecondsOpt = Annotated[
    float, typer.Option("--history-seconds", help="Seconds of events kept per resource (at least)")
]
HistoryMaxBytesOpt = Annotated[
    int,
    typer.Option(
        "--history-max-bytes",
        help="Most bytes of events kept per resource (JSON plus 256 per event), whatever --history-events and "
        "--history-seconds ask for (64 MiB: kube's 75 s window up to ~870 KiB/s of changes)",
    ),
]
ConsistentReadTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--consistent-read-timeout",
        help="Seconds a consistent read waits for the cache before listing upstream instead",
    ),
]
UpstreamCaOpt = Annotated[
    str | None, typer.Option("--upstream-ca", help="PEM CA bundle verifying an https:// --upstream")
]
AuthModeOpt = Annotated[
    str,
    typer.Option(
        "--auth-mode",
        help="Who may read through the proxy: none (anybody who reaches the port), "
        "static (--token-file), delegate (TokenReview + SubjectAccessReview against the upstream)",
    ),
]
TokenFileOpt = Annotated[
    str | None,
    typer.Option("--token-file", help='Tokens of --auth-mode static: CSV lines token,user,uid[,"group1,group2"]'),
]
AuthCacheTtlOpt = Annotated[
    float, typer.Option("--auth-cache-ttl", help="Seconds a delegated review answer is cached (0: never)")
]
AuthCacheSizeOpt = Annotated[int, typer.Option("--auth-cache-size", help="Entries kept in each delegated review cache")]
GcFreezeOpt = Annotated[
    float,
    typer.Option(
        "--gc-freeze-interval",
        help="Seconds between collect-and-freeze passes that keep garbage-collector pauses short "
        "with large caches (0: leave the collector alone)",
    ),
]
GcFullOpt = Annotated[
    float, typer.Option("--gc-full-interval", help="Seconds between complete collections of the frozen heap")
]
EtcdOpt = Annotated[
    str | None,
    typer.Option(
        "--etcd",
        help="Turn on write fencing: etcd endpoints URL[,URL...] of the instance registry. Writes carrying a "
        "controller manager's owner token are forwarded only while it owns the object (else 409)",
        show_default=False,
    ),
]
RegistryPrefixOpt = Annotated[str, typer.Option("--registry-prefix", help="Registry key prefix in etcd (with --etcd)")]


def proxy_command(
    upstream: UpstreamOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    in_cluster: InClusterOpt = False,
    port: PortOpt = 8001,
    host: HostOpt = "127.0.0.1",
    resources: ResourcesOpt = "",
    bookmark_interval: BookmarkIntervalOpt = 10.0,
    history_events: HistoryEventsOpt = 10_000,
    history_seconds: HistorySecondsOpt = 300.0,
    history_max_bytes: HistoryMaxBytesOpt = 64 * 1024 * 1024,
    consistent_read_timeout: ConsistentReadTimeoutOpt = 0.5,
    log_level: LogLevelOpt = "info",
    upstream_ca: UpstreamCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    auth_mode: AuthModeOpt = "none",
    token_file: TokenFileOpt = None,
    auth_cache_ttl: AuthCacheTtlOpt = 10.0,
    auth_cache_size: AuthCacheSizeOpt = 10_000,
    max_request_body_bytes: MaxBodyOpt = 3 * 1024 * 1024,
    gc_freeze_interval: GcFreezeOpt = 0.25,
    gc_full_interval: GcFullOpt = 3600.0,
    etcd: EtcdOpt = None,
    registry_prefix: RegistryPrefixOpt = "/rangeshard",
    etcd_cacert: CaCertOpt = None,
    etcd_cert: CertOpt = None,
    etcd_key: KeyOpt = None,
    etcd_user: UserOpt = None,
    etcd_password: PasswordOpt = None,
) -> None:
    """Serve the range filter proxy: shard-filtered list/watch from one shared watch per resource."""
    options = dict(locals())  # every option by name, for proxy_settings
    from range_filter_proxy.app import create_app  # noqa: PLC0415
    from range_filter_proxy.upstream import load_upstream_config  # noqa: PLC0415
    from rangeshard.core.logs import configure_logging  # noqa: PLC0415
    from rangeshard.core.serving import serve  # noqa: PLC0415  (keep `rangeshard --help` fast)

    try:
        level = configure_logging(log_level)
        config = load_upstream_config(upstream, kubeconfig, context, in_cluster, upstream_ca)
        app = create_app(config, proxy_settings(**options))
    except ConfigError as e:
        for problem in e.problems:
            typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2) from e
    if auth_mode == "none" and host not in LOOPBACK_HOSTS:
        logging.getLogger(__name__).warning(
            "listening on %s with --auth-mode none: anybody who reaches the port reads every cached resource "
            "with the proxy's credentials (see docs/security.md)",
            host,
        )
    serve(
        app,
        app.state.proxy.shutdown,
        host=host,
        port=port,
        log_level=log_level.lower(),
        access_log=level <= logging.DEBUG,
        timeout_graceful_shutdown=5,
        ssl_certfile=tls_cert,
        ssl_keyfile=tls_key,
    )


def proxy_settings(
    *,
    resources: str,
    bookmark_interval: float,
    history_events: int,
    history_seconds: float,
    consistent_read_timeout: float,
    tls_cert: str | None,
    tls_key: str | None,
    auth_mode: str,
    token_file: str | None,
    auth_cache_ttl: float,
    auth_cache_size: int,
    max_request_body_bytes: int,
    gc_freeze_interval: float,
    gc_full_interval: float,
    etcd: str | None,
    registry_prefix: str,
    etcd_cacert: str | None,
    etcd_cert: str | None,
    etcd_key: str | None,
    etcd_user: str | None,
    etcd_password: str | None,
    history_max_bytes: int = 64 * 1024 * 1024,
    **_other: Any,
) -> ProxySettings:
    """The settings root of the command's options (``ConfigError`` naming the flag for a bad value)."""
    from range_filter_proxy.app import ProxySettings  # noqa: PLC0415
    from range_filter_proxy.cached import CacheSettings  # noqa: PLC0415
    from range_filter_proxy.heap import HeapSettings  # noqa: PLC0415

    auth = _auth_settings(auth_mode, token_file, auth_cache_ttl, auth_cache_size)
    check_serving_options(tls_cert, tls_key, max_request_body_bytes)
    if bookmark_interval <= 0 or history_events < 1 or history_seconds < 0 or consistent_read_timeout < 0:
        raise ConfigError(
            "--bookmark-interval must be > 0, --history-events >= 1, "
            "--history-seconds and --consistent-read-timeout >= 0"
        )
    if history_max_bytes < 1:
        raise ConfigError(f"--history-max-bytes must be > 0, got {history_max_bytes}")
    if gc_freeze_interval < 0 or (gc_freeze_interval > 0 and gc_full_interval < gc_freeze_interval):
        raise ConfigError("--gc-freeze-interval must be >= 0 and --gc-full-interval >= --gc-freeze-interval")
    return ProxySettings(
        resources=tuple(r for r in resources.split(",") if r.strip()),
        settings=CacheSettings(
            bookmark_interval=bookmark_interval,
            history_events=history_events,
            history_seconds=history_seconds,
            history_hard_cap=max(10 * history_events, 100_000),
            history_max_bytes=history_max_bytes,
            consistent_read_timeout=consistent_read_timeout,
        ),
        auth=auth,
        max_body_bytes=max_request_body_bytes,
        heap=HeapSettings(gc_freeze_interval, gc_full_interval) if gc_freeze_interval > 0 else None,
        fencing=_fence_settings(etcd, registry_prefix, (etcd_cacert, etcd_cert, etcd_key, etcd_user, etcd_password)),
    )


def _auth_settings(auth_mode: str, token_file: str | None, cache_ttl: float, cache_size: int) -> AuthSettings:
    from range_filter_proxy.auth import AuthMode, AuthSettings  # noqa: PLC0415
    from rangeshard.core.kubeapi import load_token_file  # noqa: PLC0415

    try:
        mode = AuthMode(auth_mode)
    except ValueError as e:
        raise ConfigError(f"--auth-mode must be none, static or delegate, got {auth_mode!r}") from e
    if token_file is not None and mode is not AuthMode.STATIC:
        raise ConfigError("--token-file is only used with --auth-mode static")
    if mode is AuthMode.STATIC and token_file is None:
        raise ConfigError("--auth-mode static needs --token-file")
    return AuthSettings(
        mode=mode,
        users=load_token_file(token_file) if token_file is not None else {},
        cache_ttl=cache_ttl,
        cache_size=cache_size,
    )


def _fence_settings(
    etcd: str | None, registry_prefix: str, tls_and_auth: tuple[str | None, ...]
) -> FenceSettings | None:
    """``tls_and_auth``: ``--etcd-cacert``, ``--etcd-cert``, ``--etcd-key``, ``--etcd-user``, ``--etcd-password``."""
    from range_filter_proxy.fencing import FenceSettings  # noqa: PLC0415

    if etcd is None and any(v is not None for v in tls_and_auth):
        raise ConfigError("--etcd-cacert/--etcd-cert/--etcd-key/--etcd-user/--etcd-password need --etcd")
    if etcd is None:
        return None
    if not registry_prefix.startswith("/") or registry_prefix.rstrip("/") == "":
        raise ConfigError("--registry-prefix must be an absolute key prefix such as /rangeshard")
    return FenceSettings(config_from_options(etcd, *tls_and_auth), registry_prefix.rstrip("/"))
