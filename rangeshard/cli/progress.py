"""Each instance's progress as the range filter proxy measures it, for ``status``, ``registry list`` and the dashboard.

Purpose
    The proxy (started with ``--etcd``) publishes on ``/metrics``, per
    controller type and instance, how many main objects wait for their
    controller's answer and since when (``range_filter_proxy.progress``).
    :func:`fetch` reads those families into :class:`Progress` values;
    :func:`describe` says them in a table cell (``ok``, ``STUCK: 13
    unanswered, oldest 84s``, ``not measurable``). The proxy a ``rangeshard
    up`` started is found by :func:`rangeshard.cli.statefile.proxy_from_state`
    (the default of ``registry list --proxy`` and the dashboard's
    ``--proxy``), else by the ``proxyUrl`` the instances publish in their
    records. :class:`ProxyAccess` carries the credentials a secured proxy
    (``--auth-mode delegate`` or ``static``) wants on ``/metrics``: a bearer
    token from ``--token-file`` (re-read on every call: rotated tokens work),
    or the current context's user of ``--kubeconfig`` as kubectl reads it
    (token, token file, exec plugin, client certificate).

Invariants
    * An instance the proxy does not report, or a proxy that does not answer,
      is *unknown* (``None``), never healthy; a controller that never writes
      ``status.observedGeneration`` is *not measurable*, never healthy.

Concurrency model
    Blocking HTTP calls with short timeouts, from any thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

OBJECTS = "rangeshard_unreconciled_objects"
OLDEST = "rangeshard_unreconciled_oldest_seconds"
MEASURABLE = "rangeshard_unreconciled_measurable"
STUCK = "rangeshard_unreconciled_stuck"
STUCK_AFTER = "rangeshard_stuck_after_seconds"


@dataclass(frozen=True)
class Progress:
    """One instance's progress (``unreconciled``/``oldest`` are ``None`` when not measurable)."""

    measurable: bool
    unreconciled: int | None
    oldest_seconds: float | None
    stuck: bool
    stuck_after_seconds: float | None

    def to_json(self) -> dict[str, object]:
        return {
            "measurable": self.measurable,
            "unreconciled": self.unreconciled,
            "oldestSeconds": self.oldest_seconds,
            "stuck": self.stuck,
            "stuckAfterSeconds": self.stuck_after_seconds,
        }


class ProgressUnavailable(Exception):
    """The proxy's metrics could not be read (the message says why)."""


@dataclass(frozen=True)
class ProxyAccess:
    """Where the proxy is and how to authenticate to it (module docstring); ``source`` says where the URL came from."""

    url: str
    token_file: str | None = None
    kubeconfig: str | None = None
    source: str = "--proxy"

    def request_options(self) -> tuple[dict[str, str], Any]:
        """``(headers, cert)`` for one request (:class:`ProgressUnavailable` when the credentials cannot be read)."""
        if self.token_file is not None:
            try:
                with open(self.token_file, encoding="utf-8") as f:
                    token = f.read().strip()
            except (OSError, UnicodeDecodeError) as e:
                raise ProgressUnavailable(f"--token-file {self.token_file}: cannot read: {e}") from e
            if not token:
                raise ProgressUnavailable(f"--token-file {self.token_file}: empty")
            return {"Authorization": f"Bearer {token}"}, None
        if self.kubeconfig is not None:
            return _kubeconfig_credentials(self.kubeconfig)
        return {}, None


def _kubeconfig_credentials(path: str) -> tuple[dict[str, str], Any]:
    """The current context's user of a kubeconfig, as the official client (and kubectl) reads it."""
    from kubernetes import client as k8s  # noqa: PLC0415 (heavy: only with --kubeconfig)
    from kubernetes import config as kube_config  # noqa: PLC0415

    cfg = k8s.Configuration()
    try:
        kube_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, client_configuration=cfg, persist_config=False
        )
    except Exception as e:  # the loader raises ConfigException, OSError, yaml errors, exec plugin failures
        raise ProgressUnavailable(f"--kubeconfig {path}: {e}") from e
    headers: dict[str, str] = {}
    auth = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    if auth:
        headers["Authorization"] = auth if auth.lower().startswith("bearer ") else f"Bearer {auth}"
    cert = (cfg.cert_file, cfg.key_file) if cfg.cert_file and cfg.key_file else None
    return headers, cert


