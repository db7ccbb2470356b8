"""Which reconcile failures are timeouts (one WARNING line, ``reason="timeout"``) and which are errors.

The last tests run one reconcile through the worker's step
(``ControllerRuntime._process``) with a controller whose reconcile raises, and
a stand-in for the shard instance (the four members ``_process`` uses:
``try_begin`` accepts, ``end``, ``clock``, ``settings.reconcile_timeout``): what is
logged at which level, and which counter moves (issue 25).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, ProtocolError, ReadTimeoutError

from controller_manager.controller import ControllerRuntime, ReconcileContext, timed_out
from controller_manager.controllers.replicaset import ReplicaSetController
from hashing import hash_key
from rangeshard.core.clock import MONOTONIC
from rangeshard.core.errors import ReconcileTimeout
from rangeshard.core.etcd import EtcdConfig
from tests.helpers import offline_runtime


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


def _pool() -> urllib3.HTTPConnectionPool:
    return urllib3.HTTPConnectionPool("127.0.0.1", 6443)


def test_the_reconcile_deadline_is_a_timeout() -> None:
    clock = _Clock(100.0)
    ctx = ReconcileContext("ns/a", deadline=100.02, clock=clock)  # type: ignore[arg-type]
    with pytest.raises(ReconcileTimeout) as caught:
        ctx.timeout()
    what = timed_out(caught.value)
    assert what is not None and "reconcile deadline" in what and "ns/a" in what


@pytest.mark.parametrize(
    "exc",
    [
        ReadTimeoutError(_pool(), "/api/v1/pods", "Read timed out. (read timeout=0.9)"),
        ConnectTimeoutError(_pool(), "Connection to 127.0.0.1 timed out. (connect timeout=0.9)"),
        MaxRetryError(_pool(), "/api/v1/pods", ReadTimeoutError(_pool(), "/api/v1/pods", "Read timed out.")),
        TimeoutError("timed out"),
        TimeoutError("timed out"),
    ],
    ids=["read", "connect", "max-retry-read", "socket", "builtin"],
)
def test_api_call_timeouts_are_timeouts(exc: BaseException) -> None:
    what = timed_out(exc)
    assert what is not None and what.startswith("an API call (")


def test_a_timeout_raised_inside_another_error_is_found() -> None:
    try:
        try:
            raise ReadTimeoutError(_pool(), "/x", "Read timed out.")
        except ReadTimeoutError as inner:
            raise RuntimeError("wrapped by a user's controller") from inner
    except RuntimeError as e:
        assert timed_out(e) is not None


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("bad spec"),
        KeyError("metadata"),
        ApiException(status=500, reason="Internal Server Error"),
        MaxRetryError(_pool(), "/x", ProtocolError("Connection aborted.")),
    ],
    ids=["value", "key", "api-500", "max-retry-protocol"],
)
def test_other_errors_are_not_timeouts(exc: BaseException) -> None:
    assert timed_out(exc) is None


def test_a_cause_cycle_ends() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert timed_out(a) is None


# -- one failing reconcile through the worker's step ---------------------------------------------------


def _broken(error: BaseException) -> type[ReplicaSetController]:
    """A controller whose reconcile raises ``error``."""

    class Broken(ReplicaSetController):
        def reconcile(self, key: str, ctx: ReconcileContext) -> None:
            raise error

    return Broken


class _Shard:
    """What ``_process`` uses of a ShardInstance: every key accepted, each end recorded."""

    clock = MONOTONIC
    settings = SimpleNamespace(reconcile_timeout=5.0)

    def __init__(self) -> None:
        self.ended: list[str] = []

    def try_begin(self, key: str, key_hash: int) -> float:
        return self.clock.monotonic() + self.settings.reconcile_timeout

    def end(self, key: str) -> None:
        self.ended.append(key)


def _reconcile_once(etcd_config: EtcdConfig, key_prefix: str, error: BaseException) -> tuple[ControllerRuntime, _Shard]:
    rt = offline_runtime(_broken(error), etcd_config, key_prefix)
    shard = _Shard()
    rt.shard = shard  # type: ignore[assignment]
    # A key the runtime can hash: a deleted object's (the informer is not started, its store stays empty).
    rt._on_main("DELETED", {"metadata": {"namespace": "ns", "name": "rs0", "uid": "uid-0", "resourceVersion": "1"}})
    assert rt.key_hash("ns/rs0") == hash_key("uid-0")
    rt._process("ns/rs0")
    return rt, shard


def _errors(rt: ControllerRuntime, reason: str) -> float:
    value = rt.metrics.registry.get_sample_value(
        "rangeshard_reconcile_errors_total", {"controller": "replicaset", "reason": reason}
    )
    return value or 0.0


def _rendered(records: list[logging.LogRecord], level: int) -> str:
    """The log as a handler at ``level`` would write it (tracebacks included)."""
    formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
    return "\n".join(formatter.format(r) for r in records if r.levelno >= level)


def test_a_failing_reconcile_is_one_error_line_with_its_traceback_only_at_debug(
    etcd_config: EtcdConfig, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="controller_manager.controller"):
        rt, shard = _reconcile_once(etcd_config, key_prefix, ValueError("spec.replicas must not be negative"))
    records = caplog.records  # every logger's: the failure must not surface as a traceback anywhere
    errors = [r for r in records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    line = errors[0].getMessage()
    assert "ns/rs0" in line and "ValueError: spec.replicas must not be negative" in line, line
    assert errors[0].exc_info is None, "the ERROR line carries no traceback"
    assert not [r for r in records if r.levelno == logging.WARNING], "a failure is not also a warning"
    info_log = _rendered(records, logging.INFO)
    assert "Traceback" not in info_log, info_log
    debug_log = _rendered(records, logging.DEBUG)
    assert "Traceback (most recent call last)" in debug_log and "raise error" in debug_log, debug_log
    assert _errors(rt, "exception") == 1
    assert _errors(rt, "timeout") == 0 and _errors(rt, "api") == 0
    reconciles = rt.metrics.registry.get_sample_value(
        "rangeshard_reconciles_total", {"controller": "replicaset", "result": "error"}
    )
    assert reconciles == 1
    assert shard.ended == ["ns/rs0"], "the key is released after the failure"


def test_a_timed_out_reconcile_is_one_warning_line_and_no_error(
    etcd_config: EtcdConfig, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    timeout = ReadTimeoutError(urllib3.HTTPConnectionPool("127.0.0.1", 6443), "/x", "Read timed out.")
    with caplog.at_level(logging.DEBUG, logger="controller_manager.controller"):
        rt, _ = _reconcile_once(etcd_config, key_prefix, timeout)
    records = caplog.records
    assert not [r for r in records if r.levelno >= logging.ERROR]
    (warning,) = [r for r in records if r.levelno == logging.WARNING]
    assert "ns/rs0 timed out" in warning.getMessage() and warning.exc_info is None
    assert "Traceback" not in _rendered(records, logging.DEBUG)
    assert _errors(rt, "timeout") == 1 and _errors(rt, "exception") == 0
