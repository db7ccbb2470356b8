"""The manager's side of write fencing: owner token and shard hash on requests, fenced answers as lost ownership.

Purpose
    :class:`FencedApiClient` is the official client's ``ApiClient`` with two
    additions:

    * its User-Agent is the instance's owner token (set by
      :meth:`set_token` whenever the token changes), and while a worker
      reconciles a key, every request of that thread declares the key's
      shard hash in ``X-Rangeshard-Shard-Hash`` (:meth:`reconciling`), and
      every write to a resource the instance shards declares its rule
      (main resource ``uid``, dependents ``owner``; :meth:`set_rules`)
      through the external endpoint's function,
      :func:`rangeshard.core.relay.declare`: the ``X-Rangeshard-Shard-By``
      header, so the proxy judges the write by the rule the informers read
      with, and the ``rangeshard-shard-by/<rule>`` product token after the
      owner token in the User-Agent, so an API server's audit log keys it
      the same way (:mod:`controller_manager.write_audit`);
    * a ``409`` whose Status says the write was fenced
      (:func:`rangeshard.core.ownertoken.fence_reason`; an ordinary
      optimistic-concurrency conflict has no such details) raises
      :class:`WriteFenced`, which no controller catches (it is not an
      ``ApiException``): the reconcile stops at its first fenced write, and
      the runtime drops the key (docs/reliability.md);
    * the resourceVersion of every successful write to a resource the
      instance shards is recorded (:attr:`FencedApiClient.written`): the
      instance publishes the highest per resource, and a taker of its keys
      lists not older than it (:mod:`controller_manager.freshness`).

    :func:`api_client_for` builds one for the proxy (its token file, read by
    :class:`rangeshard.core.tokenfile.BearerTokenFile`, and CA).

Invariants
    * One client per controller instance: the token in the User-Agent is
      that instance's.
    * The shard hash header is per thread (a worker runs one reconcile at a
      time), never shared between workers.

Concurrency model
    Thread-safe: the token is one dict assignment; the shard hash lives in a
    ``threading.local``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller_manager.freshness import WrittenVersions, written_version
from hashing import ShardBy
from rangeshard.core.errors import ControllerError
from rangeshard.core.kubeapi import read_status, status_message
from rangeshard.core.ownertoken import (
    SHARD_BY_HEADER,
    SHARD_HASH_HEADER,
    SHARD_LABEL_HEADER,
    OwnerToken,
    fence_reason,
    format_shard_hash,
    plain_user_agent,
)
from rangeshard.core.relay import declare, write_rule
from rangeshard.core.requestinfo import RequestInfo, classify, is_write
from rangeshard.core.tokenfile import BearerTokenFile


class WriteFenced(ControllerError):
    """The proxy refused a write of ours: the token is no longer the current owner of the key."""

    def __init__(self, token: OwnerToken | None, reason: str, message: str) -> None:
        super().__init__(message)
        self.token = token
        self.reason = reason


class FencedApiClient(k8s.ApiClient):  # type: ignore[misc,unused-ignore]
    """``ApiClient`` carrying an owner token and the current shard hash (see module docstring)."""

    def __init__(self, configuration: Any = None) -> None:
        super().__init__(configuration)
        self.user_agent = plain_user_agent()
        self.token: OwnerToken | None = None
        self._local = threading.local()
        #: The shard rule of each resource this instance shards, by ``resource.group`` label.
        self.rules: dict[str, ShardBy] = {}
        #: The label key of each resource placed ``by: label``.
        self.labels: dict[str, str] = {}
        #: The highest resourceVersion of our successful writes per shard resource (published for the takers).
        self.written = WrittenVersions()

    def set_rules(self, rules: dict[str, ShardBy], labels: Mapping[str, str] | None = None) -> None:
        """Declare ``rules`` (``resource.group`` label -> rule) on every write to those resources.

        ``labels``: the label key of each resource placed ``by: label``, declared with it (in a header, and
        in the User-Agent for the API server's audit log).
        """
        self.rules = dict(rules)
        self.labels = dict(labels or {})

    def set_token(self, token: OwnerToken) -> None:
        self.token = token
        self.user_agent = token.user_agent()

    @contextlib.contextmanager
    def reconciling(self, shard_hash: int) -> Iterator[None]:
        """Declare ``shard_hash`` on every request of this thread inside the block."""
        self._local.shard_hash = format_shard_hash(shard_hash)
        try:
            yield
        finally:
            self._local.shard_hash = None

    def call_api(
        self,
        method: str,
        url: str,
        header_params: dict[str, str] | None = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        token = self.token
        rule: ShardBy | None = None
        info: RequestInfo | None = None
        if is_write(method):
            extra: dict[str, str] = {}
            shard_hash = getattr(self._local, "shard_hash", None)
            if shard_hash is not None:
                extra[SHARD_HASH_HEADER] = shard_hash
            info = classify(method, urlsplit(url).path, {}) if self.rules else None
            rule = write_rule(self.rules, info) if info is not None else None
            label = self.labels.get(info.resource.label) if info is not None and info.resource is not None else None
            header_params = {**(header_params or {}), **extra}
            if rule is not None and token is not None:
                # Declared as the external endpoint declares: the one relay function (token, rule and label in
                # the User-Agent, which an API server's audit log records, and the rule headers for the proxy).
                own = [(k, v) for k, v in header_params.items() if k.lower() != "user-agent"]
                header_params = dict(declare(own, token, rule, label))
            elif rule is not None:
                header_params[SHARD_BY_HEADER] = rule.value
                if rule is ShardBy.LABEL and label is not None:
                    header_params[SHARD_LABEL_HEADER] = label
        try:
            response = super().call_api(method, url, header_params, body, post_params, _request_timeout)
        except ApiException as e:
            if e.status == 409:
                _raise_if_fenced(token, e.body)
            raise
        status = getattr(response, "status", None)
        if status == 409:
            response.read()  # type: ignore[no-untyped-call]
            _raise_if_fenced(token, response.data)
        elif rule is not None and info is not None and info.resource is not None and 200 <= (status or 0) < 300:
            # Read now (the caller reads the same cached bytes): the version our write made is published.
            self.written.record(info.resource.label, written_version(response.read()))  # type: ignore[no-untyped-call]
        return response


def _raise_if_fenced(token: OwnerToken | None, body: Any) -> None:
    status = read_status(body) if isinstance(body, bytes | str) and body else None
    reason = fence_reason(status)
    if status is not None and reason is not None:
        raise WriteFenced(token, reason, status_message(status, "write fenced"))


def api_client_for(url: str, token_file: str | None = None, ca_cert: str | None = None) -> Any:
    """An official-client ApiClient for the proxy (bearer token and CA if configured)."""
    cfg = k8s.Configuration()
    cfg.host = url.rstrip("/")
    cfg.retries = 0
    # Enough connections for the workers plus one list/watch per informer.
    cfg.connection_pool_maxsize = 64
    if ca_cert:
        cfg.ssl_ca_cert = ca_cert
    if token_file:
        source = BearerTokenFile(token_file)

        def refresh(configuration: Any) -> None:  # called by the client before each request
            configuration.api_key = {"BearerToken": source.token}

        cfg.api_key = {"BearerToken": source.token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        cfg.refresh_api_key_hook = refresh  # type: ignore[assignment]  # typed as None upstream
    return FencedApiClient(cfg)