def _number(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def parse(text: str) -> dict[tuple[str, str], Progress]:
    """``(type, instance) -> Progress`` from a proxy's ``/metrics`` text."""
    values: dict[tuple[str, str], dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (OBJECTS, OLDEST, MEASURABLE, STUCK, STUCK_AFTER):
                key = (sample.labels.get("type", ""), sample.labels.get("instance", ""))
                values.setdefault(key, {})[sample.name] = sample.value
    out: dict[tuple[str, str], Progress] = {}
    for key, v in values.items():
        measurable = v.get(MEASURABLE) == 1.0
        count = _number(v.get(OBJECTS))
        out[key] = Progress(
            measurable=measurable,
            unreconciled=int(count) if measurable and count is not None else None,
            oldest_seconds=_number(v.get(OLDEST)) if measurable else None,
            stuck=v.get(STUCK) == 1.0,
            stuck_after_seconds=_number(v.get(STUCK_AFTER)),
        )
    return out


def fetch(proxy: str | ProxyAccess, timeout: float = 3.0, token: str | None = None) -> dict[tuple[str, str], Progress]:
    """Read the progress of every instance from the proxy; :class:`ProgressUnavailable` if not."""
    access = proxy if isinstance(proxy, ProxyAccess) else ProxyAccess(proxy)
    proxy_url = access.url
    headers, cert = access.request_options()
    if token:
        headers = {"Authorization": f"Bearer {token}"}
    try:
        # verify=False: our own proxy, as status probes it; the token goes only where --proxy points.
        with httpx.Client(timeout=timeout, verify=False, cert=cert) as client:  # noqa: S501
            resp = client.get(proxy_url.rstrip("/") + "/metrics", headers=headers)
    except httpx.HTTPError as e:
        raise ProgressUnavailable(f"proxy {proxy_url} does not answer ({type(e).__name__})") from e
    if resp.status_code in (401, 403):
        hint = "" if "Authorization" in headers else ": give --token-file FILE or --kubeconfig FILE"
        raise ProgressUnavailable(f"proxy {proxy_url}/metrics answered {resp.status_code}{hint}")
    if resp.status_code != 200:
        raise ProgressUnavailable(f"proxy {proxy_url}/metrics answered {resp.status_code}")
    try:
        return parse(resp.text)
    except ValueError as e:
        raise ProgressUnavailable(f"proxy {proxy_url}/metrics is not Prometheus text: {e}") from e


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(seconds, 0))
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def describe(progress: Progress | None) -> str:
    """A table cell: ``STUCK: 13 unanswered, oldest 84s (> 5s)``, ``ok`` (nothing unanswered),
    ``waiting: 3 unanswered, oldest 1s`` (below the stuck threshold), ``not measurable`` or ``-`` (unknown)."""
    if progress is None:
        return "-"
    if not progress.measurable:
        return "not measurable"
    n = progress.unreconciled or 0
    if progress.stuck:
        after = f" (> {progress.stuck_after_seconds:g}s)" if progress.stuck_after_seconds is not None else ""
        return f"STUCK: {n} unanswered, oldest {_age(progress.oldest_seconds)}{after}"
    if n == 0:
        return "ok"
    return f"waiting: {n} unanswered, oldest {_age(progress.oldest_seconds)}"


def style(progress: Progress | None) -> str:
    """The rich style of :func:`describe`'s cell."""
    if progress is None or not progress.measurable:
        return "dim"
    if progress.stuck:
        return "bold red"
    return "yellow" if progress.unreconciled else "green"
