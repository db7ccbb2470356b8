"""Which reconcile failures are timeouts (one WARNING line, ``reason="timeout"``) and which are errors."""

from __future__ import annotations

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, ProtocolError, ReadTimeoutError

from controller_manager.controller import ReconcileContext, timed_out
from rangeshard.core.errors import ReconcileTimeout


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
